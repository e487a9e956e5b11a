"""The compile cache under attack: nothing but an entry this device sealed under its key is ever loaded.

Each attack from the review (issue 19) ends in a miss, a warning in the log, a fresh compile with the
right outputs, and (where the path allows it) a good entry written in its place.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import signal
from contextlib import contextmanager

import numpy as np
import pytest
from cuvil.compiler.codegen.lower import lower
from cuvil.edge_runtime import jit
from cuvil.edge_runtime.artifact import FORMAT, ArtifactError, read_artifact, write_artifact
from cuvil.edge_runtime.cache import CompileCache, cache_key, finish_writes
from cuvil.edge_runtime.compile import compile_graph, resolve
from cuvil.edge_runtime import sealed
from cuvil.edge_runtime.sealed import PAGE, Sealer

from .test_session import _check, mlp_graph

X = {"x": np.random.default_rng(7).standard_normal((1, 37), dtype=np.float32)}
CONTENT = "ab" * 32


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "cache"


def _key(graph_content: str = CONTENT) -> str:
    return cache_key(f"{graph_content} optimize=True profile=False", resolve("host"), 1)


def _compile(graph, cache_dir, content=CONTENT):
    """The session, its cache entry written (a cold compile writes it behind its caller)."""
    session = compile_graph(graph, cache_dir=cache_dir, content_hash=content)
    finish_writes()
    return session


@contextmanager
def _deadline(seconds: int):
    """Fail (instead of hanging the suite) when the body blocks, as an open of a FIFO would."""
    def stop(*_):
        raise AssertionError(f"blocked for {seconds} s")

    old = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _payload_object(entry: str, marker) -> bytes:
    """An object file whose entry points run ``system("touch MARKER")``: what a poisoned entry would carry."""
    cmd = f"touch {marker}".encode() + b"\0"
    const = "".join(f"\\{b:02x}" for b in cmd)
    ir_text = f"""
@cmd = private constant [{len(cmd)} x i8] c"{const}"
declare i32 @system(i8*)
define void @touch() {{
  %p = getelementptr [{len(cmd)} x i8], [{len(cmd)} x i8]* @cmd, i64 0, i64 0
  %r = call i32 @system(i8* %p)
  ret void
}}
define void @{entry}(i8* %a, i8* %w) {{ call void @touch() ret void }}
define void @{entry}_bind(i8* %a, i8* %w) {{ call void @touch() ret void }}
define void @{entry}_bound() {{ call void @touch() ret void }}
"""
    return jit.emit_object(ir_text, resolve("host"), jit=True)


def _poison(cache_dir, graph, secret: bytes, marker) -> None:
    """Write, under ``secret``, a complete entry for the graph's key that runs the payload."""
    lowered = lower(graph, resolve("host"))
    cache_dir.mkdir(parents=True, exist_ok=True)
    write_artifact(Sealer(secret), CompileCache(cache_dir).path(_key()), _key(), lowered,
                   [_payload_object(lowered.entry, marker)])


def _miss_then_repaired(graph, cache_dir, caplog):
    with caplog.at_level(logging.WARNING, logger="cuvil.edge_runtime.cache"):
        sess = _compile(graph, cache_dir)
    assert not sess.stats.cache_hit
    assert any("unusable" in r.getMessage() for r in caplog.records), caplog.text
    _check(graph, X, sess)
    again = _compile(graph, cache_dir)
    assert again.stats.cache_hit
    _check(graph, X, again)


def test_a_replaced_entry_never_runs_its_code(cache_dir, tmp_path, caplog):
    graph = mlp_graph()
    _compile(graph, cache_dir)
    marker = tmp_path / "pwned"
    _poison(cache_dir, graph, os.urandom(32), marker)  # the attacker has everything but the device secret
    _miss_then_repaired(graph, cache_dir, caplog)
    assert not marker.exists()


def test_the_payload_would_run_if_it_were_sealed_by_this_device(cache_dir, tmp_path):
    """The attack above is real: the same entry under the device's own secret does run (so the test can fail)."""
    graph = mlp_graph()
    marker = tmp_path / "ran"
    from cuvil.edge_runtime.private import device_secret

    _poison(cache_dir, graph, device_secret(), marker)
    _compile(graph, cache_dir)
    assert marker.exists()


def test_an_entry_copied_over_another_key_is_a_miss(cache_dir, caplog):
    """Swapping: another model's genuine entry under this model's key would silently compute the other model."""
    a, b = mlp_graph(seed=0), mlp_graph(seed=1)
    _compile(a, cache_dir, CONTENT)
    _compile(b, cache_dir, "cd" * 32)
    cache = CompileCache(cache_dir)
    cache.path(_key()).write_bytes(cache.path(_key("cd" * 32)).read_bytes())
    _miss_then_repaired(a, cache_dir, caplog)


def test_a_fifo_at_the_entry_path_is_a_miss_not_a_hang(cache_dir, caplog):
    graph = mlp_graph()
    cache_dir.mkdir()
    os.mkfifo(CompileCache(cache_dir).path(_key()))
    with _deadline(60):
        _miss_then_repaired(graph, cache_dir, caplog)  # os.replace puts the entry where the FIFO was


def test_a_symlink_to_a_good_entry_is_a_miss(cache_dir, tmp_path, caplog):
    graph = mlp_graph()
    elsewhere = tmp_path / "elsewhere"
    _compile(graph, elsewhere)
    cache_dir.mkdir()
    CompileCache(cache_dir).path(_key()).symlink_to(CompileCache(elsewhere).path(_key()))
    _miss_then_repaired(graph, cache_dir, caplog)


def test_an_entry_others_may_write_is_a_miss(cache_dir, caplog):
    graph = mlp_graph()
    _compile(graph, cache_dir)
    CompileCache(cache_dir).path(_key()).chmod(0o666)
    _miss_then_repaired(graph, cache_dir, caplog)


@pytest.mark.parametrize("planted", ["another user's", "others may write", "sparse"])
def test_a_planted_file_neither_spends_the_size_limit_nor_is_deleted(cache_dir, planted):
    """In a shared cache directory another user plants a file the cache would never load, or a sparse one
    of huge apparent size: the next write must not delete the device's own entries to make room for it.
    Only this user's private files count, by the bytes they occupy; another user's are never deleted."""
    if planted == "another user's" and os.geteuid() != 0:
        pytest.skip("planting a file of another user takes chown, which takes root")
    cache_dir.mkdir()
    ours = [cache_dir / f"{i:064x}{CompileCache.SUFFIX}" for i in (1, 2, 3)]
    for at, path in enumerate(ours, 1):
        path.write_bytes(b"\0" * 1_000)
        os.utime(path, (at, at))
    bad = cache_dir / f"{0:064x}{CompileCache.SUFFIX}"  # planted just now: the most recently used
    stale = cache_dir / ".0123456789abcdef.k1l2m3n4.tmp"  # named as a killed write's temporary file
    stale.write_bytes(b"\0" * 5_000)
    if planted == "sparse":
        with open(bad, "wb") as f:
            f.truncate(1 << 30)  # 1 GiB it claims, none it occupies
        if bad.stat().st_blocks:
            pytest.skip("this file system allocates the blocks of a sparse file")
    else:
        bad.write_bytes(b"\0" * 5_000)
        nobody = pwd.getpwnam("nobody")
        for path in (bad, stale):
            if planted == "others may write":
                path.chmod(0o666)
            else:
                os.chown(path, nobody.pw_uid, nobody.pw_gid)
    os.utime(stale, (0, 0))  # long ago
    expect = [stale] if planted == "sparse" else []  # this user's own debris goes (and counted nothing)
    assert CompileCache(cache_dir, max_bytes=3_000).evict(keep=ours[-1]) == expect
    assert bad.exists() and all(p.exists() for p in ours)


@pytest.mark.parametrize("how", ["truncated", "empty", "header_only"])
def test_a_truncated_entry_is_a_miss(cache_dir, caplog, how):
    graph = mlp_graph()
    _compile(graph, cache_dir)
    path = CompileCache(cache_dir).path(_key())
    raw = path.read_bytes()
    path.write_bytes({"truncated": raw[:len(raw) // 2], "empty": b"", "header_only": raw[:99]}[how])
    _miss_then_repaired(graph, cache_dir, caplog)


def test_a_directory_at_the_entry_path_is_a_miss_and_compiles(cache_dir, caplog):
    """Nothing can be written over a directory: every compile is a logged miss, never an exception."""
    graph = mlp_graph()
    CompileCache(cache_dir).path(_key()).mkdir(parents=True)
    for _ in range(2):
        with caplog.at_level(logging.WARNING, logger="cuvil.edge_runtime.cache"):
            sess = _compile(graph, cache_dir)
        assert not sess.stats.cache_hit
        _check(graph, X, sess)
    assert any("could not write" in r.getMessage() for r in caplog.records)


CRAFTED = {
    "objects_not_a_list": lambda m: {**m, "objects": 7},
    "plan_missing": lambda m: {k: v for k, v in m.items() if k != "plan"},
    "inputs_wrong_type": lambda m: {**m, "inputs": [[None, "x", "f99", "nope"]]},
    "lengths_too_long": lambda m: {**m, "objects": [10**9]},
    "old_format": lambda m: {**m, "format": "cuvil artifact 1"},
    "not_an_object": lambda m: [1, 2, 3],
    "input_outside_the_arena": lambda m: {**m, "inputs": [[n, m["arena_bytes"], *rest] for n, _, *rest in m["inputs"]]},
    "output_before_the_arena": lambda m: {**m, "outputs": [[n, -64, *rest] for n, _, *rest in m["outputs"]]},
    "fault_word_outside_the_arena": lambda m: {**m, "fault_offset": 1 << 40},
    "split_count_not_a_number": lambda m: {**m, "split_nodes": "many"},
    "profile_counters_outside_the_arena": lambda m: {**m, "profile_offset": m["arena_bytes"], "profile_nodes": ["a"]},
}


@pytest.mark.parametrize("how", sorted(CRAFTED))
def test_crafted_metadata_is_a_miss_even_when_sealed(cache_dir, caplog, how):
    """Metadata that would raise TypeError/KeyError while parsing is an ArtifactError (a miss), even under
    the device's own seal (a writer's bug); an attacker's crafted entry already fails the MAC."""
    graph = mlp_graph()
    _compile(graph, cache_dir)
    cache = CompileCache(cache_dir)
    art = read_artifact(cache.sealer, cache.path(_key()), _key(), resolve("host"))
    meta = json.loads(_meta_text(art))
    cache.sealer.write(cache.path(_key()), _key(), json.dumps(CRAFTED[how](meta)).encode(), art.objects,
                       art.weights.tobytes())
    with pytest.raises(ArtifactError):
        read_artifact(cache.sealer, cache.path(_key()), _key(), resolve("host"))
    _miss_then_repaired(graph, cache_dir, caplog)


def _meta_text(art) -> str:
    from cuvil.edge_runtime.artifact import _meta

    return json.dumps({**_meta(art.lowered), "format": FORMAT, "objects": [len(o) for o in art.objects]})


def test_an_unusable_device_secret_disables_the_cache_not_the_compile(cache_dir, tmp_path, caplog):
    graph = mlp_graph()
    secret = tmp_path / "state" / "device.key"
    secret.parent.mkdir()
    secret.write_bytes(os.urandom(32))
    secret.chmod(0o644)  # readable by others: it may have leaked, so nothing is sealed or trusted with it
    with caplog.at_level(logging.WARNING, logger="cuvil.edge_runtime.cache"):
        cache = CompileCache(cache_dir, secret)
    assert cache.sealer is None and "disabled" in caplog.text
    assert cache.get(_key(), resolve("host")) is None
    cache.put(_key(), lower(graph, resolve("host")), [b"never written"])
    assert not cache_dir.exists()


def test_weights_damaged_while_their_check_runs_beside_the_code_load_are_a_miss(cache_dir, caplog, monkeypatch):
    """A warm start loads the code while the weights' check runs on a thread; a flipped weight byte
    is still a miss, and no session is built on the damaged weights."""
    monkeypatch.setattr(sealed, "BACKGROUND_CHECK_BYTES", PAGE)  # the mlp's weights are then checked on a thread
    monkeypatch.setattr(sealed, "GMAC_CHUNK", PAGE)  # in several chunks
    monkeypatch.setattr(sealed, "tail_check_threads", lambda: 2)  # as if a core were idle
    graph = mlp_graph()
    _compile(graph, cache_dir)
    entry = CompileCache(cache_dir).path(_key())
    raw = bytearray(entry.read_bytes())
    raw[-2 * PAGE] ^= 1  # the tail (its last page is padding when the weights are not whole pages)
    raw[-PAGE - 100] ^= 1
    entry.write_bytes(bytes(raw))
    _miss_then_repaired(graph, cache_dir, caplog)


def _hints(cache_dir):
    return sorted(p for p in cache_dir.iterdir() if p.name.endswith(CompileCache.HINT_SUFFIX))


def test_a_hint_naming_another_models_entry_is_never_used(cache_dir, monkeypatch):
    """The hint is an unsealed guess: pointed at model b's (good, sealed) entry, model a still runs a's code."""
    a, b = mlp_graph(0), mlp_graph(1)
    _compile(a, cache_dir, CONTENT)
    _compile(b, cache_dir, "cd" * 32)
    (hint_a,) = [h for h in _hints(cache_dir) if h.read_text() == _key()]
    hint_a.write_text(_key("cd" * 32))
    opened = []
    real_open = Sealer.open
    monkeypatch.setattr(Sealer, "open", lambda self, path, name: opened.append(name) or real_open(self, path, name))
    sess = _compile(a, cache_dir, CONTENT)
    assert sess.stats.cache_hit and opened.count(_key("cd" * 32)) == 1 and opened.count(_key()) == 1
    _check(a, X, sess)
    assert hint_a.read_text() == _key()  # put right for the next start


@pytest.mark.parametrize("how", ["garbled", "fifo", "others_may_write", "names_nothing"])
def test_a_bad_hint_costs_nothing_but_the_guess(cache_dir, how):
    graph = mlp_graph()
    _compile(graph, cache_dir)
    (hint,) = _hints(cache_dir)
    if how == "fifo":
        hint.unlink()
        os.mkfifo(hint)
    elif how == "others_may_write":
        hint.chmod(0o666)
    else:
        hint.write_text("zz" * 32 if how == "garbled" else "0" * 64)
    with _deadline(60):
        sess = _compile(graph, cache_dir)
    assert sess.stats.cache_hit
    _check(graph, X, sess)
