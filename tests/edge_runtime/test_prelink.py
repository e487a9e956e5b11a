"""Prelinked images: the linked bytes but for the values a load completes (base, symbols), W^X; an image
that does not hold together is a miss, one that needs a symbol this process lacks is linked again. That
they compute the same bits as the other loaders on the zoo: ``test_objload.py``."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import platform

import numpy as np
import pytest
from cuvil.edge_runtime import compile as compile_mod
from cuvil.edge_runtime import jit, objload, prelink
from cuvil.edge_runtime.artifact import ArtifactError, FORMAT, read_artifact, write_artifact
from cuvil.edge_runtime.cache import CompileCache, finish_writes
from cuvil.edge_runtime.compile import compile_graph, resolve
from cuvil.edge_runtime.sealed import Sealer
from cuvil.edge_runtime.session import CompileStats, Session

from .test_objload import _IR, _with_kind, zoo_objects  # noqa: F401 - zoo_objects is a fixture
from .test_session import mlp_graph

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64",
                                reason="Cuvil's own loader links x86-64 objects; other hosts load with llvmlite")


def _maps_of(lo: int, hi: int) -> set[str]:
    with open("/proc/self/maps") as f:
        rows = [line.split() for line in f]
    spans = [(int(a, 16), int(b, 16), perm) for (a, b), perm in ((r[0].split("-"), r[1]) for r in rows)]
    return {perm[:3] for a, b, perm in spans if a < hi and b > lo}


def test_a_prelinked_image_differs_from_a_linked_one_only_where_it_was_completed(zoo_objects):
    """At each fixup, the base (or the symbol) added; every other byte as the loader links it."""
    lowered, _, objs, _ = zoo_objects["small_cnn"]
    image = prelink.prelink(objs, lowered.entry)
    assert image.fixups
    a = prelink.load_prelinked(image, lowered.entry)
    b, _ = objload.load(objs, objload.entry_names(lowered.entry))
    ra, rb = bytes(a.keep.map), bytes(b.map)
    done = set()
    for at, name in image.fixups:
        va, vb = (int.from_bytes(r[at:at + 8], "little") for r in (ra, rb))
        assert (va == vb == objload.process_symbol(name)) if name else va - a.keep.base == vb - b.base
        done.update(range(at, at + 8))
    assert all(x == y for i, (x, y) in enumerate(zip(ra, rb)) if i not in done)
    assert _maps_of(a.keep.base, a.keep.base + a.keep.size) >= {"r-x", "r--"}
    assert not any("w" in p and "x" in p for p in _maps_of(a.keep.base, a.keep.base + a.keep.size))


def test_small_code_model_objects_prelink_through_their_got():
    """PC-relative code, calls to libc through stubs and the GOT: only the GOT slots are completed."""
    obj = jit.emit_object(_IR, resolve("host"))  # pic, small code model
    image = prelink.prelink([obj], "f")
    assert {name for _, name in image.fixups} >= {"expf", ""}
    got_at, got_size = image.regions[1]  # the GOT lies among the read-only data
    assert all(got_at <= at < got_at + got_size for at, _ in image.fixups)
    code, (f, *_) = prelink.load_image(image)  # code: keeps the image mapped while f runs
    fn = ctypes.CFUNCTYPE(ctypes.c_float, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64)(f)
    buf = (ctypes.c_uint8 * 8)()
    assert fn(ctypes.addressof(buf), 8, 3) == pytest.approx(np.exp(4.0), rel=1e-6)
    assert bytes(buf) == b"\x07" * 8 and code.size == image.size


def test_an_absolute_32_bit_address_in_the_image_is_not_prelinked(zoo_objects):
    lowered, _, objs, _ = zoo_objects["mlp"]
    bad = [_with_kind(o, objload.R_32S) for o in objs]  # the large code model's R_64 become 32-bit absolutes
    with pytest.raises(objload.UnsupportedObjectError, match="cannot be prelinked"):
        prelink.prelink(bad, lowered.entry)


@pytest.mark.parametrize("change", [
    lambda p: dataclasses.replace(p, size=p.size + 1),
    lambda p: dataclasses.replace(p, data=p.data + bytes(p.size)),
    lambda p: dataclasses.replace(p, regions=p.regions[:2]),
    lambda p: dataclasses.replace(p, regions=((4096, p.regions[0][1]), *p.regions[1:])),
    lambda p: dataclasses.replace(p, fixups=((p.size - 4, ""),)),
    lambda p: dataclasses.replace(p, fixups=((0, 7),)),
    lambda p: dataclasses.replace(p, entries=(p.regions[0][1],)),
])
def test_an_image_whose_layout_does_not_hold_is_refused(zoo_objects, change):
    lowered, _, objs, _ = zoo_objects["mlp"]
    image = prelink.prelink(objs, lowered.entry)
    with pytest.raises(prelink.PrelinkError):
        change(image).check()


def _rewrite_meta(sealer, path, name, edit):
    """The entry at ``path`` sealed anew (as a faulty writer with the secret would) with its meta edited."""
    opened = sealer.open(path, name)
    meta = json.loads(opened.meta)
    edit(meta)
    sealer.write(path, name, json.dumps(meta).encode(), [opened.body], opened.tail.result())


@pytest.mark.parametrize("edit", [
    lambda m: m["image"]["fixups"].append([m["image"]["size"], ""]),  # past the image
    lambda m: m["image"].update(bytes=m["image"]["bytes"] + 1),  # lengths do not add up
    lambda m: m["image"].update(entries=["0"]),
    lambda m: m["image"].update(regions=[[0, 4096]]),
])
def test_a_sealed_entry_with_an_inconsistent_image_is_a_miss(tmp_path, edit):
    target = resolve("host")
    graph = mlp_graph()
    sess = compile_graph(graph, cache_dir=tmp_path, tune=False)
    finish_writes()
    (path,) = tmp_path.glob(f"*{CompileCache.SUFFIX}")
    sealer, name = CompileCache(tmp_path).sealer, path.name[:-len(CompileCache.SUFFIX)]
    assert read_artifact(sealer, path, name, target).objects  # a good entry, with its image
    _rewrite_meta(sealer, path, name, edit)
    with pytest.raises(ArtifactError):
        read_artifact(sealer, path, name, target)
    again = compile_graph(graph, cache_dir=tmp_path, tune=False)
    assert not again.stats.cache_hit  # compiled again, the same results
    x = {"x": np.linspace(-1, 1, 37, dtype=np.float32)[None]}
    assert again.run(x)[sess.output_names[0]].tobytes() == sess.run(x)[sess.output_names[0]].tobytes()


def test_a_warm_start_loads_the_prelinked_image_and_never_links(tmp_path, monkeypatch):
    graph = mlp_graph()
    cold = compile_graph(graph, cache_dir=tmp_path, tune=False)
    monkeypatch.setattr(compile_mod, "load_object", lambda *a, **k: pytest.fail("linked on a warm start"))
    warm = compile_graph(graph, cache_dir=tmp_path, tune=False)
    assert warm.stats.cache_hit
    x = {"x": np.linspace(-1, 1, 37, dtype=np.float32)[None]}
    assert warm.run(x)[warm.output_names[0]].tobytes() == cold.run(x)[cold.output_names[0]].tobytes()


def test_an_image_calling_what_this_process_lacks_is_linked_from_its_objects(zoo_objects, monkeypatch):
    lowered, weights, objs, inputs = zoo_objects["mlp"]
    image = prelink.prelink(objs, lowered.entry)
    missing = dataclasses.replace(image, fixups=(*image.fixups, (0, "no_such_symbol_in_any_libc")))
    with pytest.raises(objload.UnsupportedObjectError, match="no_such_symbol"):
        prelink.load_prelinked(missing, lowered.entry)
    linked = []
    real = compile_mod.load_object
    monkeypatch.setattr(compile_mod, "load_object", lambda *a, **k: linked.append(1) or real(*a, **k))
    code = compile_mod.load_code(objs, lowered.entry, resolve("host"), missing)
    assert linked and code.address
    stats = CompileStats(0.0, 0.0, 0.0, True, lowered.kernel_count, lowered.node_count, 0)
    feeds = {s.name: x for s, x in zip(lowered.inputs, inputs)}
    assert Session(lowered, code, stats, weights=weights).run(feeds)


def test_entries_of_objects_that_cannot_be_parsed_keep_no_image(tmp_path):
    target = resolve("host")
    sealer = Sealer(bytes(range(32)))
    from cuvil.compiler.codegen.lower import lower

    write_artifact(sealer, tmp_path / "a", "a", lower(mlp_graph(), target), [b"\x7fELF not an object"])
    assert json.loads(sealer.open(tmp_path / "a", "a").meta)["format"] == FORMAT
    opened = read_artifact(sealer, tmp_path / "a", "a", target)
    assert opened.objects == [b"\x7fELF not an object"]
