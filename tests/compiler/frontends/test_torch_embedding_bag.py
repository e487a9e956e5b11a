"""EmbeddingBag through the torch frontend (aten._embedding_bag): each mode, 2-D and offset inputs,
empty bags, padding_idx, per_sample_weights, against the module's own eager output, through the
reference interpreter and the native compile; and the forms it refuses, by name and reason."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from cuvil.compiler import run_reference  # noqa: E402
from cuvil.compiler.errors import UnsupportedModelError  # noqa: E402
from cuvil.compiler.frontends.torch import import_torch  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph  # noqa: E402

from .test_torch_frontend import Fn, r  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")

TABLE = r(10, 4)
BAGS_2D = torch.tensor([[1, 2, 3], [2, 2, 9], [0, 7, 7]])  # index 2 is the padding_idx of the padded cases
FLAT = torch.tensor([1, 2, 3, 4, 2, 2, 7])
OFFSETS = torch.tensor([0, 2, 2, 5])  # bags [1 2], [], [3 4 2], [2 7]
LAST_OFFSETS = torch.tensor([0, 2, 2, 5, 7])  # the same bags, with include_last_offset
ALL_PADDING = torch.tensor([0, 2, 4, 6])  # bags [1 2], [3 4], [2 2] (only padding), [7]
WEIGHTS = r(7, seed=1)


def _bag(mode, offsets=None, **kw):
    return lambda m, x: F.embedding_bag(x, m.table, offsets, mode=mode, **kw)


# name -> (forward, inputs)
CASES = {}
for _mode in ("sum", "mean", "max"):
    CASES |= {
        f"{_mode}_2d": (_bag(_mode), (BAGS_2D,)),
        f"{_mode}_2d_padding_idx": (_bag(_mode, padding_idx=2), (BAGS_2D,)),
        f"{_mode}_offsets_empty_bag": (lambda m, x, _m=_mode: F.embedding_bag(x, m.table, m.offsets, mode=_m), (FLAT,)),
        f"{_mode}_include_last_offset": (lambda m, x, _m=_mode: F.embedding_bag(
            x, m.table, m.last, mode=_m, include_last_offset=True), (FLAT,)),
        f"{_mode}_offsets_padding_idx": (lambda m, x, _m=_mode: F.embedding_bag(
            x, m.table, m.offsets, mode=_m, padding_idx=2), (FLAT,)),
        f"{_mode}_bag_of_padding_only": (lambda m, x, _m=_mode: F.embedding_bag(
            x, m.table, m.padded, mode=_m, padding_idx=2), (FLAT,)),
        f"{_mode}_module_negative_padding_idx": (lambda m, x: m.bag(x, m.offsets), (FLAT,)),
    }
CASES |= {
    "sum_per_sample_weights": (lambda m, x, w: F.embedding_bag(x, m.table, m.offsets, mode="sum",
                                                               per_sample_weights=w, padding_idx=2), (FLAT, WEIGHTS)),
    "sum_2d_per_sample_weights": (lambda m, x, w: m.sum_bag(x, per_sample_weights=w), (BAGS_2D, r(3, 3, seed=2))),
    "int32_indices": (lambda m, x: F.embedding_bag(x, m.table, m.offsets.int(), mode="mean"), (FLAT.int(),)),
    "all_bags_empty": (lambda m, x: F.embedding_bag(x, m.table, torch.zeros(3, dtype=torch.long)), (FLAT[:0],)),
}


def _module(name: str) -> nn.Module:
    mode = name.split("_")[0] if name.split("_")[0] in ("sum", "mean", "max") else "sum"
    bag = nn.EmbeddingBag.from_pretrained(TABLE, mode=mode, padding_idx=-8)  # torch makes it 2
    sum_bag = nn.EmbeddingBag.from_pretrained(TABLE, mode="sum")
    return Fn(CASES[name][0], table=TABLE, offsets=OFFSETS, last=LAST_OFFSETS, padded=ALL_PADDING,
              bag=bag, sum_bag=sum_bag).eval()


@pytest.mark.parametrize("name", sorted(CASES))
def test_embedding_bag_matches_torch(name):
    module, inputs = _module(name), CASES[name][1]
    graph = import_torch(module, inputs)
    with torch.no_grad():
        want = module(*inputs).numpy()
    feeds = {n: x.numpy() for n, x in zip(graph.inputs, inputs)}
    for got in (run_reference(graph, feeds), compile_graph(graph).run(feeds)):
        assert got[graph.outputs[0]].shape == want.shape
        np.testing.assert_allclose(got[graph.outputs[0]], want, rtol=1e-5, atol=1e-6)


def test_cases_cover_empty_bags_and_padding():
    """Guards the cases above: they would pass vacuously if no bag were empty or padded."""
    with torch.no_grad():
        sums = F.embedding_bag(FLAT, TABLE, ALL_PADDING, mode="sum", padding_idx=2)
        assert not sums[2].any() and sums[0].any()
        assert not F.embedding_bag(FLAT, TABLE, OFFSETS, mode="max")[1].any()


def _refused(forward, *inputs, **params) -> str:
    with pytest.raises(UnsupportedModelError) as info:
        import_torch(Fn(forward, table=TABLE, **params), inputs)
    (op,) = info.value.unsupported  # the op and its reason; _embedding_bag_forward_only for a buffer table
    assert op.startswith("aten._embedding_bag"), str(info.value)
    return str(info.value)


def test_run_time_offsets_are_refused():
    message = _refused(lambda m, x, o: F.embedding_bag(x, m.table, o), FLAT, OFFSETS)
    assert "offsets known only at run time" in message


def test_trailing_indices_with_include_last_offset_are_refused():
    """torch's own kernels disagree here: sum with padding_idx reads them into the last bag, max does not."""
    message = _refused(lambda m, x: F.embedding_bag(x, m.table, m.offsets, include_last_offset=True), FLAT,
                       offsets=OFFSETS)
    assert "include_last_offset" in message


def test_decreasing_offsets_are_refused():
    message = _refused(lambda m, x: F.embedding_bag(x, m.table, m.offsets), FLAT, offsets=torch.tensor([0, 4, 2]))
    assert "non-decreasing" in message


def test_max_norm_is_refused():
    bag = nn.EmbeddingBag.from_pretrained(TABLE.clone(), max_norm=1.0)
    with pytest.raises(UnsupportedModelError) as info:
        import_torch(Fn(lambda m, x: m.bag(x), bag=bag), (BAGS_2D,))
    (op,) = info.value.unsupported  # the op and its reason
    assert op.startswith("aten.embedding_renorm.default") and "max_norm" in op, str(info.value)
