"""The search for the fewest leading float layers that meet an agreement target."""

from __future__ import annotations

import pytest

from cuvil.compiler.quantize_search import FloatSearch, SearchStep, fewest_float


def _curve(values: dict[int, float]):
    asked = []

    def agreement(k: int) -> float:
        asked.append(k)
        return values[k]
    return agreement, asked


def test_met_with_every_layer_int8_asks_once():
    agreement, asked = _curve({0: 0.995})
    assert fewest_float(10, agreement, 0.99) == (0, (SearchStep(0, 0.995),))
    assert asked == [0]


@pytest.mark.parametrize("needed", [1, 2, 3, 5, 6, 7, 9, 10])
def test_finds_the_smallest_k_of_a_monotone_curve_in_few_steps(needed):
    agreement, asked = _curve({k: 0.99 if k >= needed else 0.98 + k / 1000 for k in range(11)})
    chosen, steps = fewest_float(10, agreement, 0.99)
    assert chosen == needed
    assert [s.float_count for s in steps] == asked and len(set(asked)) == len(asked)
    assert len(asked) <= 2 + 2 * needed.bit_length()


def test_the_limit_is_tried_and_none_when_it_misses():
    agreement, asked = _curve({k: 0.9 for k in range(7)})
    chosen, steps = fewest_float(6, agreement, 0.99)
    assert chosen is None and asked == [0, 1, 2, 4, 6] and max(s.agreement for s in steps) == 0.9
    agreement, asked = _curve({0: 0.5})
    assert fewest_float(0, agreement, 0.99)[0] is None and asked == [0]


def test_a_bump_in_the_curve_still_returns_a_k_that_meets_the_target():
    values = {0: 0.98, 1: 0.992, 2: 0.985, 3: 0.986, 4: 0.991}
    agreement, _ = _curve(values)
    chosen, _ = fewest_float(4, agreement, 0.99)
    assert values[chosen] >= 0.99


def test_the_report_line_lists_each_step():
    search = FloatSearch(0.99, 500, (SearchStep(0, 0.98), SearchStep(1, 0.994)), 1)
    line = search.format()
    assert "99.0% on 500 check inputs" in line and "the first 1 layers in float" in line
    assert "0: 98.0%, 1: 99.4%" in line
