"""Whole models through the native path: correctness, the disk cache, the hot path's memory."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from cuvil.compiler import DType, N, TensorType, print_graph, run_reference
from cuvil.compiler.codegen.lower import lower
from cuvil.compiler.errors import CompileError, InterpreterError
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.edge_runtime import jit
from cuvil.edge_runtime.cache import finish_writes
from cuvil.edge_runtime.compile import compile_graph, lower_for, resolve
from cuvil.edge_runtime.session import Session, new_arena

from ..guarded import run_in_child

RTOL, ATOL = 1e-4, 1e-5
ZOO_FAST = ["mlp", "small_cnn", "tiny_transformer"]
ZOO_SLOW = ["resnet18", "mobilenet_v2"]


def mlp_graph(seed: int = 0, batch_symbolic: bool = False):
    """A small MLP built without torch (subprocesses rebuild it from its text form)."""
    rng = np.random.default_rng(seed)
    gb = GraphBuilder("mlp_np")
    x = gb.input("x", TensorType(DType.F32, (N if batch_symbolic else 1, 37)))
    w1, b1 = gb.constant(rng.standard_normal((64, 37), dtype=np.float32) * 0.2), gb.constant(rng.standard_normal(64, dtype=np.float32))
    w2, b2 = gb.constant(rng.standard_normal((10, 64), dtype=np.float32) * 0.2), gb.constant(rng.standard_normal(10, dtype=np.float32))
    h = gb.add1("Relu", [gb.add1("Gemm", [x, w1, b1], transB=1)])
    y = gb.add1("Softmax", [gb.add1("Gemm", [h, w2, b2], transB=1)], axis=-1)
    return gb.build([y])


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "cache"


def _check(graph, feeds, sess):
    got, want = sess.run(feeds), run_reference(graph, feeds)
    for name in graph.outputs:
        np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)


# ------------------------------------------------------------------------------------------ zoo ---
def _zoo_case(name, cache_dir):
    pytest.importorskip("torch")
    sys.path.insert(0, os.path.dirname(os.path.dirname(__file__)))
    from cuvil.compiler.frontends.torch import import_torch

    from tests.zoo import ZOO

    model, example = ZOO[name]()
    graph = import_torch(model, example)
    feeds = {n: t.numpy() for n, t in zip(graph.inputs, example)}
    sess = compile_graph(graph, cache_dir=cache_dir, guard_pages=True)  # arena and weights between guard pages
    got, want = run_in_child(sess, feeds), run_reference(graph, feeds)
    for out in graph.outputs:
        np.testing.assert_allclose(got[out], want[out], rtol=RTOL, atol=ATOL, err_msg=out)
    return graph, feeds, sess


@pytest.mark.parametrize("name", ZOO_FAST)
def test_zoo_model_matches_reference(name, cache_dir):
    _, _, sess = _zoo_case(name, cache_dir)
    assert sess.stats.kernel_count >= 1 and sess.stats.object_bytes > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ZOO_SLOW)
def test_zoo_large_model_matches_reference(name, cache_dir):
    _zoo_case(name, cache_dir)


# ---------------------------------------------------------------------------------------- session ---
def test_batch_sizes_compile_separately(cache_dir):
    graph = mlp_graph(batch_symbolic=True)
    for batch in (1, 3):
        sess = compile_graph(graph, batch=batch, cache_dir=cache_dir)
        x = np.random.default_rng(batch).standard_normal((batch, 37), dtype=np.float32)
        _check(graph, {"x": x}, sess)
        assert sess.memory_plan.batch == batch


def test_session_reports_and_rejects_bad_inputs(cache_dir):
    sess = compile_graph(mlp_graph(), cache_dir=cache_dir)
    assert sess.stats.lower_ms > 0 and sess.stats.kernel_count >= 2
    assert sess.memory_plan.arena_bytes > 0
    with pytest.raises(InterpreterError):
        sess.run({})
    with pytest.raises(InterpreterError):
        sess.run({"x": np.zeros((2, 37), np.float32)})
    with pytest.raises(InterpreterError):
        sess.run({"x": np.ones((1, 37), np.complex64)})
    as_list = sess.run({"x": [[1.0] * 37]})  # converted (same_kind casting) on the slow path
    out1 = sess.run({"x": np.ones((1, 37), np.float32)})
    out2 = sess.run({"x": np.ones((1, 37), np.float32)})
    name = sess.output_names[0]
    np.testing.assert_array_equal(out1[name], out2[name])
    np.testing.assert_array_equal(out1[name], as_list[name])
    out1[name][...] = 0  # outputs are copies, not views of the arena
    assert np.any(sess.run({"x": np.ones((1, 37), np.float32)})[name] != 0)


def test_integers_that_do_not_fit_an_inputs_type_are_refused_not_wrapped():
    """An int64 index of 2**32 + 1 for an i32 Gather's index input was wrapped to 1 (same-kind casting) and
    selected a real row, where the same index as i32 raises RunTimeCheckError; values that fit convert."""
    from cuvil.compiler import Node, infer_graph_types

    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    graph = infer_graph_types("g", {"idx": TensorType(DType.I32, (2,))}, {"table": table},
                              [Node.make("Gather", ["table", "idx"], ["rows"])], ["rows"])
    sess = compile_graph(graph, use_cache=False)
    fits = sess.run({"idx": np.array([3, 1], np.int64)})["rows"]
    np.testing.assert_array_equal(fits, table[[3, 1]])
    assert sess.run_each(np.array([[0, 2]], np.uint64))[0][0].tolist() == table[[0, 2]].tolist()
    for wide in (np.array([2**32 + 1, 0], np.int64), np.array([2**64 - 1, 0], np.uint64)):
        with pytest.raises(InterpreterError, match="do not fit its type int32"):
            sess.run({"idx": wide})
        with pytest.raises(InterpreterError, match="do not fit its type int32"):
            sess.run_each(wide[None])


def test_resident_memory_flat_over_many_runs(cache_dir):
    sess = compile_graph(mlp_graph(), cache_dir=cache_dir)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 37), dtype=np.float32)}
    page = os.sysconf("SC_PAGE_SIZE")

    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * page

    for _ in range(200):
        sess.run(feeds)
    before = rss()
    for _ in range(2000):
        sess.run(feeds)
    assert rss() - before < 1 << 20


def test_threads_sharing_a_session_get_their_own_outputs(cache_dir):
    """One arena: without the lock, two threads interleaving input copies and runs got each other's
    outputs (4 wrong in 6,000 runs in the review). Each thread checks every output it gets."""
    sess = compile_graph(mlp_graph(), cache_dir=cache_dir)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((1, 37), dtype=np.float32)} for _ in range(2)]
    name = sess.output_names[0]
    want = [sess.run(f)[name] for f in feeds]
    wrong = [0, 0]

    def worker(i: int) -> None:
        for _ in range(3000):
            if not np.array_equal(sess.run(feeds[i])[name], want[i]):
                wrong[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert wrong == [0, 0]


# ------------------------------------------------------------------------------------------ cache ---
def test_second_compile_hits_the_cache(cache_dir):
    graph = mlp_graph()
    first = compile_graph(graph, cache_dir=cache_dir)
    second = compile_graph(graph, cache_dir=cache_dir)
    assert not first.stats.cache_hit and second.stats.cache_hit
    x = {"x": np.ones((1, 37), np.float32)}
    np.testing.assert_array_equal(first.run(x)[graph.outputs[0]], second.run(x)[graph.outputs[0]])
    assert not compile_graph(mlp_graph(seed=1), cache_dir=cache_dir).stats.cache_hit  # other weights


def test_corrupt_cache_entry_is_a_miss(cache_dir):
    graph = mlp_graph()
    compile_graph(graph, cache_dir=cache_dir)
    finish_writes()
    (entry,) = cache_dir.glob("*.cuvil-art")
    entry.write_bytes(entry.read_bytes()[:-100])  # truncated
    again = compile_graph(graph, cache_dir=cache_dir)
    assert not again.stats.cache_hit
    _check(graph, {"x": np.ones((1, 37), np.float32)}, again)
    assert compile_graph(graph, cache_dir=cache_dir).stats.cache_hit  # rewritten whole


_CHILD = textwrap.dedent("""
    import sys
    from cuvil.compiler import parse_graph
    from cuvil.edge_runtime.cache import compiler_fingerprint
    from cuvil.edge_runtime.compile import compile_graph
    import numpy as np
    graph = parse_graph(open(sys.argv[1]).read())
    sess = compile_graph(graph, cache_dir=sys.argv[2])
    out = sess.run({"x": np.ones((1, 37), np.float32)})[graph.outputs[0]]
    print(int(sess.stats.cache_hit), repr(float(out.sum())), compiler_fingerprint())
""")


def _children(tmp_path, cache_dir, count: int) -> list[tuple[str, str]]:
    text = tmp_path / "g.txt"
    text.write_text(print_graph(mlp_graph()))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(text), str(cache_dir)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(count)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        outs.append(tuple(out.split()))
    return outs


def test_cache_shared_across_processes(tmp_path, cache_dir):
    """Two processes compiling at once both succeed; a third one loads what they wrote.

    The key covers the compiler's own sources, so an edit to them between the children is a
    legitimate miss: the check is retried until the fingerprint is stable.
    """
    for _ in range(3):
        first = _children(tmp_path, cache_dir, 2)
        (hit, total, fp), = _children(tmp_path, cache_dir, 1)
        assert all(t == total for _, t, _ in first)
        if all(f == fp for _, _, f in first):
            assert hit == "1"
            break
    # one entry, the remembered fingerprint and host CPU, no temporary files left behind
    assert sorted(p.suffix for p in cache_dir.iterdir()) == [".cuvil-art", ".cuvil-cpu", ".cuvil-fingerprint"]


def test_parallel_compile_links_the_parts(monkeypatch, cache_dir):
    from cuvil.edge_runtime import stream

    monkeypatch.setattr(stream, "MAX_PART_BYTES", 0)  # a module per kernel group, and the entry's
    graph = mlp_graph()
    split = compile_graph(graph, cache_dir=cache_dir, jobs=2)
    whole = compile_graph(graph, use_cache=False, jobs=1)
    x = {"x": np.random.default_rng(3).standard_normal((1, 37), dtype=np.float32)}
    np.testing.assert_array_equal(split.run(x)[graph.outputs[0]], whole.run(x)[graph.outputs[0]])
    assert compile_graph(graph, cache_dir=cache_dir).stats.cache_hit  # both objects came back from disk


# -------------------------------------------------------------------------------------- targets ---
def _loop_graph():
    """Only loop-vectorized kernels (no hand-vectorized micro-kernel): the vectorizer's choice."""
    gb = GraphBuilder("loops")
    x = gb.input("x", TensorType(DType.F32, (4, 1000)))
    y = gb.input("y", TensorType(DType.F32, (1000,)))
    a = gb.add1("Sigmoid", [gb.add1("Add", [x, y])])
    return gb.build([gb.add1("ReduceSum", [a], axes=(1,))])


@pytest.mark.parametrize("graph", [mlp_graph, _loop_graph])
def test_avx512_target_uses_zmm_registers(graph):
    asm = jit.emit_assembly(lower(graph(), resolve("x86-avx512"), optimize=False).llvm_ir, resolve("x86-avx512"))
    assert "zmm" in asm
    asm2 = jit.emit_assembly(lower(graph(), resolve("x86-avx2"), optimize=False).llvm_ir, resolve("x86-avx2"))
    assert "ymm" in asm2 and "zmm" not in asm2


@pytest.mark.parametrize("profile", ["rpi5", "graviton3"])
def test_foreign_isa_emits_object_but_does_not_run(profile, cache_dir):
    obj = jit.emit_object(lower_for(mlp_graph(), profile).llvm_ir, resolve(profile))
    assert obj[:4] == b"\x7fELF" and int.from_bytes(obj[18:20], "little") == 183  # EM_AARCH64
    with pytest.raises(CompileError, match=f"cuvil compile --target {profile} -o FILE"):
        compile_graph(mlp_graph(), target=profile, cache_dir=cache_dir)


def test_a_cold_session_runs_on_the_lowered_weights_without_a_copy():
    lowered = lower(mlp_graph(), resolve("host"))
    assert lowered.weights.ctypes.data % 64 == 0 and not lowered.weights.flags.writeable
    session = compile_graph(mlp_graph(), use_cache=False)
    assert session.lowered.weights == b""  # the block lives once, in the session
    code = jit.load_object(jit.emit_object(lowered.llvm_ir, resolve("host"), jit=True), lowered.entry, resolve("host"))
    again = Session(lowered, code, session.stats)
    assert again._weights is lowered.weights
    arena = new_arena(lowered)
    assert Session(lowered, code, session.stats, arena=arena)._arena is arena  # made beforehand, used as it is
    for bad in (arena[:lowered.arena_bytes - 1], new_arena(lowered)[1:]):  # too short; not 64-byte aligned
        with pytest.raises(ValueError, match="arena"):
            Session(lowered, code, session.stats, arena=bad)


# ------------------------------------------------------------------------------------- run_each ---
def test_run_each_gives_each_examples_first_output_as_run_does():
    graph = mlp_graph(4)
    sess = compile_graph(graph, target="x86-avx2", batch=1)
    xs = np.random.default_rng(5).standard_normal((6, 1, 37), dtype=np.float32)
    rows, ran = sess.run_each(xs)
    assert rows.shape == (6, 1, 10) and ran.all()
    for i, x in enumerate(xs):
        want = run_reference(graph, {"x": x})[graph.outputs[0]]
        np.testing.assert_allclose(rows[i], want, rtol=RTOL, atol=ATOL)


def test_run_each_marks_a_faulted_example_and_runs_the_next_clean():
    """A run-time check (Gather's index range) fails one example: that one is marked, the rest are exact."""
    gb = GraphBuilder("gather_each")
    idx = gb.input("idx", TensorType(DType.I64, (2,)))
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    sess = compile_graph(gb.build([gb.add1("Gather", [gb.constant(table), idx], axis=0)]), target="x86-avx2",
                         optimize=False)
    rows, ran = sess.run_each(np.array([[0, 3], [9, 0], [-1, 2]], np.int64))
    assert ran.tolist() == [True, False, True]
    np.testing.assert_array_equal(rows[0], table[[0, 3]])
    np.testing.assert_array_equal(rows[1], np.zeros((2, 3)))
    np.testing.assert_array_equal(rows[2], table[[3, 2]])


def test_a_raw_run_on_stale_indices_does_not_fault_the_next_run():
    """``run_raw`` runs on whatever the arena holds, and later tensors may have overwritten the indices
    (TextCNN at 2 threads: the compile's split check timed raw runs, so the user's first ``run`` of
    valid token ids raised RunTimeCheckError). The next ``run`` and ``run_each`` answer for themselves."""
    gb = GraphBuilder("gather_stale")
    idx = gb.input("idx", TensorType(DType.I64, (2,)))
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    sess = compile_graph(gb.build([gb.add1("Gather", [gb.constant(table), idx], axis=0)]), target="x86-avx2",
                         optimize=False)
    (_, view, _, _), = sess._inputs
    view[...] = [7, 0]  # what a later tensor might have left in the index bytes
    sess.run_raw()
    (out,) = sess.run({"idx": np.array([1, 2], np.int64)}).values()
    np.testing.assert_array_equal(out, table[[1, 2]])
    view[...] = [7, 0]
    sess.run_raw()
    rows, ran = sess.run_each(np.array([[0, 3]], np.int64))
    assert ran.tolist() == [True]
    np.testing.assert_array_equal(rows[0], table[[0, 3]])


def test_run_each_refuses_examples_of_another_size():
    sess = compile_graph(mlp_graph(4), target="x86-avx2", batch=1)
    with pytest.raises(InterpreterError, match="do not fit"):
        sess.run_each(np.zeros((3, 36), np.float32))


# ------------------------------------------------------------------------------------ bool bytes ---
def test_bool_inputs_of_any_nonzero_byte_are_true_as_numpy_reads_them():
    """A mask read with ``np.frombuffer(data, bool)`` may hold bytes other than 1 that NumPy takes for True;
    the native code read the byte itself: Cast gave 2.0 and 255.0, Not gave 253 (neither True nor False)."""
    from cuvil.compiler import Node, infer_graph_types

    raw = np.array([2, 1, 0, 4, 255, 0, 128, 1], np.uint8)
    mask, want = raw.view(np.bool_), raw != 0
    graph = infer_graph_types("g", {"m": TensorType(DType.BOOL, (8,))}, {},
                              [Node.make("Cast", ["m"], ["f"], to=DType.F32), Node.make("Not", ["m"], ["n"])],
                              ["f", "n"])
    sess = compile_graph(graph, use_cache=False)
    for got in (sess.run({"m": mask}), sess.run({"m": mask[::-1][::-1]})):  # contiguous, and a strided view
        np.testing.assert_array_equal(got["f"], want.astype(np.float32))
        assert got["n"].view(np.uint8).tolist() == (~want).astype(np.uint8).tolist()
    rows, ran = sess.run_each(raw.reshape(1, 8).view(np.bool_))
    assert ran.all() and rows[0].tolist() == want.astype(np.float32).tolist()
