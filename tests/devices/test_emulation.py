"""Emulated ARM64 devices: the zoo cross-compiled, linked into the harness and run under qemu-user.

SVE2 (vector-length agnostic) builds run at 128, 256, 512 and 2048 bits from one binary; NEON
builds run on NEON-only CPU models (where SVE code would die with SIGILL, which is tested too).
Every output is compared with the reference interpreter. Each model is compiled once per target
and its vector lengths run concurrently (one qemu process each, every example in one process).
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from cuvil.compiler import run_reference
from cuvil.devices.emulation import EmulationError, harness_source, qemu_cpu
from cuvil.devices.isa_report import from_object
from cuvil.devices import resolve_target
from cuvil.edge_runtime.emulated import EmulatedModel, emulate

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from tests.zoo import ZOO  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")),
                       reason="needs qemu-user, gcc-aarch64-linux-gnu, libc6-dev-arm64-cross"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
]
RTOL, ATOL = 1e-4, 1e-5
SVE_BITS = (128, 256, 512, 2048)
NEON_PROFILES = ("rpi5", "jetson-orin", "jetson-xavier")
SLOW = {"resnet18", "mobilenet_v2"}
MODELS = [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in ZOO]


def _import(module: nn.Module, example: tuple):
    from cuvil.compiler.frontends.torch import import_torch

    return import_torch(module, example)


class Case:
    """A graph, a few seeded examples (one for the big models) and their reference outputs."""

    def __init__(self, graph, shapes, count: int, seed: int = 7):
        rng = np.random.default_rng(seed)
        self.graph = graph
        self.examples = [{n: rng.standard_normal(s).astype(np.float32) for n, s in zip(graph.inputs, shapes)}
                         for _ in range(count)]
        self.expected = [run_reference(graph, ex) for ex in self.examples]

    def check(self, outputs, what: str) -> None:
        assert len(outputs) <= len(self.expected)
        for got, want in zip(outputs, self.expected):
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=f"{what}: {name}")


_CASES: dict[str, Case] = {}


def zoo_case(name: str) -> Case:
    if name not in _CASES:
        _CASES.clear()  # one model's weights alive at a time
        model, example = ZOO[name]()
        _CASES[name] = Case(_import(model, example), [tuple(x.shape) for x in example], 1 if name in SLOW else 2)
    return _CASES[name]


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("emulated")


def run_lengths(em: EmulatedModel, case: Case, lengths) -> None:
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda bits: em.run(case.examples, bits), lengths))
    for bits, outs in zip(lengths, results):
        case.check(outs, f"{em.target.name} at {bits} bits")


# --- the zoo ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_zoo_sve2_at_every_vector_length(name, cache_dir):
    case = zoo_case(name)
    em = EmulatedModel(case.graph, "arm64-sve2", cache_dir=cache_dir)
    report = from_object(em.object_code, em.target.triple)
    assert report["SVE"] > 0, report.summary()
    run_lengths(em, case, SVE_BITS)


@pytest.mark.parametrize("name", MODELS)
def test_zoo_neon_on_a_neon_only_core(name, cache_dir):
    """Raspberry Pi 5 and both Jetson CPUs: NEON code only, run on qemu cores without SVE."""
    case = zoo_case(name)
    for profile in NEON_PROFILES:
        em = EmulatedModel(case.graph, profile, cache_dir=cache_dir)
        report = from_object(em.object_code, em.target.triple)
        assert report["SVE"] == 0 and report["NEON"] > 0, f"{profile}: {report.summary()}"
        case.check(em.run(case.examples), f"{profile} on {qemu_cpu(em.target)}")


@pytest.mark.parametrize("profile", ["graviton4", "jetson-thor", "graviton3"])
def test_other_sve_profiles(profile, cache_dir):
    case = zoo_case("tiny_transformer")
    em = EmulatedModel(case.graph, profile, cache_dir=cache_dir)
    assert from_object(em.object_code, em.target.triple)["SVE"] > 0
    run_lengths(em, case, (128, 512))


# --- models beyond the zoo ------------------------------------------------------------------------
class Mixed(nn.Module):
    """Ops the zoo lacks: grouped + dilated conv, avg pool, hardswish, leaky relu, concat, layer norm,
    softmax, sigmoid gating, transpose and slicing, with odd sizes so every vector loop has a tail."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(6, 12, 3, padding=2, dilation=2, groups=3)
        self.dw = nn.Conv2d(12, 12, 3, stride=2, padding=1, groups=12)
        self.pool = nn.AvgPool2d(2, ceil_mode=False)
        self.norm = nn.LayerNorm(12)
        self.fc = nn.Linear(12, 7)

    def forward(self, x):
        y = nn.functional.hardswish(self.conv(x))
        y = nn.functional.leaky_relu(self.dw(y), 0.1)
        y = torch.cat([self.pool(y), self.pool(-y)], dim=2)  # [1, 12, 2*h, w]
        t = self.norm(y.flatten(2).transpose(1, 2))  # [1, L, 12]
        t = t * torch.sigmoid(t[:, :, :1])
        return torch.softmax(self.fc(t), dim=-1)[:, 1:, :]


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(13, 29), nn.Linear(29, 3)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)) * torch.exp(-x.abs().mean(dim=1, keepdim=True)))


@pytest.fixture(scope="module")
def mixed() -> Case:
    torch.manual_seed(3)
    x = torch.randn(1, 6, 11, 13)
    return Case(_import(Mixed().eval(), (x,)), [tuple(x.shape)], 3)


@pytest.mark.parametrize("profile,bits", [("arm64-sve2", SVE_BITS), ("graviton4", (128, 1024)),
                                          ("rpi5", (None,)), ("jetson-orin", (None,))])
def test_other_models(mixed, profile, bits, cache_dir):
    em = EmulatedModel(mixed.graph, profile, cache_dir=cache_dir)
    run_lengths(em, mixed, bits)


def test_many_examples_in_one_process(cache_dir):
    """The federated layer evaluates a device's whole dataset (hundreds of examples) in one run."""
    torch.manual_seed(5)
    case = Case(_import(Tiny().eval(), (torch.randn(1, 13),)), [(1, 13)], 200, seed=11)
    outs = emulate(case.graph, "arm64-sve2", case.examples, sve_vector_bits=512, cache_dir=cache_dir)
    case.check(outs, "200 examples")
    again = EmulatedModel(case.graph, "arm64-sve2", cache_dir=cache_dir)
    assert again.cache_hit  # linked once, on disk, keyed like the compile cache
    case.check(again.run(case.examples[:5], 128), "cached")


# --- negative and error paths ---------------------------------------------------------------------
def test_sve_code_dies_on_a_neon_core(cache_dir):
    """A real negative test: SVE code on a NEON-only CPU model is SIGILL, reported as such."""
    case = zoo_case("tiny_transformer")
    em = EmulatedModel(case.graph, "arm64-sve2", cache_dir=cache_dir)
    from cuvil.devices.emulation import run_harness
    from dataclasses import replace

    neon = replace(em.lowered, target=resolve_target("rpi5"))  # same SVE binary, NEON core model
    with pytest.raises(EmulationError, match="illegal instruction"):
        run_harness(em.executable, neon, case.examples)


def test_input_errors_and_cpu_models(cache_dir):
    case = zoo_case("mlp")
    em = EmulatedModel(case.graph, "rpi5", cache_dir=cache_dir)
    (name,) = case.graph.inputs
    with pytest.raises(EmulationError, match="shape"):
        em.run([{name: np.zeros((2, 784), np.float32)}])
    with pytest.raises(EmulationError, match="missing input"):
        em.run([{}])
    with pytest.raises(EmulationError, match="no SVE"):
        em.run(case.examples, 256)
    assert em.run([]) == []
    sve = resolve_target("arm64-sve2")
    assert qemu_cpu(sve, 2048) == "max,sve-default-vector-length=256"
    assert qemu_cpu(resolve_target("jetson-xavier")) == "cortex-a76"
    with pytest.raises(EmulationError, match="vector length"):
        qemu_cpu(sve, 384)
    with pytest.raises(EmulationError, match="no emulation"):
        EmulatedModel(case.graph, "x86-avx2", cache_dir=cache_dir)
    assert em.lowered.entry in harness_source(em.lowered)
    assert "EMULATED" in em.banner()


def test_bool_inputs_of_any_nonzero_byte_are_true(cache_dir):
    """As on the host (``test_session``): a mask byte of 2 or 255 that NumPy takes for True is 1 on the device."""
    from cuvil.compiler import DType, Node, TensorType, infer_graph_types

    raw = np.array([2, 1, 0, 255], np.uint8)
    graph = infer_graph_types("g", {"m": TensorType(DType.BOOL, (4,))}, {},
                              [Node.make("Cast", ["m"], ["f"], to=DType.F32)], ["f"])
    (got,) = emulate(graph, "rpi5", [{"m": raw.view(np.bool_)}], cache_dir=cache_dir)
    assert got["f"].tolist() == [1.0, 1.0, 0.0, 1.0]


def test_missing_toolchain_is_a_typed_error(monkeypatch, cache_dir):
    from cuvil.devices import emulation

    monkeypatch.setattr(emulation.shutil, "which", lambda name: None)
    case = zoo_case("mlp")
    with pytest.raises(emulation.ToolchainMissing, match="apt-get install"):
        EmulatedModel(case.graph, "rpi5", use_cache=False)


def test_symbolic_batch(cache_dir):
    """A graph with a batch dimension N, compiled at batch 5: each example holds five rows."""
    from cuvil.compiler import DType, TensorType
    from cuvil.compiler.frontends.builder import GraphBuilder
    from cuvil.compiler.ir.types import N

    gb = GraphBuilder("batched")
    x = gb.input("x", TensorType(DType.F32, (N, 67)))
    w = gb.constant(np.random.default_rng(1).standard_normal((67, 37)).astype(np.float32), "w")
    (y,) = gb.add("MatMul", [x, w])
    (z,) = gb.add("Softmax", [y], axis=-1)
    graph = gb.build([z])
    case = Case(graph, [(5, 67)], 3)
    em = EmulatedModel(graph, "arm64-sve2", batch=5, cache_dir=cache_dir)
    run_lengths(em, case, (128, 2048))


def test_cli_run_as_a_device_says_it_is_emulated(tmp_path):
    from click.testing import CliRunner

    import cuvil
    from cuvil.cli import main

    torch.manual_seed(5)
    case = Case(_import(Tiny().eval(), (torch.randn(1, 13),)), [(1, 13)], 1, seed=3)
    pair = cuvil.keygen(tmp_path, "k")
    cuvil.export(case.graph, tmp_path / "m.cuvil", pair.private_path)
    (name,) = case.graph.inputs
    np.save(tmp_path / "x.npy", case.examples[0][name])
    res = CliRunner().invoke(main, ["run", str(tmp_path / "m.cuvil"), "--trust", str(pair.public_path), "--device",
                                    "rpi5", "--input", str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npz")])
    assert res.exit_code == 0, res.output
    assert res.output.startswith("EMULATED: rpi5 (cortex-a76) under qemu-user")
    case.check([dict(np.load(tmp_path / "y.npz"))], "cli")
