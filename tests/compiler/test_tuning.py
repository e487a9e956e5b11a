"""Tuning: one frozen record on the Target, filled from a profile's caches and [tuning] table, read by
code generation, and part of the compile-cache key."""

from __future__ import annotations

import tomllib
from dataclasses import replace

import pytest
from cuvil.compiler.codegen.cpu.conv.plan import conv_plan
from cuvil.compiler.codegen.cpu.tiles import choose_tile
from cuvil.compiler.target import Target
from cuvil.compiler.tuning import Tuning, default_tuning, parse_override, parse_overrides
from cuvil.devices.profile import PROFILE_DIR, ProfileError, load_profile, parse_profile
from cuvil.edge_runtime.cache import cache_key

RESNET_3X3 = (1, 64, 56, 56, 64, 3, 3, (1, 1), (1, 1, 1, 1))  # a 3x3 stride-1 layer Winograd takes on AVX2


def _profile(**tuning):
    data = tomllib.loads((PROFILE_DIR / "x86-avx2.toml").read_text())
    if tuning:
        data["tuning"] = tuning
    return parse_profile(data, "x86-avx2.toml")


def test_profile_caches_and_isa_facts_fill_the_tuning():
    t = load_profile("x86-avx2").target().tuning
    assert (t.l1d_bytes, t.l2_bytes, t.l3_bytes) == (32 * 1024, 256 * 1024, 8192 * 1024)
    assert (t.vector_registers, t.reserved_registers, t.masked_stores) == (16, 1, True)
    assert load_profile("x86-avx512").target().tuning.vector_registers == 32
    assert load_profile("rpi5").target().tuning.masked_stores is False  # NEON has no masked store
    assert default_tuning("x86_64-unknown-linux-gnu", "znver3", 256).masked_stores is False  # microcoded on AMD


def test_a_tuning_table_overrides_fields():
    t = _profile(winograd_widths=[256, 512], rows_max_pixels=16, masked_stores=False).target().tuning
    assert (t.winograd_widths, t.rows_max_pixels, t.masked_stores) == ((256, 512), 16, False)
    assert t.l2_bytes == 256 * 1024  # the caches still come from the profile


@pytest.mark.parametrize("table, message", [
    ({"no_such_knob": 1}, "unknown tuning field 'no_such_knob'"),
    ({"vector_registers": 4}, "from 8 to 64"),
    ({"winograd_f4": 3}, "one of 2, 4"),
    ({"masked_stores": 1}, "true or false"),
    ({"l2_budget_bytes": -1}, "from 0 to"),
    ({"winograd_widths": [256, "512"]}, "list of up to 16"),
    ({"rows_widths": list(range(1, 40))}, "list of up to 16"),
])
def test_bad_tuning_tables_are_rejected(table, message):
    with pytest.raises(ProfileError, match=message):
        _profile(**table)


def test_code_generation_reads_the_tuning():
    avx2 = load_profile("x86-avx2").target()
    assert conv_plan(avx2, *RESNET_3X3).method == "winograd"
    off = replace(avx2, tuning=avx2.tuning.replace(winograd_widths=()))
    assert conv_plan(off, *RESNET_3X3).method != "winograd"
    wide = replace(avx2, tuning=avx2.tuning.replace(vector_registers=32))
    assert choose_tile(avx2, 64, 24) != choose_tile(wide, 64, 24)  # more registers: a larger tile


def test_the_cache_key_covers_the_tuning():
    avx2 = load_profile("x86-avx2").target()
    tuned = replace(avx2, tuning=avx2.tuning.replace(winograd_block_bytes=2 << 20))
    assert cache_key("graph", avx2, 1) != cache_key("graph", tuned, 1)
    assert cache_key("graph", avx2, 1) == cache_key("graph", load_profile("x86-avx2").target(), 1)


def test_a_target_built_by_hand_gets_its_isa_defaults():
    t = Target("t", "aarch64-unknown-linux-gnu", "cortex-a76", ("+neon",), 128)
    shipped = default_tuning(t.triple, t.cpu, 128)
    assert t.tuning == shipped.replace(autotune=False)  # tests/conftest.py turns autotuning off suite-wide
    assert shipped.autotune and t.tuning.vector_registers == 32
    assert isinstance(hash(t), int) and Tuning().replace(rows_kernels=(3, 5)).rows_kernels == (3, 5)


def test_a_command_line_override_is_parsed_and_checked():
    assert parse_override("int8_direct_min_width=0") == {"int8_direct_min_width": 0}
    assert parse_override("winograd_widths=[256]") == {"winograd_widths": (256,)}
    for bad in ("int8_direct_min_width", "int8_direct_min_width=-1", "no_such_field=1", "autotune=maybe"):
        with pytest.raises(ValueError):
            parse_override(bad)
    assert parse_overrides(["int8_direct_min_width=0", "winograd_widths=[256]", "int8_direct_min_width=2"]) == \
        {"int8_direct_min_width": 2, "winograd_widths": (256,)}
    with pytest.raises(ValueError):
        parse_overrides(["int8_direct_min_width=0", "no_such_field=1"])
