"""The public native API and the CLI commands over it: compile, run (native by default), bench, devices."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

import cuvil
from cuvil.cli import main
from cuvil.compiler import DType, N, Node, TensorType, infer_graph_types


def mlp_graph():
    rng = np.random.default_rng(3)
    consts = {"w": rng.standard_normal((8, 5)).astype(np.float32), "b": rng.standard_normal(5).astype(np.float32)}
    nodes = [Node.make("Gemm", ["x", "w", "b"], ["h"]), Node.make("Tanh", ["h"], ["y"])]
    return infer_graph_types("mlp", {"x": TensorType(DType.F32, (N, 8))}, consts, nodes, ["y"])


def expected(x):
    rng = np.random.default_rng(3)
    w, b = rng.standard_normal((8, 5)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    return np.tanh(x.astype(np.float64) @ w + b)


def test_compile_and_run_native_match_numpy(tmp_path):
    x = np.random.default_rng(0).standard_normal((3, 8)).astype(np.float32)
    session = cuvil.compile(mlp_graph(), batch=3, cache_dir=tmp_path)
    np.testing.assert_allclose(session.run({"x": x})["y"], expected(x), rtol=1e-4, atol=1e-5)
    assert session.memory_plan.arena_bytes >= session.memory_plan.lower_bound > 0
    got = cuvil.run_native(mlp_graph(), {"x": x[:2]}, cache_dir=tmp_path)["y"]
    np.testing.assert_allclose(got, expected(x[:2]), rtol=1e-4, atol=1e-5)


def test_run_native_rejects_inputs_of_the_wrong_dtype(tmp_path):
    with pytest.raises(cuvil.CuvilError, match="dtype"):
        cuvil.run_native(mlp_graph(), {"x": np.zeros((1, 8))}, cache_dir=tmp_path)


def test_bench_reports_ordered_percentiles_and_a_cache_hit_start():
    r = cuvil.bench(mlp_graph(), runs=20, warmup=2)
    lat = r.latency
    assert 0 < lat.p50_ms <= lat.p90_ms <= lat.p99_ms and lat.runs == 20
    assert r.cold_compile_s > 0 and r.warm_start_ms > 0 and r.arena_bytes >= r.lower_bound_bytes


@pytest.fixture
def signed(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_TRUST_DIR", str(tmp_path / "trust"))
    pair = cuvil.keygen(tmp_path / "keys")
    bundle = tmp_path / "m.cuvil"
    cuvil.export(mlp_graph(), bundle, pair.private_path)
    return bundle, pair.public_path


def test_cli_run_is_native_by_default_and_reference_on_request(tmp_path, signed):
    bundle, pub = signed
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    runner = CliRunner()
    outs = {}
    for extra in ((), ("--reference",)):
        out = tmp_path / f"out{len(extra)}.npz"
        res = runner.invoke(main, ["run", str(bundle), "--trust", str(pub), "--input", str(tmp_path / "x.npy"),
                                   "--output", str(out), *extra])
        assert res.exit_code == 0, res.output
        with np.load(out) as z:
            outs[extra] = z["y"]
    np.testing.assert_allclose(outs[()], expected(x), rtol=1e-4, atol=1e-5)
    ref = cuvil.run_reference(mlp_graph(), {"x": x})["y"]
    assert outs[("--reference",)].tobytes() == ref.tobytes()


def test_cli_bench_json_and_devices(signed):
    bundle, pub = signed
    runner = CliRunner()
    res = runner.invoke(main, ["bench", str(bundle), "--trust", str(pub), "--runs", "10", "--warmup", "1", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["latency"]["p50_ms"] <= data["latency"]["p99_ms"] and data["cold_compile_s"] > 0
    res = runner.invoke(main, ["devices"])
    assert res.exit_code == 0
    for name in ("rpi5", "jetson-orin", "graviton4", "x86-avx512", "host"):
        assert f"\n{name} " in res.output
    assert "scalable (SVE)" in res.output and "sm_87" in res.output


def test_threads_reach_the_session_and_the_cli(tmp_path, signed):
    x = np.random.default_rng(2).standard_normal((1, 8)).astype(np.float32)
    outs = [cuvil.compile(mlp_graph(), cache_dir=tmp_path, threads=t).run({"x": x})["y"] for t in (1, 3)]
    assert outs[0].tobytes() == outs[1].tobytes()
    assert cuvil.compile(mlp_graph(), cache_dir=tmp_path, threads=3).threads == 3
    bundle, pub = signed
    runner = CliRunner()
    res = runner.invoke(main, ["bench", str(bundle), "--trust", str(pub), "--runs", "10", "--warmup", "1",
                               "--threads", "2", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["threads"] == 2
    np.save(tmp_path / "x.npy", x)
    res = runner.invoke(main, ["run", str(bundle), "--trust", str(pub), "--input", str(tmp_path / "x.npy"),
                               "--threads", "2"])
    assert res.exit_code == 0, res.output
    for bad in ("0", "65", "two"):
        res = runner.invoke(main, ["bench", str(bundle), "--trust", str(pub), "--threads", bad])
        assert res.exit_code == 2
    res = runner.invoke(main, ["devices"])
    rpi5 = next(line for line in res.output.splitlines() if line.startswith("rpi5 "))
    assert "threads" in res.output.splitlines()[0] and " 4 " in rpi5  # the Pi's 4 cores


def _spoil_last_weight_byte(bundle):
    data = bytearray(bundle.read_bytes())
    data[-1] ^= 0xFF  # the weights come last; the signed head is untouched
    bundle.write_bytes(bytes(data))


def test_a_lazily_loaded_model_runs_from_the_cache_without_reading_its_weights(tmp_path, signed):
    bundle, pub = signed
    x = np.random.default_rng(2).standard_normal((2, 8)).astype(np.float32)
    first = cuvil.run_native(cuvil.load(bundle, [pub], lazy=True), {"x": x}, cache_dir=tmp_path / "cache")["y"]
    np.testing.assert_allclose(first, expected(x), rtol=1e-4, atol=1e-5)
    _spoil_last_weight_byte(bundle)
    with pytest.raises(cuvil.BundleError):
        cuvil.load(bundle, [pub])  # the weights are damaged now
    model = cuvil.load(bundle, [pub], lazy=True)  # the signed head still verifies
    again = cuvil.run_native(model, {"x": x}, cache_dir=tmp_path / "cache")["y"]  # a hit: the checked entry's weights
    assert again.tobytes() == first.tobytes() and "graph" not in vars(model)
    with pytest.raises(cuvil.BundleError):  # a miss reads them, checked
        cuvil.run_native(cuvil.load(bundle, [pub], lazy=True), {"x": x}, cache_dir=tmp_path / "other")


def test_cli_run_reads_no_weights_on_a_cache_hit_and_refuses_damaged_ones_on_a_miss(tmp_path, signed, monkeypatch):
    bundle, pub = signed
    np.save(tmp_path / "x.npy", np.ones((1, 8), np.float32))
    runner = CliRunner()

    def run(out: str):
        return runner.invoke(main, ["run", str(bundle), "--trust", str(pub), "--input", str(tmp_path / "x.npy"),
                                    "--output", str(tmp_path / out)])

    assert run("a.npz").exit_code == 0
    _spoil_last_weight_byte(bundle)
    res = run("b.npz")
    assert res.exit_code == 0, res.output
    with np.load(tmp_path / "a.npz") as a, np.load(tmp_path / "b.npz") as b:
        assert a["y"].tobytes() == b["y"].tobytes()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty-cache"))
    res = run("c.npz")
    assert res.exit_code != 0 and len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_a_batch_for_a_model_whose_batch_is_fixed_is_refused():
    """``cuvil bench --batch N`` timed batch 1 and printed 'batch N' (even 2**64) for a fixed-batch model."""
    from cuvil.compiler.errors import CuvilError
    from cuvil.compiler.frontends.builder import GraphBuilder
    from cuvil.native import bench
    from cuvil.preflight import compile_for

    gb = GraphBuilder("fixed")
    x = gb.input("x", TensorType(DType.F32, (1, 8)))
    fixed = gb.build([gb.add1("Relu", [x])])
    for batch in (2, 2**64):
        with pytest.raises(CuvilError, match="batch is fixed"):
            bench(fixed, runs=5, warmup=0, batch=batch)
        with pytest.raises(CuvilError, match="batch is fixed"):
            compile_for(fixed, "host", batch)
    assert bench(fixed, runs=5, warmup=0, batch=1).latency.runs == 5
