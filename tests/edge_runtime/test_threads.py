"""Multi-threaded inference: the same bits at any thread count, no deadlock, sessions apart.

Compiled for a named profile (x86-avx2 runs on every build host) with ``parallel_sync_ratio`` at 0,
so every packed convolution is split, small layers included: the strongest test of the split. Untuned
(``tune=False``): the compile-time check that keeps a split only where it pays (``test_split_check``, ``test_plan_search``)
would undo it on a busy test machine.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cuvil.compiler.codegen.lower import lower  # noqa: E402
from cuvil.compiler.frontends.torch import import_torch  # noqa: E402
from cuvil.devices import resolve_target  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph  # noqa: E402
from tests.archs import ARCHS, UNSUPPORTED  # noqa: E402
from tests.blocks import mobilenet_block  # noqa: E402
from tests.hosts import executable  # noqa: E402
from tests.int8_zoo import CNN_AND_MLP, int8_model  # noqa: E402
from tests.zoo import ZOO  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
AVX2 = resolve_target("x86-avx2")
SPLIT_ALL = dataclasses.replace(AVX2, tuning=AVX2.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0))
SMALLER = {"lstm_kws": {"frames": 8}, "gru_kws": {"frames": 8}, "squeezenet": {"size": 64}, "tiny_yolo": {"size": 64},
           "mobilenet_v1": {"size": 64}, "resnet50": {"size": 64}, "shufflenet_v2": {"size": 96}}
TORCH_IMPORTABLE = [n for n in ARCHS if n not in UNSUPPORTED]


def _graph(builder, **kw):
    model, example = builder(**kw)
    return import_torch(model, example), [x.numpy() for x in example]


def _outputs(graph, inputs, threads: int, tmp_path, target=SPLIT_ALL) -> tuple[dict[str, np.ndarray], int]:
    session = compile_graph(graph, target, cache_dir=tmp_path, tune=False, threads=threads)
    assert session.threads == threads
    out = session.run(dict(zip(graph.inputs, inputs)))
    split = session.lowered.split_nodes
    session.close()
    return out, split


def _same_bits_at_1_2_3(graph, inputs, tmp_path, target=SPLIT_ALL) -> int:
    one, _ = _outputs(graph, inputs, 1, tmp_path, target)
    splits = 0
    for threads in (2, 3):
        out, split = _outputs(graph, inputs, threads, tmp_path, target)
        splits += split
        for name in one:
            assert one[name].tobytes() == out[name].tobytes(), f"{name} differs at {threads} threads"
    return splits


@pytest.mark.parametrize("name", list(ZOO))
def test_zoo_outputs_are_the_same_bits_at_1_2_and_3_threads(name, tmp_path):
    graph, inputs = _graph(ZOO[name])
    splits = _same_bits_at_1_2_3(graph, inputs, tmp_path)
    if name in ("mlp", "small_cnn", "resnet18", "mobilenet_v2"):
        assert splits > 0  # the conv (the MLP: fully connected) layers really ran split


@pytest.mark.parametrize("name", TORCH_IMPORTABLE)
def test_architectures_are_the_same_bits_at_1_2_and_3_threads(name, tmp_path):
    graph, inputs = _graph(ARCHS[name], **SMALLER.get(name, {}))
    _same_bits_at_1_2_3(graph, inputs, tmp_path)


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512-vnni"])
@pytest.mark.parametrize("name", CNN_AND_MLP)
def test_int8_zoo_outputs_are_the_same_bits_at_1_2_and_3_threads(name, profile, tmp_path):
    """Integer convs split by output channels (AVX2's int16 pairs and Winograd; VNNI's in-place taps,
    window rows and channels in lanes), fully connected layers by columns, each part the kernel its
    own shape gets."""
    base = executable(profile)
    target = dataclasses.replace(base, tuning=base.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0))
    model = int8_model(name)
    splits = _same_bits_at_1_2_3(model.int8, [model.inputs(1, seed=7)], tmp_path, target)
    assert splits > 0  # the MLP: its fully connected layers


def test_a_matmul_model_of_one_row_is_the_same_bits_at_1_2_and_3_threads(tmp_path):
    """ONNX's MatMul + Add form of fully connected layers (as Keras and TensorFlow export them)."""
    from cuvil.compiler.frontends.builder import GraphBuilder
    from cuvil.compiler.ir.types import TensorType

    rng = np.random.default_rng(4)
    b = GraphBuilder("matmuls")
    v = b.input("x", TensorType.parse("f32[1,256]"))
    for k, n in ((256, 512), (512, 72)):
        w = b.constant(rng.standard_normal((k, n)).astype(np.float32))
        v = b.add1("Relu", [b.add1("Add", [b.add1("MatMul", [v, w]), b.constant(rng.standard_normal(n).astype(np.float32))])])
    graph = b.build([v])
    assert _same_bits_at_1_2_3(graph, [rng.standard_normal((1, 256)).astype(np.float32)], tmp_path) > 0


@pytest.fixture(scope="module")
def small_cnn():
    return _graph(ZOO["small_cnn"])


def test_ten_thousand_inferences_on_two_threads_neither_hang_nor_drift(small_cnn, tmp_path):
    graph, inputs = small_cnn
    session = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=2)
    assert session.lowered.split_nodes >= 2
    feeds = dict(zip(graph.inputs, inputs))
    (name,) = graph.outputs
    first = session.run(feeds)[name].tobytes()
    drifted = [i for i in range(10_000) if session.run(feeds)[name].tobytes() != first]
    assert not drifted, f"{len(drifted)} inferences drifted, the first {drifted[0]}"


def test_two_sessions_in_one_process_keep_their_own_workers(small_cnn, tmp_path):
    graph, inputs = small_cnn
    feeds = dict(zip(graph.inputs, inputs))
    (name,) = graph.outputs
    a = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=2)
    b = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=2)  # a cache hit: the same object code
    assert b.stats.cache_hit and b.lowered.split_nodes == a.lowered.split_nodes > 0  # the count survives the cache
    want = a.run(feeds)[name]
    bad: list[str] = []

    def hammer(session, runs: int) -> None:
        for _ in range(runs):
            if session.run(feeds)[name].tobytes() != want.tobytes():
                bad.append("wrong output")

    workers = [threading.Thread(target=hammer, args=(s, 300)) for s in (a, b)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers) and not bad
    a.close()  # joining a's workers leaves b's running
    assert b.run(feeds)[name].tobytes() == want.tobytes()
    assert a.run(feeds)[name].tobytes() == want.tobytes()  # a closed session runs every part itself


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: no second CPU to bind a worker to "
                                                           "(a host of two or more CPUs runs this)")
@pytest.mark.parametrize("pin", [True, False])
def test_a_worker_binds_itself_to_the_cpu_after_the_callers(small_cnn, tmp_path, pin):
    """Worker 1 runs only on the second CPU of the process's mask (the caller keeps the first); with
    ``pool_pin`` off it may run on any."""
    graph, inputs = small_cnn
    cpus = sorted(os.sched_getaffinity(0))
    target = dataclasses.replace(SPLIT_ALL, tuning=SPLIT_ALL.tuning.replace(pool_pin=pin))
    before = set(os.listdir("/proc/self/task"))
    session = compile_graph(graph, target, cache_dir=tmp_path, tune=False, threads=2)
    session.run(dict(zip(graph.inputs, inputs)))
    masks: list[set[int]] = []
    for _ in range(500):  # the worker binds itself when it first runs: wait for that, at most 5 s
        masks = []
        for tid in set(os.listdir("/proc/self/task")) - before:
            try:
                masks.append(os.sched_getaffinity(int(tid)))
            except OSError:
                continue  # a thread of the compile that ended meanwhile
        if not pin or {cpus[1]} in masks:
            break
        time.sleep(0.01)
    session.close()
    if pin:
        assert {cpus[1]} in masks
    else:
        assert masks and all(m == set(cpus) for m in masks)


def test_a_forked_child_runs_without_its_parents_workers(small_cnn, tmp_path):
    graph, inputs = small_cnn
    feeds = dict(zip(graph.inputs, inputs))
    (name,) = graph.outputs
    session = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=2)
    want = session.run(feeds)[name]
    assert session._watch is not None  # the compile left it watching its workers
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the workers stayed in the parent, and there is nothing to re-time
        ok = session.run(feeds)[name].tobytes() == want.tobytes() and session._watch is None
        os.write(write, b"1" if ok else b"0")
        os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(pid, 0)
    assert got == b"1"


def _split_at(graph, threads: int, tmp_path):
    """The session at ``threads`` (every layer that can split, split), its IR and its jobs' definitions."""
    session = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=threads, optimize=False)
    text = lower(graph, dataclasses.replace(SPLIT_ALL, threads=threads), optimize=False).llvm_ir  # the session's was streamed
    return session, text, [line for line in text.splitlines() if line.startswith("define") and "_j" in line.split("(")[0]]


@pytest.mark.parametrize("residual", [True, False])
def test_a_depthwise_conv_joins_its_producers_job(residual, tmp_path):
    graph, x = mobilenet_block(residual)
    feeds = {graph.inputs[0]: x.astype(np.float32)}
    one = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=1, optimize=False).run(feeds)
    two, _, jobs = _split_at(graph, 2, tmp_path)
    # expand + depthwise share one handoff, project (and the residual Add) has its own; without the
    # residual the block's input dies at the expand conv, and the plan still keeps the depthwise output
    # off its bytes, which the other expand part may be reading (jobs.held_until)
    assert two.lowered.split_nodes == (4 if residual else 3) and len(jobs) == 2
    out = two.run(feeds)
    assert all(one[k].tobytes() == out[k].tobytes() for k in one)


def _pool_graph():
    """A conv (32 channels) and its 2x2 max pool, then a padded 3x3 average pool of ceil mode: both pools
    join the conv's job (the plan keeps the conv's output, dead after the max pool, clear of the average
    pool's); the input's own max pool, last, has a job of its own."""
    from cuvil.compiler.frontends.builder import GraphBuilder
    from cuvil.compiler.ir.types import TensorType

    rng = np.random.default_rng(5)
    b = GraphBuilder("pools")
    x = b.input("x", TensorType.parse("f32[1,8,20,20]"))
    w = b.constant(rng.standard_normal((32, 8, 3, 3)).astype(np.float32))
    y = b.add1("Conv", [x, w], pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1)
    y = b.add1("MaxPool", [y], kernel_shape=(2, 2), strides=(2, 2), pads=(0, 0, 0, 0), dilations=(1, 1))
    y = b.add1("AveragePool", [y], kernel_shape=(3, 3), strides=(2, 2), pads=(1, 1, 1, 1), ceil_mode=1,
               count_include_pad=0)
    z = b.add1("MaxPool", [x], kernel_shape=(2, 2), strides=(2, 2), pads=(0, 0, 0, 0), dilations=(1, 1))
    return b.build([y, z]), rng.standard_normal((1, 8, 20, 20)).astype(np.float32)


def test_pools_split_by_channels_in_their_producers_job(tmp_path):
    graph, x = _pool_graph()
    feeds = {graph.inputs[0]: x}
    one = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=1, optimize=False).run(feeds)
    for threads in (2, 3):
        many, text, jobs = _split_at(graph, threads, tmp_path)
        assert many.lowered.split_nodes == 4 and len(jobs) == 2  # conv and both its pools in one job
        out = many.run(feeds)
        assert all(one[k].tobytes() == out[k].tobytes() for k in one)


def _attention_graph():
    """A transformer block's shapes: tokens by constant weights (rows), a bias Add in place on their
    output, attention's two MatMuls of computed operands (heads) with a scale between, and a Gemm of
    a 2-D A (rows of axis 0). 65 tokens: no part of the heads or the bias Add starts on a cache line."""
    from cuvil.compiler.frontends.builder import GraphBuilder
    from cuvil.compiler.ir.types import TensorType

    rng = np.random.default_rng(8)
    b = GraphBuilder("attention")
    x = b.input("x", TensorType.parse("f32[1,65,64]"))

    def const(*shape):
        return b.constant((rng.standard_normal(shape) / 8).astype(np.float32))

    def heads(v, perm):
        return b.add1("Transpose", [b.add1("Reshape", [v], shape=(1, 65, 4, 16))], perm=perm)

    q, k, v = (b.add1("Add", [b.add1("MatMul", [x, const(64, 64)]), const(64)]) for _ in range(3))
    s = b.add1("Mul", [b.add1("MatMul", [heads(q, (0, 2, 1, 3)), heads(k, (0, 2, 3, 1))]), b.constant(np.float32(0.25))])
    o = b.add1("MatMul", [b.add1("Softmax", [s], axis=-1), heads(v, (0, 2, 1, 3))])
    o = b.add1("Reshape", [b.add1("Transpose", [o], perm=(0, 2, 1, 3))], shape=(65, 64))
    y = b.add1("Relu", [b.add1("Gemm", [o, const(48, 64), const(48)], transB=1)])
    return b.build([y]), rng.standard_normal((1, 65, 64)).astype(np.float32)


def test_gemms_of_several_rows_heads_and_elementwise_ops_split_with_the_same_bits(tmp_path):
    graph, x = _attention_graph()
    feeds = {graph.inputs[0]: x}
    one = compile_graph(graph, SPLIT_ALL, cache_dir=tmp_path, tune=False, threads=1, optimize=False).run(feeds)
    for threads in (2, 3):
        many, text, jobs = _split_at(graph, threads, tmp_path)
        # 3 x (MatMul + its bias Add), the scores' MatMul + scale + softmax (the plan keeps Q's heads, which
        # another part's MatMul may still read, off the softmax's output), the MatMul by V, the Gemm; the
        # Relu stays whole (the Gemm's rows are axis 0's, and axis 1 of a batch of 65 rows does not split)
        assert many.lowered.split_nodes == 11 and len(jobs) == 6
        # the second part's heads start 2 x 65 x 65 floats in (8-byte aligned), at 3 threads the third's 3 x
        # (4-byte): each part's kernel is told the alignment its pointers have, not the arena's 64 bytes
        assert f"align {8 if threads == 2 else 4} " in text
        out = many.run(feeds)
        assert all(one[k].tobytes() == out[k].tobytes() for k in one), f"differs at {threads} threads"


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
def test_convs_ending_in_a_partial_vector_of_channels_split_with_the_same_bits(profile, tmp_path):
    """20 and 12 output channels (2.5 and 1.5 vectors of 8 lanes; 1.25 and 0.75 of 16): the last part
    takes the partial vector, as the whole layer has it, through the 3x3 (Winograd or direct), 1x1 and
    strided kernels."""
    from cuvil.compiler.frontends.builder import GraphBuilder
    from cuvil.compiler.ir.types import TensorType

    base = executable(profile)
    target = dataclasses.replace(base, tuning=base.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0))
    rng = np.random.default_rng(9)
    b = GraphBuilder("partial")
    y = b.input("x", TensorType.parse("f32[1,16,24,24]"))
    for c, oc, k, stride in ((16, 20, 3, 1), (20, 12, 1, 1), (12, 20, 3, 2), (20, 36, 3, 1)):
        w = b.constant(rng.standard_normal((oc, c, k, k)).astype(np.float32) / k)
        y = b.add1("Relu", [b.add1("Conv", [y, w, b.constant(rng.standard_normal(oc).astype(np.float32))],
                                   pads=(k // 2,) * 4, strides=(stride, stride), dilations=(1, 1), group=1)])
    graph = b.build([y])
    assert _same_bits_at_1_2_3(graph, [rng.standard_normal((1, 16, 24, 24)).astype(np.float32)], tmp_path, target) >= 4


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
def test_winograd_convs_split_by_tile_rows_with_the_same_bits(profile, tmp_path):
    """3x3 convs of at most 64 channels over 28x28 (7 x 7 tiles of F(4x4): 2 blocks of 4 and 3 tile rows at 2
    threads, 3 blocks of 3, 3 and 1 at 3), with bias, a residual and a partial vector of channels (24)."""
    from cuvil.compiler.codegen.cpu.kernels.split import split_ranges
    from cuvil.compiler.frontends.builder import GraphBuilder
    from cuvil.compiler.ir.types import TensorType

    base = executable(profile)
    target = dataclasses.replace(base, tuning=base.tuning.replace(parallel_sync_ratio=0.0, split_min_reuse=0))
    rng = np.random.default_rng(5)
    b = GraphBuilder("rows")
    x = b.input("x", TensorType.parse("f32[1,16,28,28]"))

    def conv(v, c, oc):
        w = b.constant(rng.standard_normal((oc, c, 3, 3)).astype(np.float32) / 3)
        return b.add1("Conv", [v, w, b.constant(rng.standard_normal(oc).astype(np.float32))],
                      pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1)
    y = b.add1("Relu", [conv(x, 16, 32)])
    y = b.add1("Relu", [b.add1("Add", [conv(y, 32, 32), y])])
    graph = b.build([conv(y, 32, 24)])
    for threads in (2, 3):
        for c, oc in ((16, 32), (32, 32), (32, 24)):
            ranges = split_ranges(dataclasses.replace(target, threads=threads),
                                  (1, c, 28, 28, oc, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1))
            assert [r.blocks for r in ranges] == [(i, i + 1) for i in range(threads)]
    assert _same_bits_at_1_2_3(graph, [rng.standard_normal((1, 16, 28, 28)).astype(np.float32)], tmp_path, target) >= 6


@pytest.mark.parametrize("profile", ["x86-avx2", "x86-avx512"])
def test_thin_convs_split_by_pixel_vectors_mid_tile_with_the_same_bits(profile, tmp_path):
    """A 1x1 conv to 8 channels after a split 3x3 conv splits by pixel vectors, as even as they go: 20x20
    outputs in 8 lanes are 50 slots, tiles of 3, so each part of 2 and 3 ends in a tile of fewer slots."""
    from cuvil.compiler.codegen.cpu.conv.plan import conv_plan
    from cuvil.compiler.codegen.cpu.kernels.split import split_ranges
    from cuvil.compiler.frontends.builder import GraphBuilder
    from cuvil.compiler.ir.types import TensorType

    base = executable(profile)
    target = dataclasses.replace(base, tuning=base.tuning.replace(parallel_sync_ratio=0.0))
    thin = (1, 48, 20, 20, 8, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    plan = conv_plan(target, *thin)
    for threads in (2, 3):
        ranges = split_ranges(dataclasses.replace(target, threads=threads), thin)
        assert all(r.after_job_only for r in ranges) and len(ranges) == threads
        assert any((hi - lo) % plan.nv for lo, hi in (r.blocks for r in ranges))  # a part ends mid-tile
    rng = np.random.default_rng(11)
    b = GraphBuilder("thin")
    x = b.input("x", TensorType.parse("f32[1,16,20,20]"))
    w3 = b.constant(rng.standard_normal((48, 16, 3, 3)).astype(np.float32) / 3)
    y = b.add1("Relu", [b.add1("Conv", [x, w3], pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1)])
    w1 = b.constant(rng.standard_normal((8, 48, 1, 1)).astype(np.float32) / 7)
    graph = b.build([b.add1("Conv", [y, w1, b.constant(rng.standard_normal(8).astype(np.float32))],
                            pads=(0, 0, 0, 0), strides=(1, 1), dilations=(1, 1), group=1)])
    assert _same_bits_at_1_2_3(graph, [rng.standard_normal((1, 16, 20, 20)).astype(np.float32)], tmp_path, target) >= 4
