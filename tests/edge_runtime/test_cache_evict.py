"""The cache's size limit: least recently used entries go first, killed writes' debris goes, hits are recorded."""

from __future__ import annotations

import os
import time

import pytest
from cuvil.edge_runtime import cache as cache_mod
from cuvil.edge_runtime import cache_settings as settings
from cuvil.edge_runtime.cache import CompileCache, finish_writes
from cuvil.edge_runtime.cache_evict import DEBRIS_AFTER_S
from cuvil.edge_runtime.compile import compile_graph

from .test_session import mlp_graph

HOUR_NS = 3600 * 10**9
AFTER_CTIME_NS = 50_000_000  # an atime this far ahead of the utime that sets it is past its ctime


@pytest.fixture
def cache_dir(tmp_path):
    return tmp_path / "cache"


def test_the_cache_deletes_its_least_recently_used_entries_beyond_its_size(cache_dir):
    """Entries of 1,000 bytes, a cache of 2,500: the oldest by the later of read and write go first,
    never the one just written; other files (hints, the fingerprint, the tuning record) stay."""
    cache = CompileCache(cache_dir, max_bytes=2_500)
    cache_dir.mkdir()
    keep = cache_dir / "fingerprint-like.cuvil-tuning"
    keep.write_bytes(b"x" * 5_000)
    paths = {}
    for i, (read, written) in enumerate([(400, 100), (100, 300), (200, 200), (50, 50)]):
        paths[i] = cache_dir / f"{i:064x}{CompileCache.SUFFIX}"
        paths[i].write_bytes(b"\0" * 1_000)
        os.utime(paths[i], (read, written))
    gone = cache.evict(keep=paths[3])  # the oldest, but just written
    assert sorted(gone) == sorted([paths[2], paths[1]])  # last used at 200, 300 (read 400 keeps entry 0)
    assert paths[0].exists() and paths[3].exists() and keep.exists()
    assert CompileCache(cache_dir, max_bytes=2_500).evict() == []  # within bounds: nothing


def test_a_compile_keeps_the_cache_within_its_size(cache_dir, monkeypatch):
    monkeypatch.setenv(settings.MAX_BYTES_ENV, "1")  # any entry is too many, but the one just written
    for seed in (1, 2):
        compile_graph(mlp_graph(seed=seed), cache_dir=cache_dir)
        finish_writes()
        assert len([p for p in cache_dir.iterdir() if p.suffix == CompileCache.SUFFIX]) == 1
    monkeypatch.delenv(settings.MAX_BYTES_ENV)  # not set: the default (a bad value: test_cache_settings.py)
    assert CompileCache(cache_dir).max_bytes == settings.DEFAULT_MAX_BYTES


def _file(path, size: int, at_s: float):
    path.write_bytes(b"x" * size)
    os.utime(path, (at_s, at_s))
    return path


def test_the_temporary_files_of_killed_writes_are_deleted_and_younger_ones_count(cache_dir):
    """A write killed outright leaves '.<name>.XXXX.tmp' (Sealer.write, a hint): one an hour old is debris and
    goes; a younger one may be a write under way, so it stays, and its bytes count toward the limit."""
    cache_dir.mkdir()
    old, now = time.time() - DEBRIS_AFTER_S - 60, time.time()
    debris = [_file(cache_dir / ".0123456789abcdef.k1l2m3n4.tmp", 1_000, old),
              _file(cache_dir / ".hint.a1b2c3d4.tmp", 40, old)]
    live = _file(cache_dir / ".fedcba9876543210.q1w2e3r4.tmp", 1_000, now)
    older, newer = (_file(cache_dir / f"{i:064x}{CompileCache.SUFFIX}", 1_000, now - 100 + i) for i in range(2))
    gone = CompileCache(cache_dir, max_bytes=2_500).evict(keep=newer)
    assert sorted(gone) == sorted([*debris, older])  # the live write's 1,000 bytes and two entries are 3,000
    assert live.exists() and newer.exists()


def test_hints_whose_entry_is_gone_are_deleted(cache_dir):
    """A hint is written per distinct request: once its entry is evicted (or it holds no key) it guides
    nothing, and without this they piled up forever."""
    cache_dir.mkdir()
    now = time.time()
    kept_entry = _file(cache_dir / f"{1:064x}{CompileCache.SUFFIX}", 1_000, now)
    hints = {}
    for name, key in (("live", f"{1:064x}"), ("evicted", f"{2:064x}"), ("garbage", "not a key")):
        hints[name] = cache_dir / f"{name:0>32}{CompileCache.HINT_SUFFIX}"
        hints[name].write_bytes(key.encode())
    hints["others"] = cache_dir / f"{'others':0>32}{CompileCache.HINT_SUFFIX}"
    hints["others"].write_bytes(f"{3:064x}".encode())
    hints["others"].chmod(0o666)  # not this user's alone: never read, never deleted
    gone = CompileCache(cache_dir, max_bytes=10_000).evict()
    assert sorted(gone) == sorted([hints["evicted"], hints["garbage"]])
    assert hints["live"].exists() and hints["others"].exists() and kept_entry.exists()


@pytest.mark.parametrize("content_hash", ["ab" * 32, None])  # the entry opened early (by its hint), or by get
def test_a_hit_records_its_read_once_the_atime_is_old(cache_dir, monkeypatch, content_hash):
    """Under relatime (Linux's default) a read leaves no trace once the atime is past the mtime and ctime,
    so the least recently used entry could be the one in constant use: a hit sets an atime
    ATIME_REFRESH_S old itself, the mtime kept to the nanosecond (age_s reads it), and writes nothing
    when the atime is fresher."""
    graph = mlp_graph()
    compile_graph(graph, cache_dir=cache_dir, content_hash=content_hash)
    finish_writes()
    (entry,) = cache_dir.glob(f"*{CompileCache.SUFFIX}")
    written = time.time_ns() - 3 * HOUR_NS

    def read_at(ns: int) -> int:
        """Record a read at ``ns``, after the ctime this sets: from then on relatime records no read."""
        os.utime(entry, ns=(ns, written))
        return entry.stat().st_ctime_ns

    read = time.time_ns() + AFTER_CTIME_NS
    changed = read_at(read)
    assert compile_graph(graph, cache_dir=cache_dir, content_hash=content_hash).stats.cache_hit
    st = entry.stat()
    assert (st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns) == (read, written, changed)  # fresh: nothing written

    monkeypatch.setattr(cache_mod, "ATIME_REFRESH_S", 0.2)  # an hour, shortened
    read_at(time.time_ns() + AFTER_CTIME_NS)
    time.sleep(0.3)
    before = time.time_ns()
    assert compile_graph(graph, cache_dir=cache_dir, content_hash=content_hash).stats.cache_hit
    st = entry.stat()
    assert st.st_atime_ns >= before and st.st_mtime_ns == written
    assert CompileCache(cache_dir).age_s(entry.name.split(".")[0]) >= 3 * 3600 - 1
