"""Cuvil's own object loader: the same bits as llvmlite's MCJIT on every zoo model, W^X pages,
the small-code-model relocations (GOT, call stubs), typed errors on anything unknown or damaged."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from cuvil.compiler.errors import CompileError
from cuvil.compiler.frontends.torch import import_torch
from cuvil.edge_runtime import compile as compile_mod
from cuvil.edge_runtime import elf, jit, objload, prelink
from cuvil.edge_runtime.compile import compile_graph, resolve
from cuvil.edge_runtime.session import CompileStats, Session

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="Cuvil's own loader links x86-64 objects; other hosts load with llvmlite")

_IR = """
@table = internal constant [4 x float] [float 1.0, float 2.0, float 3.0, float 4.0], align 16
@count = global i64 0
declare float @expf(float)
declare void @llvm.memset.p0i8.i64(i8*, i8, i64, i1)
define float @f(i8* %buf, i64 %n, i64 %i) {
  call void @llvm.memset.p0i8.i64(i8* %buf, i8 7, i64 %n, i1 false)
  %p = getelementptr [4 x float], [4 x float]* @table, i64 0, i64 %i
  %x = load volatile float, float* %p
  %e = call float @expf(float %x)
  %c = load i64, i64* @count
  %c1 = add i64 %c, 1
  store i64 %c1, i64* @count
  ret float %e
}
"""


def _kinds(obj: bytes) -> set[int]:
    return {r.kind for _, relocs in elf.read_object(obj).relocations for r in relocs}


@pytest.fixture(scope="module")
def zoo_objects():
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    from tests.zoo import ZOO

    out = {}
    real = compile_mod.load_code
    for name in ("mlp", "small_cnn", "tiny_transformer"):
        model, example = ZOO[name]()
        got = []
        compile_mod.load_code = lambda objs, entry, target: got.append(objs) or real(objs, entry, target)
        try:
            sess = compile_graph(import_torch(model, example), use_cache=False)
        finally:
            compile_mod.load_code = real
        out[name] = (sess.lowered, sess._weights, got[0], [t.numpy() for t in example])
    return out


@pytest.mark.parametrize("name", ["mlp", "small_cnn", "tiny_transformer"])
def test_zoo_model_gives_the_same_bits_with_every_loader(zoo_objects, name):
    """Linked here, prelinked (:mod:`.prelink`, what a warm start loads) and by llvmlite's MCJIT."""
    lowered, weights, objs, inputs = zoo_objects[name]
    stats = CompileStats(0.0, 0.0, 0.0, False, lowered.kernel_count, lowered.node_count, 0)
    feeds = {s.name: x for s, x in zip(lowered.inputs, inputs)}
    ours = Session(lowered, objload.load_object(objs, lowered.entry), stats, weights=weights).run(feeds)
    for code in (prelink.load_prelinked(prelink.prelink(objs, lowered.entry), lowered.entry),
                 jit.load_object(objs, lowered.entry, resolve("host"))):
        theirs = Session(lowered, code, stats, weights=weights).run(feeds)
        assert ours.keys() == theirs.keys()
        for k in ours:
            assert ours[k].tobytes() == theirs[k].tobytes(), k


def test_code_pages_are_never_writable_and_executable(zoo_objects):
    lowered, _, objs, _ = zoo_objects["small_cnn"]
    code = objload.load_object(objs, lowered.entry)
    lo, hi = code.keep.base, code.keep.base + code.keep.size
    with open("/proc/self/maps") as f:
        rows = [line.split() for line in f]
    mine = [(int(a, 16), int(b, 16), perm) for (a, b), perm in ((r[0].split("-"), r[1]) for r in rows)]
    perms = {perm[:3] for a, b, perm in mine if a < hi and b > lo}
    assert "r-x" in perms and "r--" in perms and not any("w" in p and "x" in p for p in perms), perms


def test_a_forked_childs_writes_to_the_image_stay_its_own():
    """The code's globals (a threaded session's pool state) live in the image: a child that forgets its
    parent's workers must not clear them in the parent, whose stop would then join garbage."""
    image = objload.Image(objload._PAGE)
    image.map[0:4] = b"\x01\x02\x03\x04"
    pid = os.fork()
    if pid == 0:
        image.map[0:4] = b"\x00\x00\x00\x00"
        os._exit(0)
    os.waitpid(pid, 0)
    assert image.map[0:4] == b"\x01\x02\x03\x04"


def test_small_code_model_relocations_resolve_through_got_and_stubs():
    """A position-independent small-model object (PC32, PLT32 to libc through a stub, GOTPCREL) links and runs."""
    obj = jit.emit_object(_IR, resolve("host"))  # pic, small code model
    assert _kinds(obj) & objload.GOT_RELATIVE and objload.R_PLT32 in _kinds(obj)
    image, (f, count) = objload.load([obj], ["f", "count"])
    import ctypes

    buf = (ctypes.c_uint8 * 24)()
    fn = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(f)
    assert fn(ctypes.addressof(buf), 24, 2) == pytest.approx(np.exp(3.0), rel=1e-6)  # libm's expf of table[2]
    assert fn(ctypes.addressof(buf), 24, 0) == pytest.approx(np.exp(1.0), rel=1e-6)
    assert bytes(buf) == b"\x07" * 24 and ctypes.c_int64.from_address(count).value == 2
    assert image.size >= 3 * os.sysconf("SC_PAGE_SIZE")


def _with_kind(obj: bytes, kind: int) -> bytes:
    """``obj`` with its first relocation's type replaced (as it is when it has none)."""
    head = elf.EHDR.unpack_from(obj)
    shoff, shnum = head[6], head[12]
    for i in range(shnum):
        sh = elf.SHDR.unpack_from(obj, shoff + i * elf.SHDR.size)
        if sh[1] == elf.SHT_RELA and sh[5]:
            out = bytearray(obj)
            out[sh[4] + 8:sh[4] + 12] = kind.to_bytes(4, "little")
            return bytes(out)
    return obj


def test_an_unknown_relocation_is_a_typed_error_and_compile_falls_back_to_llvmlite(zoo_objects):
    lowered, _, objs, _ = zoo_objects["mlp"]
    bad = [_with_kind(o, 37) for o in objs]  # R_X86_64_IRELATIVE: never in LLVM's relocatable output
    assert bad != objs
    with pytest.raises(objload.UnsupportedObjectError, match="relocation type 37"):
        objload.load_object(bad, lowered.entry)
    called = []
    real = jit.load_object
    jit.load_object = lambda *a: called.append(a) or real(objs, lowered.entry, resolve("host"))
    try:
        compile_mod.load_code(bad, lowered.entry, resolve("host"))
    finally:
        jit.load_object = real
    assert called


def test_damaged_objects_raise_typed_errors_never_crash(zoo_objects):
    """Truncations and byte flips everywhere (headers, tables, relocations): a CompileError or a clean load."""
    _, _, objs, _ = zoo_objects["small_cnn"]
    obj = max(objs, key=len)
    rng = np.random.default_rng(0)
    cases = [obj[:n] for n in (0, 16, 63, 64, len(obj) // 2, len(obj) - 1)]
    for _ in range(300):
        bad = bytearray(obj)
        for at in rng.integers(0, len(obj), int(rng.integers(1, 8))):
            bad[at] = int(rng.integers(0, 256))
        cases.append(bytes(bad))
    head = elf.EHDR.unpack_from(obj)
    table = head[6]
    for at in range(table, len(obj), 7):  # every section header field, in turn
        bad = bytearray(obj)
        bad[at] ^= 0xFF
        cases.append(bytes(bad))
    loaded = 0
    for bad in cases:
        try:
            objload.load([bad], ["main"])
            loaded += 1
        except CompileError:
            pass
    assert loaded < len(cases)


def test_warm_start_never_imports_llvmlite(tmp_path):
    """A cache hit in a fresh process loads the code with Cuvil's loader: llvmlite is not imported."""
    child = textwrap.dedent("""
        import sys
        import numpy as np
        from cuvil.compiler import parse_graph
        from cuvil.edge_runtime.compile import compile_graph
        graph = parse_graph(open(sys.argv[1]).read())
        sess = compile_graph(graph, cache_dir=sys.argv[2], tune=False)
        sess.run({"x": np.ones((1, 37), np.float32)})
        print(int(sess.stats.cache_hit), sorted(m for m in sys.modules if m.startswith("llvmlite")))
    """)
    from cuvil.compiler import print_graph

    from .test_session import mlp_graph

    text = tmp_path / "g.txt"
    text.write_text(print_graph(mlp_graph()))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    runs = [subprocess.run([sys.executable, "-c", child, str(text), str(tmp_path / "cache")], capture_output=True,
                           text=True, env=env, timeout=120) for _ in range(2)]  # cold (the suite's tuning differs), warm
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr[-2000:]
    assert runs[0].stdout.startswith("0 ['llvmlite', ")  # the test can fail: a cold compile imports it
    assert runs[1].stdout.split(None, 1) == ["1", "[]\n"]
