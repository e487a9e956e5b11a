"""The compiled-artifact cache: a hit never lowers, a damaged entry is a miss, outputs never change."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from cuvil.compiler.codegen.lower import lower
from cuvil.compiler.errors import InterpreterError
from cuvil.edge_runtime import compile as compile_mod
from cuvil.edge_runtime.artifact import ArtifactError, read_artifact, write_artifact
from cuvil.edge_runtime import cache as cache_mod
from cuvil.edge_runtime.cache import CompileCache, compiler_fingerprint
from cuvil.edge_runtime.host_memo import HOST_FILE
from cuvil.edge_runtime.sealed import PAGE, Sealer, SealError
from cuvil.edge_runtime.compile import compile_graph, resolve

from .test_session import _check, mlp_graph

X = {"x": np.random.default_rng(7).standard_normal((1, 37), dtype=np.float32)}


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "cache"


def _entry(cache_dir):
    cache_mod.finish_writes()  # a cold compile writes its entry behind its caller
    (entry,) = [p for p in cache_dir.iterdir() if p.suffix == CompileCache.SUFFIX]
    return entry


def _read(entry):
    """The entry as the cache reads it: under this device's secret, named by its key (the file's stem)."""
    return read_artifact(CompileCache(entry.parent).sealer, entry, entry.name.split(".")[0], resolve("host"))


def _forbid(monkeypatch, *names):
    """Make each of ``names`` raise where the compile path finds it (lowering and LLVM are imported on a miss)."""
    from cuvil.compiler.codegen import lower as lower_mod
    from cuvil.edge_runtime import stream

    def boom(*args, **kwargs):
        raise AssertionError("called on the warm path")

    for name in names:
        monkeypatch.setattr({"lower": lower_mod, "KernelStream": stream}.get(name, compile_mod), name, boom)


def test_hit_skips_lowering_llvm_and_graph_hashing(cache_dir, monkeypatch):
    graph = mlp_graph()
    cold = compile_graph(graph, cache_dir=cache_dir, content_hash="ab" * 32)
    want = cold.run(X)
    _forbid(monkeypatch, "lower", "KernelStream", "graph_digest")
    warm = compile_graph(graph, cache_dir=cache_dir, content_hash="ab" * 32)
    assert warm.stats.cache_hit and warm.stats.lower_ms == 0 and warm.stats.llvm_ms == 0
    for name, value in warm.run(X).items():
        np.testing.assert_array_equal(value, want[name])
    assert warm.memory_plan == cold.memory_plan
    assert warm.lowered.inputs == cold.lowered.inputs and warm.lowered.outputs == cold.lowered.outputs
    assert (warm.stats.kernel_count, warm.stats.node_count, warm.stats.object_bytes) == \
        (cold.stats.kernel_count, cold.stats.node_count, cold.stats.object_bytes)


def test_bare_graph_hit_skips_lowering(cache_dir, monkeypatch):
    graph = mlp_graph()
    compile_graph(graph, cache_dir=cache_dir)
    _forbid(monkeypatch, "lower", "KernelStream")
    assert compile_graph(graph, cache_dir=cache_dir).stats.cache_hit


def test_profile_session_round_trips(cache_dir):
    graph = mlp_graph()
    cold = compile_graph(graph, cache_dir=cache_dir, profile=True)
    warm = compile_graph(graph, cache_dir=cache_dir, profile=True)
    assert warm.stats.cache_hit
    assert warm.lowered.profile_nodes == cold.lowered.profile_nodes and warm.lowered.profile_offset == cold.lowered.profile_offset
    assert abs(sum(warm.profile(runs=3).values()) - 1) < 1e-6
    cycles = warm.node_cycles(runs=3)
    assert list(cycles) == list(warm.lowered.profile_nodes) and all(c > 0 for c in cycles.values())
    x = np.ones((1, 37), np.float32)
    assert list(warm.node_cycles(2, {"x": x})) == list(cycles)  # inputs copied in before each run, as run does
    with pytest.raises(InterpreterError, match="missing input 'x'"):
        warm.node_cycles(2, {})
    with pytest.raises(InterpreterError, match="x"):
        warm.node_cycles(2, {"x": np.ones((2, 37), np.float32)})
    with pytest.raises(ValueError, match="profile=True"):
        compile_graph(graph, cache_dir=cache_dir).node_cycles()


def test_a_cold_compile_hands_over_its_session_before_its_entry_is_written(cache_dir, monkeypatch):
    """The entry is written on a thread of its own: the session runs while that write is held up, and
    the next compile in this process waits for the entry and loads it."""
    graph, release, real_put = mlp_graph(), threading.Event(), CompileCache.put

    def held_put(self, *args):
        assert release.wait(60)
        real_put(self, *args)

    monkeypatch.setattr(CompileCache, "put", held_put)
    session = compile_graph(graph, cache_dir=cache_dir)
    assert not list(cache_dir.glob(f"*{CompileCache.SUFFIX}"))
    _check(graph, X, session)
    release.set()
    assert compile_graph(graph, cache_dir=cache_dir).stats.cache_hit


def test_a_warm_start_waits_only_for_its_own_entry(cache_dir, monkeypatch):
    """Another model's entry still being written holds up no warm start of this one; finish_writes()
    waits for every entry, as before a cache directory is deleted."""
    a, b = mlp_graph(0), mlp_graph(1)
    compile_graph(a, cache_dir=cache_dir)
    release, real_put = threading.Event(), CompileCache.put

    def held_put(self, *args):
        assert release.wait(60)
        real_put(self, *args)

    monkeypatch.setattr(CompileCache, "put", held_put)
    compile_graph(b, cache_dir=cache_dir)  # its entry waits for the release
    assert compile_graph(a, cache_dir=cache_dir).stats.cache_hit
    assert any(t.name == "cuvil-cache-write" and t.is_alive() for t in threading.enumerate())
    release.set()
    cache_mod.finish_writes()
    assert not any(t.name == "cuvil-cache-write" for t in threading.enumerate())
    assert len(list(cache_dir.glob(f"*{CompileCache.SUFFIX}"))) == 2


def test_finish_writes_on_another_thread_waits_for_a_writer_being_started(cache_dir, monkeypatch):
    """finish_writes() runs while a cold compile hands its entry to the writer thread: it waits for that
    entry, never meeting a writer registered but not yet started (whose join() would raise)."""
    real, starting, outcome = threading.Thread, threading.Event(), []

    class SlowStart(real):  # the moment between a writer's creation and its start, widened
        def start(self):
            if self.name == "cuvil-cache-write":
                starting.set()
                time.sleep(0.3)
            super().start()

    def finish() -> None:
        assert starting.wait(60)
        try:
            cache_mod.finish_writes()
            outcome.append(len(list(cache_dir.glob(f"*{CompileCache.SUFFIX}"))))
        except RuntimeError as e:
            outcome.append(e)

    monkeypatch.setattr(cache_mod.threading, "Thread", SlowStart)
    finisher = real(target=finish)
    finisher.start()
    compile_graph(mlp_graph(), cache_dir=cache_dir)
    finisher.join(60)
    assert outcome == [1]  # no RuntimeError, and the entry was there when finish_writes returned


def test_a_forked_child_waits_for_none_of_its_parents_writes(cache_dir, monkeypatch):
    """The writer stays in the parent, which finishes the entry; the child neither waits for it nor
    finds the writers' lock held by a thread the fork left behind."""
    release, real_put = threading.Event(), CompileCache.put

    def held_put(self, *args):
        assert release.wait(60)
        real_put(self, *args)

    monkeypatch.setattr(CompileCache, "put", held_put)
    compile_graph(mlp_graph(), cache_dir=cache_dir)
    holding, forked = threading.Event(), threading.Event()

    def hold() -> None:  # another thread holds the lock across the fork, as a writer registering itself may
        with cache_mod._writing_lock:
            holding.set()
            forked.wait(60)

    holder = threading.Thread(target=hold)
    holder.start()
    assert holding.wait(60)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        waiting = threading.Thread(target=cache_mod.finish_writes, daemon=True)
        waiting.start()
        waiting.join(5)
        os.write(write, b"0" if waiting.is_alive() or cache_mod._writing else b"1")
        os._exit(0)
    forked.set()
    holder.join()
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(pid, 0)
    release.set()
    cache_mod.finish_writes()
    assert got == b"1" and len(list(cache_dir.glob(f"*{CompileCache.SUFFIX}"))) == 1


def test_republished_entry_leaves_mapped_sessions_intact(cache_dir):
    """Writers replace entries whole (a new file, os.replace), never in place, so a session whose
    weights are mapped from the old file keeps its bytes while another writer publishes the key."""
    graph = mlp_graph()
    want = compile_graph(graph, cache_dir=cache_dir).run(X)
    warm = compile_graph(graph, cache_dir=cache_dir)
    assert warm.stats.cache_hit
    entry = _entry(cache_dir)
    before = entry.stat().st_ino
    objects = _read(entry).objects
    CompileCache(cache_dir).put(entry.name.split(".")[0], lower(graph, resolve("host")), objects)
    assert entry.stat().st_ino != before and sorted(p.name for p in cache_dir.iterdir()) == sorted(
        [entry.name, CompileCache.FINGERPRINT, HOST_FILE])
    for name, value in warm.run(X).items():
        np.testing.assert_array_equal(value, want[name])


def test_artifact_round_trip_maps_aligned_read_only_weights(tmp_path):
    target = resolve("host")
    lowered = lower(mlp_graph(), target)
    path = tmp_path / "a.cuvil-art"
    sealer = Sealer(bytes(range(32)))
    write_artifact(sealer, path, "a", lowered, [b"\x7fELF one", b"two"])
    art = read_artifact(sealer, path, "a", target)
    assert art.objects == [b"\x7fELF one", b"two"]
    assert art.weights.tobytes() == lowered.weights.tobytes() and not art.weights.flags.writeable
    assert art.weights.ctypes.data % 64 == 0 and path.stat().st_size % PAGE == 0
    assert art.lowered.plan == lowered.plan and art.lowered.entry == lowered.entry
    assert art.lowered.arena_bytes == lowered.arena_bytes and art.lowered.inputs == lowered.inputs


def _flip(offset_of):
    def damage(path):
        raw = bytearray(path.read_bytes())
        raw[offset_of(raw)] ^= 0x10
        path.write_bytes(bytes(raw))
    return damage


DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[:-100]),
    "cut_to_header": lambda p: p.write_bytes(p.read_bytes()[:30]),
    "empty": lambda p: p.write_bytes(b""),
    "extended": lambda p: p.write_bytes(p.read_bytes() + b"\0" * PAGE),
    "magic": _flip(lambda raw: 0),
    "meta": _flip(lambda raw: 60),
    "object": _flip(lambda raw: raw.index(b"\x7fELF") + 200),
    "weights": _flip(lambda raw: len(raw) - PAGE - 8),  # in the last page of the (padded) weights
    "garbage": lambda p: p.write_bytes(np.random.default_rng(0).bytes(p.stat().st_size)),
}


@pytest.mark.parametrize("how", sorted(DAMAGE))
def test_damaged_entry_is_a_miss_and_rewritten(cache_dir, how):
    graph = mlp_graph()
    want = compile_graph(graph, cache_dir=cache_dir).run(X)
    DAMAGE[how](_entry(cache_dir))
    with pytest.raises(SealError):
        _read(_entry(cache_dir))
    again = compile_graph(graph, cache_dir=cache_dir)
    assert not again.stats.cache_hit
    _check(graph, X, again)
    third = compile_graph(graph, cache_dir=cache_dir)
    assert third.stats.cache_hit  # rewritten whole
    for name, value in third.run(X).items():
        np.testing.assert_array_equal(value, want[name])


def test_weights_damage_is_caught(cache_dir):
    """The weight check covers every byte the kernels read, not only the padding."""
    graph = mlp_graph()
    compile_graph(graph, cache_dir=cache_dir)
    entry = _entry(cache_dir)
    art = _read(entry)
    start = entry.stat().st_size - (-(-len(art.weights) // PAGE) * PAGE)
    del art
    for where in (start, start + 1234):
        raw = bytearray(entry.read_bytes())
        raw[where] ^= 1
        entry.write_bytes(bytes(raw))
        with pytest.raises(SealError):
            _read(entry)
        raw[where] ^= 1
        entry.write_bytes(bytes(raw))
        _read(entry)


def test_zoo_model_cold_and_warm_outputs_identical(cache_dir):
    pytest.importorskip("torch")
    from cuvil.compiler.frontends.torch import import_torch

    from tests.zoo import ZOO

    model, example = ZOO["tiny_transformer"]()
    graph = import_torch(model, example)
    feeds = {n: t.numpy() for n, t in zip(graph.inputs, example)}
    cold = compile_graph(graph, cache_dir=cache_dir, content_hash="cd" * 32)
    warm = compile_graph(graph, cache_dir=cache_dir, content_hash="cd" * 32)
    assert not cold.stats.cache_hit and warm.stats.cache_hit
    a, b = cold.run(feeds), warm.run(feeds)
    for name in graph.outputs:
        np.testing.assert_array_equal(a[name], b[name])


def test_the_remembered_fingerprint_is_the_computed_one_and_follows_the_sources(cache_dir, monkeypatch):
    """The fingerprint is remembered sealed under the sources' stamp: a changed stamp or a damaged
    file is never believed, the fingerprint is computed again (and remembered anew)."""
    cache = CompileCache(cache_dir)
    want = compiler_fingerprint()
    assert cache.fingerprint() == want and (cache_dir / CompileCache.FINGERPRINT).is_file()
    monkeypatch.setattr(cache_mod, "compiler_fingerprint", lambda: "f" * 64)  # what a recomputation now gives
    assert cache.fingerprint() == want  # remembered: no source was read
    monkeypatch.setattr(cache_mod, "source_stamp", lambda: "a source changed")
    assert cache.fingerprint() == "f" * 64  # the seal names the old stamp: computed again, remembered
    assert CompileCache(cache_dir).fingerprint() == "f" * 64
    memo = cache_dir / CompileCache.FINGERPRINT
    memo.write_bytes(memo.read_bytes().replace(b"f" * 64, b"0" * 64))  # someone else's fingerprint
    monkeypatch.setattr(cache_mod, "compiler_fingerprint", lambda: "e" * 64)
    assert cache.fingerprint() == "e" * 64


def test_a_hit_times_its_steps_and_a_miss_has_none(cache_dir):
    """A warm start's stats say where its time went (``cold_compile.py --steps`` prints them)."""
    graph = mlp_graph()
    cold = compile_graph(graph, cache_dir=cache_dir, content_hash="ab" * 32)
    warm = compile_graph(graph, cache_dir=cache_dir, content_hash="ab" * 32)
    assert cold.stats.steps == () and warm.stats.cache_hit
    assert [n for n, _, _ in warm.stats.steps] == ["open entry", "host facts", "target", "fingerprint",
                                                   "key, entry parsed", "code load", "arena", "weights' check",
                                                   "session"]
    assert all(wall >= 0 and cpu >= 0 for _, wall, cpu in warm.stats.steps)
    before_code = sum(w for _, w, _ in warm.stats.steps[:5])  # the steps before the hit's code load
    assert before_code <= warm.stats.cache_ms + 0.05


def _package(top):
    for rel in ("compiler/a.py", "compiler/ir/b.py", "compiler/ir/notes.txt",
                *(f"edge_runtime/{n}" for n in cache_mod.CACHE_MODULES), "edge_runtime/other.py"):
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_text(f"# {rel}\n")


def test_the_sources_stamp_follows_every_fingerprinted_file(tmp_path):
    """The stamp (what the remembered fingerprint is sealed under) changes when a covered source is
    rewritten, added or removed, and only then; the fingerprint covers the same files."""
    _package(tmp_path)
    top = str(tmp_path)
    assert [rel for rel, _ in cache_mod.source_stats(top)] == [
        "compiler/a.py", "compiler/ir/b.py", *sorted(f"edge_runtime/{n}" for n in cache_mod.CACHE_MODULES)]
    first = cache_mod.source_stamp(top)
    assert cache_mod.source_stamp(top) == first
    (tmp_path / "compiler/ir/notes.txt").write_text("not a source")
    (tmp_path / "edge_runtime/other.py").write_text("not covered")
    assert cache_mod.source_stamp(top) == first
    b = tmp_path / "compiler/ir/b.py"
    then = b.stat().st_mtime_ns
    b.write_text("# compiler/ir/B.py\n")  # same size and inode, new bytes, written a second later:
    os.utime(b, ns=(then + 10**9, then + 10**9))  # (file times tick coarsely; within one tick only ctime might move)
    rewritten = cache_mod.source_stamp(top)
    assert rewritten != first
    (tmp_path / "compiler/ir/c.py").write_text("")
    added = cache_mod.source_stamp(top)
    assert added not in (first, rewritten)
    (tmp_path / "compiler/ir/c.py").unlink()
    assert cache_mod.source_stamp(top) == rewritten
    (tmp_path / "edge_runtime/sealed.py").write_text("# changed\n")
    assert cache_mod.source_stamp(top) != rewritten


def test_a_warm_start_opens_its_entry_before_the_key_is_computed(cache_dir, monkeypatch):
    """The hint a hit leaves names the entry, so the next start opens it (and starts the weights' check)
    before host facts and fingerprint are known; the entry is opened once."""
    graph = mlp_graph()
    compile_graph(graph, cache_dir=cache_dir, content_hash="ab" * 32)
    entry, order = _entry(cache_dir), []
    real_open, real_host = Sealer.open, compile_mod.host_target
    monkeypatch.setattr(Sealer, "open", lambda self, path, name: order.append(str(path)) or real_open(self, path, name))
    monkeypatch.setattr(compile_mod, "host_target", lambda cache, ask: order.append("host") or real_host(cache, ask))
    warm = compile_graph(graph, cache_dir=cache_dir, content_hash="ab" * 32)
    assert warm.stats.cache_hit
    assert order[0] == str(entry) and order.count(str(entry)) == 1 and "host" in order
    compile_graph(graph, cache_dir=cache_dir)  # no content hash (a bare graph): no hint is read or written
    assert len([p for p in cache_dir.iterdir() if p.name.endswith(CompileCache.HINT_SUFFIX)]) == 1
