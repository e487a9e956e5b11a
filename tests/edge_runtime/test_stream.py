"""Kernels streamed to LLVM while lowering goes on: every module stands alone, and the code is the one module's."""

from __future__ import annotations

import dataclasses
import gc
import re
import threading
import weakref

import llvmlite.binding as llvm
import numpy as np
import pytest
from llvmlite import ir

from cuvil.compiler.codegen.lower import lower
from cuvil.compiler import DType, TensorType
from cuvil.compiler.frontends.builder import GraphBuilder
from cuvil.edge_runtime import jit, parallel, stream
from cuvil.edge_runtime.compile import compile_graph, resolve
from cuvil.edge_runtime.levels import FULL_LEVEL, LIGHT_LEVEL, SLOTS_LEVEL
from cuvil.edge_runtime.parallel import LIGHT_ATTR, SLOTS_ATTR
from cuvil.compiler.codegen.cpu.conv.choices import conv_candidates, with_choices
from cuvil.edge_runtime.stream import KernelStream, _level

from tests.edge_runtime.test_parallel import _conv_graph, _run


def _defined_and_called(part: str) -> tuple[set[str], set[str]]:
    defined = set(re.findall(r'^define [^@]*@"([^"]+)"', part, re.M)) | set(re.findall(r'^declare [^@]*@"([^"]+)"', part, re.M))
    called = set(re.findall(r'call [^@]*@"([^"]+)"', part))
    return defined, called


@pytest.fixture
def one_group_per_module(monkeypatch):
    monkeypatch.setattr(stream, "MAX_PART_BYTES", 0)  # every kernel group closes its batch


def _streamed(graph, profile: str, monkeypatch, **options) -> tuple[list[tuple[int, str]], str, list[bytes], object]:
    """(kernel modules as (level, text), the entry's module, objects, lowered) of one streamed compile;
    ``options``: ``lower``'s."""
    seen, emit = [], jit.emit_object

    def spy(text, target, jit, speed_level):
        seen.append((speed_level, text))
        return emit(text, target, jit=jit, speed_level=speed_level)

    monkeypatch.setattr(jit, "emit_object", spy)  # no helpers: everything compiles in this process
    with KernelStream(resolve(profile)) as s:
        lowered = lower(graph, resolve(profile), stream=s, **options)
        objs = s.finish()
    entry = [t for _, t in seen if re.search(rf'^define [^@]*@"{lowered.entry}"', t, re.M)]
    assert len(entry) == 1
    return [m for m in seen if m[1] != entry[0]], entry[0], objs, lowered


def test_every_module_is_valid_and_defines_what_it_calls(one_group_per_module, monkeypatch):
    jit.init_llvm()
    modules, entry, objs, lowered = _streamed(_conv_graph(), "x86-avx2", monkeypatch)  # 3x3 convs share Winograd helpers
    texts = [t for _, t in modules]
    assert lowered.llvm_ir == "" and len(texts) >= 2 and len(objs) == len(texts) + 1
    helpers = {n for t in texts for n in re.findall(r'^define internal [^@]*@"([^"]+)"', t, re.M) if not re.match(r"k[0-9a-f]+_", n)}
    assert helpers  # the Winograd stage and its GEMM: in the module of the kernel that calls them
    wrappers = set()
    for text in texts + [entry]:
        llvm.parse_assembly(text).verify()
        defined, called = _defined_and_called(text)
        assert called <= defined, called - defined
        wrappers |= set(re.findall(r'^define void @"(k[0-9a-f]+_[A-Za-z0-9]+)"', text, re.M))
    for name in wrappers:  # each kernel is compiled once; the entry declares it
        assert sum(bool(re.search(rf'^define [^@]*@"{name}"', t, re.M)) for t in texts) == 1
        assert f'declare void @"{name}"' in entry


def test_prevectorized_conv_kernels_skip_the_module_optimizer_and_the_rest_does_not(monkeypatch):
    modules, _, _, _ = _streamed(_conv_graph(), "x86-avx512", monkeypatch)
    levels = {level: re.findall(r'^define [^@]*@"([^"]+)"', t, re.M) for level, t in modules}
    assert set(levels) == {LIGHT_LEVEL, FULL_LEVEL} and LIGHT_LEVEL < FULL_LEVEL
    (conv,) = [n for n in levels[LIGHT_LEVEL] if re.fullmatch(r"k[0-9a-f]+_FusedConv", n)]
    assert f"{conv}_mk" in levels[LIGHT_LEVEL] and any(re.fullmatch(r"k[0-9a-f]+_MatMul", n) for n in levels[FULL_LEVEL])
    assert not any("Conv" in n for n in levels[FULL_LEVEL]) and not any("MatMul" in n for n in levels[LIGHT_LEVEL])


def test_the_entry_points_and_the_pool_get_the_slots_passes_not_the_module_optimizer(monkeypatch):
    """Calls, offsets and atomics: nothing for the vectorizers (ResNet-18's entry module 44-54 against 74-82 ms of
    LLVM); the pool probe's pool gets the model's pool's level."""
    from cuvil.edge_runtime import pool_probe

    levels = []
    emit = jit.emit_object
    monkeypatch.setattr(jit, "emit_object", lambda text, target, jit, speed_level: levels.append(
        (speed_level, re.findall(r'^define [^@]*@"([^"]+)"', text, re.M))) or emit(text, target, jit=jit,
                                                                                    speed_level=speed_level))
    with KernelStream(resolve("host")) as s:
        lowered = lower(_conv_graph(convs=1), resolve("host"), stream=s)
        s.finish()
    (entry_level,) = [lv for lv, names in levels if lowered.entry in names]
    assert entry_level == SLOTS_LEVEL
    levels.clear()
    probe = pool_probe.Probe(dataclasses.replace(resolve("host"), threads=2))
    probe.close()
    assert [lv for lv, names in levels if "probe_par" in names] == [SLOTS_LEVEL]


def _two_qconvs():
    """A 3x3 QConv over an 8x8 plane (the ``rows`` kernel: sums in stack slots), then a 1x1 stride-2 one to 4x4
    (an im2col GEMM, its pixels filling its vectors, whose packing loops want the loop vectorizer)."""
    gb = GraphBuilder("qconvs")
    x = gb.input("x", TensorType(DType.U8, (1, 32, 8, 8)))
    rng = np.random.default_rng(0)
    q = dict(x_scale=0.05, x_zero_point=9, w_scale=np.full(32, 0.01, np.float32), y_scale=0.3, y_zero_point=100,
             to=DType.U8, clamp=[0, 255], dilations=[1, 1], group=1)
    w3 = gb.constant(rng.integers(-127, 128, (32, 32, 3, 3)).astype(np.int8), "w3")
    y = gb.add1("QConv", [x, w3], strides=[1, 1], pads=[1, 1, 1, 1], **q)
    w1 = gb.constant(rng.integers(-127, 128, (32, 32, 1, 1)).astype(np.int8), "w1")
    return gb.build([gb.add1("QConv", [y, w1], strides=[2, 2], pads=[0, 0, 0, 0], **q)])


def test_int8_convs_with_sums_in_stack_slots_get_registers_not_the_module_optimizer(monkeypatch):
    modules, _, _, _ = _streamed(_two_qconvs(), "x86-avx512-vnni", monkeypatch)
    levels = {level: re.findall(r'^define [^@]*@"([^"]+)"', t, re.M) for level, t in modules}
    assert all(sum(bool(re.fullmatch(r"k[0-9a-f]+_QConv", n)) for n in levels[lv]) == 1 for lv in (SLOTS_LEVEL, FULL_LEVEL))
    (slotted,) = [t for level, t in modules if level == SLOTS_LEVEL]
    obj = jit.emit_object(slotted, resolve("x86-avx512-vnni"), jit=True, speed_level=SLOTS_LEVEL)
    assert obj[:4] == b"\x7fELF"


def test_a_kernel_groups_level_is_its_first_marked_members():
    def head(attrs: str) -> str:
        return f'define void @"k0_X"() {attrs}\n{{\n}}'
    assert _level([("k0_X", head(""))]) == FULL_LEVEL
    assert _level([("k0_X", head(SLOTS_ATTR)), ("k0_X_mk", head(""))]) == SLOTS_LEVEL
    assert _level([("k0_X", head(SLOTS_ATTR)), ("k0_X_mk", head(LIGHT_ATTR))]) == LIGHT_LEVEL


def test_code_does_not_depend_on_how_kernels_are_batched_or_who_compiles_them(monkeypatch):
    graph = _conv_graph()
    monkeypatch.setattr(stream, "MIN_PART_BYTES", 10**9)
    monkeypatch.setattr(stream, "MAX_PART_BYTES", 10**9)  # one module per level, compiled here and by the thread
    want = _run(compile_graph(graph, use_cache=False, jobs=1))
    monkeypatch.setattr(stream, "MAX_PART_BYTES", 0)  # a module per kernel group, shared among two helpers
    got = _run(compile_graph(graph, use_cache=False, jobs=3))
    for k, v in want.items():
        np.testing.assert_array_equal(got[k], v)


def test_a_submitted_module_is_compiled_apart_from_the_models():
    host = resolve("host")
    one = '; ModuleID = "t"\ndefine void @"f"() {\nentry:\n  ret void\n}\n'
    with KernelStream(host) as s:
        i = s.submit(LIGHT_LEVEL, one)
        obj = s.result(i)
        assert obj[:4] == b"\x7fELF" and b"\0f\0" in obj and s.seconds[i] > 0  # its symbol f in the string table
        lower(_conv_graph(convs=1), host, stream=s)
        objs = s.finish()
    assert i not in s.kernels and len(objs) == len(s.kernels) + 1



def _pointwise_chain(widths=(16, 24, 32, 40, 48)):
    """1x1 convs of distinct widths: a kernel group each, none sharing a helper."""
    rng = np.random.default_rng(0)
    gb = GraphBuilder("chain")
    h = gb.input("x", TensorType(DType.F32, (1, widths[0], 8, 8)))
    for i, (c, oc) in enumerate(zip(widths, widths[1:])):
        w = gb.constant((rng.standard_normal((oc, c, 1, 1)) * 0.2).astype(np.float32), f"w{i}")
        h = gb.add1("Relu", [gb.add1("Conv", [h, w], strides=(1, 1), pads=(0, 0, 0, 0), dilations=(1, 1), group=1)])
    return gb.build([h])


def _builds(targets, monkeypatch, reuse=None) -> list[tuple[list[bytes], KernelStream, int]]:
    """Per target: the objects, the stream and the modules LLVM compiled of a build of ``_pointwise_chain``,
    the builds sharing ``reuse``."""
    emit, out = jit.emit_object, []
    monkeypatch.setattr(stream, "MIN_PART_BYTES", 1)  # a module per kernel group
    for target in targets:
        compiled = []
        monkeypatch.setattr(jit, "emit_object", lambda *a, **k: compiled.append(a) or emit(*a, **k))
        with KernelStream(target, reuse=reuse) as s:
            lower(_pointwise_chain(), target, stream=s)
            out.append((s.finish(), s, len(compiled)))
    return out


def test_a_plan_built_again_compiles_only_the_modules_it_changed(monkeypatch):
    """The split check's next plan changes some layers: the others' kernels print the same text under the same
    names, and their objects, made by the build before, serve again; the code is what a fresh build makes."""
    host = resolve("host")
    geom = (1, 24, 8, 8, 32, 1, 1, (1, 1), (0, 0, 0, 0), (1, 1), 1)  # the chain's second conv
    other = with_choices(host, {geom: conv_candidates(host, geom)[1]})  # one layer's method changed
    (first, s1, n1), (same, s2, n2), (changed, s3, n3) = _builds([host, host, other], monkeypatch, stream.Reuse())
    assert len(s1.kernels) == 4 and s1.reused == 0 and n1 == 5  # a module per conv, and the entry
    assert same == first and s2.reused == 4 and n2 == 1  # all again: only the entry is compiled
    assert s3.reused == 3 and n3 == 2  # the changed conv's module and the entry
    ((fresh, _, _),) = _builds([other], monkeypatch)
    assert changed == fresh


def test_with_a_helper_process_no_module_is_compiled_in_this_one(monkeypatch):
    """LLVM run in the compiling process faults in ~30 MiB of its code: with a helper, all of it goes there."""
    host, here, emit = resolve("host"), [], jit.emit_object
    monkeypatch.setattr(jit, "emit_object", lambda *a, **k: here.append(a) or emit(*a, **k))
    one = '; ModuleID = "t"\ndefine void @"f"() {\nentry:\n  ret void\n}\n'
    with parallel.Helpers(1) as helpers, KernelStream(host, helpers) as s:
        i = s.submit(LIGHT_LEVEL, one)
        assert s.result(i)[:4] == b"\x7fELF"
        lower(_conv_graph(convs=2), host, stream=s)
        objs = s.finish()
    assert here == [] and len(objs) == len(s.kernels) + 1 and all(o[:4] == b"\x7fELF" for o in objs)
    assert all(type(o) is bytes for o in objs + [s.result(i)])  # read into mappings, handed out as bytes


def _tail_objects(monkeypatch, tail_min_s: float, cpus: int = 8) -> tuple[list[bytes], int]:
    """The objects of a streamed compile with one helper, and how many helpers it had at its end."""
    host = resolve("host")
    monkeypatch.setattr(stream, "MIN_PART_BYTES", 1)  # a module per kernel group: a queue left when lowering ends
    monkeypatch.setattr(stream, "TAIL_MIN_S", tail_min_s)
    monkeypatch.setattr(stream, "workers", lambda: cpus)
    one = '; ModuleID = "t"\ndefine void @"f"() {\nentry:\n  ret void\n}\n'
    with parallel.Helpers(1) as helpers, KernelStream(host, helpers) as s:
        s.result(s.submit(LIGHT_LEVEL, one))  # one done: the stream's rate
        lower(_pointwise_chain(), host, stream=s)
        return s.finish(), len(helpers.procs)


def test_a_helper_more_drains_the_queue_once_lowering_ends_and_the_objects_stay_the_same(monkeypatch):
    """When lowering ends this process only waits: a queue worth ``TAIL_MIN_S`` of LLVM gets a second
    helper (MobileNetV3-ish at 2 threads on a Xeon: the wait 1.21 -> 0.59-0.67 s), never one beyond the CPUs."""
    alone, helpers = _tail_objects(monkeypatch, 1e9)
    assert helpers == 1
    tail, helpers = _tail_objects(monkeypatch, 0.0)
    assert helpers == 2 and tail == alone and len(tail) == 5
    assert _tail_objects(monkeypatch, 0.0, cpus=1)[1] == 1


def test_one_plan_gives_the_same_objects_however_busy_the_consumers_are(monkeypatch):
    """Batches close on size alone: a consumer kept busy (by the tuner's candidates, another
    process) must not change how kernels are split into objects, so equal plans run equal code."""
    host, emit, gate = resolve("host"), jit.emit_object, threading.Event()
    monkeypatch.setattr(stream, "MIN_PART_BYTES", 1)  # every kernel group closes its batch

    def held(text, target, jit, speed_level):  # the consumer thread waits until lowering has ended
        if threading.current_thread() is not threading.main_thread():
            gate.wait(30)
        return emit(text, target, jit=jit, speed_level=speed_level)

    def objects() -> list[bytes]:
        with KernelStream(host) as s:
            lower(_pointwise_chain(), host, stream=s)
            gate.set()
            return s.finish()

    free = objects()
    gate.clear()
    monkeypatch.setattr(jit, "emit_object", held)
    assert objects() == free and len(free) == 5  # the entry's and one per conv


def _looping_kernel(module: ir.Module) -> weakref.ref:
    """``k0_Loop(n)``: a counted loop (its phi and the add feeding it back: a reference cycle); a weak
    reference to the phi."""
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.IntType(64)]), "k0_Loop")
    entry, loop, done = (fn.append_basic_block(n) for n in ("entry", "loop", "done"))
    b = ir.IRBuilder(entry)
    b.branch(loop)
    b.position_at_end(loop)
    i = b.phi(ir.IntType(64))
    nxt = b.add(i, ir.Constant(ir.IntType(64), 1))
    i.add_incoming(ir.Constant(ir.IntType(64), 0), entry)
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, fn.args[0]), loop, done)
    b.position_at_end(done)
    b.ret_void()
    return weakref.ref(i)


def test_a_streamed_kernels_body_is_freed_with_the_collector_off():
    """The lowering turns the cyclic collector off; a kernel's body, printed and dropped, goes at once."""
    host = resolve("host")
    module = ir.Module("m")
    module.triple = host.triple
    phi = _looping_kernel(module)
    was = gc.isenabled()
    gc.disable()
    try:
        with KernelStream(host) as s:
            s(module)
            assert phi() is None and "k0_Loop" in s.batch[FULL_LEVEL][0][1]
    finally:
        if was:
            gc.enable()


def _chain(length: int):
    """x -> Add -> Mul -> Add ... with a constant each: one kernel call per node from the entry."""
    from cuvil.compiler import N, Node, infer_graph_types

    consts = {f"c{i}": np.full((1, 16), 1.0 + i / 64, np.float32) for i in range(length)}
    nodes = [Node.make("Add" if i % 2 else "Mul", ["x" if i == 0 else f"t{i - 1}", f"c{i}"], [f"t{i}"])
             for i in range(length)]
    return infer_graph_types("chain", {"x": TensorType(DType.F32, (N, 16))}, consts, nodes, [f"t{length - 1}"])


def test_the_entrys_calls_are_printed_and_let_go_node_by_node(monkeypatch):
    """The entry point gains calls node after node: each stream call prints them and empties its block,
    and the entry's text is the one printed whole from the module lowered without a stream."""
    graph, target = _chain(40), resolve("host")
    held, call = [], KernelStream.__call__

    def spy(self, module):
        call(self, module)
        held.append(sum(len(blk.instructions) for n in self.entry for blk in module.globals[n].blocks
                        if len(module.globals[n].blocks) == 1))

    monkeypatch.setattr(KernelStream, "__call__", spy)
    _, entry_module, _, lowered = _streamed(graph, "host", monkeypatch, optimize=False)
    assert len(held) > 40 and max(held) == 0

    def define(text: str) -> str:
        return re.search(rf'^define [^@]*@"{lowered.entry}"\(.*?^}}$', text, re.M | re.S).group(0)

    whole = lower(graph, target, optimize=False).llvm_ir
    assert define(entry_module) == define(whole) and define(whole).count("call ") >= 40


def test_the_pages_of_freed_weights_go_back_every_few_nodes(monkeypatch):
    calls = []
    monkeypatch.setattr(stream.heap, "release", lambda: calls.append(1))
    with KernelStream(resolve("host")) as s:
        lower(_chain(40), resolve("host"), optimize=False, stream=s)
        s.finish()
    assert len(calls) == 41 // stream.RELEASE_EVERY  # 40 nodes, then the end of lowering


def test_a_jobs_part_kernels_are_printed_one_by_one(monkeypatch):
    """A job runs a part of each of several split layers; each part's kernel is printed and let go as
    soon as it is emitted, so one kernel's IR is held at a time, not the job's (MobileNetV3-ish: a job of
    four part kernels held 8,390 instructions; its cold peak at 2 threads 67-68 -> 64 MiB)."""
    import dataclasses

    host = resolve("host")
    target = dataclasses.replace(host, threads=2, tuning=host.tuning.replace(
        parallel_sync_ratio=0.0, split_min_reuse=0, parallel_sync_us=0.0))
    pending, call = [], KernelStream.__call__

    def spy(self, module):
        groups = {m.group(1) for n in list(module.globals)[self.seen:]
                  if (m := stream._GROUP.match(n)) and module.globals[n].blocks}
        pending.append(len(groups))
        call(self, module)

    monkeypatch.setattr(KernelStream, "__call__", spy)
    rng = np.random.default_rng(0)
    gb = GraphBuilder("widths")
    h = gb.input("x", TensorType(DType.F32, (1, 16, 16, 16)))
    for i, (c, oc) in enumerate([(16, 24), (24, 32), (32, 40), (40, 48)]):  # a kernel of its own each
        w = gb.constant((rng.standard_normal((oc, c, 3, 3)) * 0.1).astype(np.float32), f"w{i}")
        h = gb.add1("Relu", [gb.add1("Conv", [h, w], strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1), group=1)])
    with KernelStream(target) as s:
        lowered = lower(gb.build([h]), target, stream=s)
        s.finish()
    assert lowered.split_nodes == 4
    assert max(pending) == 1 and sum(pending) >= 4  # each layer's part kernel printed on its own


def test_a_batch_kept_open_for_a_helper_closes_before_a_group_that_shares_none(monkeypatch):
    """A kernel group that calls a shared helper keeps its batch open for the next that calls it too (a split
    layer's parts, Winograd convs of one geometry); the first group calling none of the batch's helpers closes
    it, and a batch's size counts the helpers it takes along, which are most of a split conv's code."""
    from cuvil.compiler.codegen.irhelpers import PREVECTORIZED, set_fn_attrs

    monkeypatch.setattr(stream, "MIN_PART_BYTES", 2_000)
    monkeypatch.setattr(stream, "MAX_PART_BYTES", 10**9)
    module, void = ir.Module(name="m"), ir.FunctionType(ir.VoidType(), [])
    submitted = []

    def helper(name: str, adds: int) -> ir.Function:
        fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.IntType(64)]), name)
        fn.linkage = "internal"
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        v = fn.args[0]
        for _ in range(adds):  # ~40 bytes of text each
            v = b.add(v, v)
        b.ret_void()
        return fn

    def group(tag: str, calls: ir.Function | None) -> None:
        fn = ir.Function(module, void, f"k{tag}_Conv")
        set_fn_attrs(fn, strings={PREVECTORIZED: "true"})
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        if calls is not None:
            b.call(calls, [ir.Constant(ir.IntType(64), 1)])
        b.ret_void()

    with KernelStream(resolve("x86-avx2")) as s:
        monkeypatch.setattr(s, "submit", lambda level, text, reusable=False: submitted.append("\n".join(text)) or 0)
        body = helper("conv_part_a", 100)  # one layer's code, over the minimum with its callers
        group("a0", body)
        s(module)
        group("a1", body)  # the layer's second part: in the same module
        s(module)
        assert submitted == []
        group("b0", helper("conv_part_b", 10))  # shares nothing: the batch of a0, a1 closes first
        s(module)
        assert len(submitted) == 1
        assert set(re.findall(r'^define [^@]*@"([^"]+)"', submitted[0], re.M)) == {"ka0_Conv", "ka1_Conv", "conv_part_a"}
        group("c0", None)  # calls nothing, and its batch (b0 and its helper) is under the minimum: stays open
        s(module)
        assert len(submitted) == 1
