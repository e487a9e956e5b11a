"""On-disk cache of complete compiled artifacts (code, packed weights, plan), safe under concurrent processes.

Key: sha256 over the graph's content (or a bundle hash), the target, the batch size and the
compiler's fingerprint (the code generator's own sources, so a changed emitter never loads stale
code). With a bundle's hash as the content, computing a key hashes no graph and no weights.
Every entry is sealed (:mod:`.sealed`) under the device secret and its key, and checked before its
code is loaded: a replaced, swapped, damaged or odd entry (a directory, FIFO, symbolic link, another
user's file) is a miss, logged, and compiled again. Writes go to a temporary file (``O_EXCL``, mode
0600) in the cache directory (created 0700) and are published with ``os.replace``, which is atomic:
a reader sees either no entry or a complete one.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..compiler.bundle.format import is_sha256_hex
from ..compiler.codegen.lowered import LoweredModel
from ..compiler.digest import sha256, short_hex
from ..compiler.ir.graph import Graph
from ..compiler.target import Target
from ..devices.detect import llvmlite_stamp
from . import cache_evict
from .artifact import OpenedArtifact, open_artifact, write_artifact
from ..compiler.regular_file import open_regular
from .cache_settings import default_dir, default_max_bytes, unusable_dir
from .private import SecretError, device_secret, private_dir
from .sealed import Opened, Sealer, SealError

CODEGEN_VERSION = "2"
log = logging.getLogger(__name__)


ATIME_REFRESH_S = 3600.0
"""A hit sets its entry's atime once the atime is this old: eviction's order of use, to the hour, for one
inode write per entry an hour at most (relatime records a later read only after a day, noatime never)."""


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)
CACHE_MODULES = ("jit.py", "artifact.py", "cache.py", "sealed.py", "elf.py", "objload.py", "prelink.py")
"""The modules besides the compiler that build and read cache entries (prelinked code included), so their
bytes are in the fingerprint too."""


def _top() -> str:
    """The package's top directory (``compiler/`` and ``edge_runtime/`` lie in it)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_stats(top: str | None = None) -> list[tuple[str, os.stat_result]]:
    """(path relative to ``top``, stat) of every source the fingerprint covers (``compiler/**.py`` and
    :data:`CACHE_MODULES`), sorted. Each directory is opened once and its entries are stat'ed relative
    to it (``fstatat``), never by a full path from the root: a warm start does this for ~150 files
    (0.3 vs 0.8 ms with ``os.walk`` and ``os.stat``)."""
    top = top or _top()
    found: list[tuple[str, os.stat_result]] = []

    def walk(fd: int, rel: str) -> None:
        subdirs = []
        with os.scandir(fd) as entries:
            for e in entries:
                if e.is_dir(follow_symlinks=False):
                    subdirs.append(e.name)
                elif e.name.endswith(".py"):
                    found.append((f"{rel}/{e.name}", e.stat()))
        for name in subdirs:
            sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
            try:
                walk(sub, f"{rel}/{name}")
            finally:
                os.close(sub)

    fd = os.open(os.path.join(top, "compiler"), _DIR_FLAGS)
    try:
        walk(fd, "compiler")
    finally:
        os.close(fd)
    fd = os.open(os.path.join(top, "edge_runtime"), _DIR_FLAGS)
    try:
        found += [(f"edge_runtime/{n}", os.stat(n, dir_fd=fd)) for n in CACHE_MODULES]
    finally:
        os.close(fd)
    return sorted(found, key=lambda f: f[0])


def _versions_hash():  # a Sha256, to be updated
    """sha256 started with what besides the sources decides the code: the code generator's version, llvmlite's
    (its version file's hash: importing llvmlite would cost a warm start milliseconds)."""
    return sha256(f"codegen {CODEGEN_VERSION} llvmlite {llvmlite_stamp()}".encode())


@functools.lru_cache(maxsize=1)
def compiler_fingerprint() -> str:
    """The bytes of every compiler source and of the modules that build and read cache entries.

    Strictly stronger than a version number, which it replaces: ``importlib.metadata.version``
    scans every path entry and cost 10-40 ms of a 50 ms warm start.
    """
    h = _versions_hash()
    top = _top()
    for rel, _ in source_stats(top):
        h.update(rel.encode())
        with open(os.path.join(top, rel), "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def source_stamp(top: str | None = None) -> str:
    """sha256 over each fingerprinted source's name, inode, size, mtime and ctime: it changes whenever
    a source's bytes may have (a write sets ctime, which no user can set back) or a source comes or
    goes, at a fraction of the fingerprint's cost (no file is opened)."""
    h = _versions_hash()
    h.update(f"{top or _top()}\n".encode())
    for rel, st in source_stats(top):
        h.update(f"{rel} {st.st_ino} {st.st_size} {st.st_mtime_ns} {st.st_ctime_ns}\n".encode())
    return h.hexdigest()


def graph_digest(graph: Graph) -> str:
    """sha256 of the graph's canonical text form plus every weight's raw bytes (no copies)."""
    from ..compiler.ir.text import print_graph  # the op table: not needed when a bundle's hash is the key

    h = sha256(print_graph(graph, data=False).encode())
    for name, arr in graph.constants.items():
        h.update(f"{name} {arr.dtype.name} {arr.dtype.str} {arr.shape}".encode())
        h.update(np.ascontiguousarray(arr).reshape(-1).view(np.uint8).data)
    return h.hexdigest()


def cache_key(content: str, target: Target, batch: int, fingerprint: str | None = None) -> str:
    """``fingerprint``: :func:`compiler_fingerprint` (its default), as a cache remembers it."""
    parts = [content, repr(target), str(batch), fingerprint or compiler_fingerprint()]
    return sha256("\n".join(parts).encode()).hexdigest()


_writing: dict[Path, threading.Thread] = {}  # entry and hint paths -> the thread writing them
_writing_lock = threading.Lock()


def finish_writes(*paths: Path) -> None:
    """Wait for the cache files this process is still writing (:meth:`CompileCache.put_behind`): those at
    ``paths``, or every one (before deleting a cache directory, or handing it to another process). Every
    writer in ``_writing`` was started before it was registered, so each join waits for a real write."""
    with _writing_lock:
        threads = {t for p, t in _writing.items() if not paths or p in paths}
    for thread in threads:
        thread.join()
    with _writing_lock:
        for p in [p for p, t in _writing.items() if not t.is_alive()]:
            del _writing[p]


def _forget_writes() -> None:
    """In a forked child: the parent's writers do not run here (the parent finishes its entries), and the
    parent may have held the lock while forking."""
    global _writing_lock
    _writing_lock = threading.Lock()
    _writing.clear()


os.register_at_fork(after_in_child=_forget_writes)


def device_sealer(secret_path: str | os.PathLike | None = None) -> Sealer | None:
    """The Sealer under the device secret, or None (logged) when the secret is unusable: no cache then."""
    try:
        return Sealer(device_secret(secret_path))
    except (SecretError, OSError) as e:
        log.warning("compile cache disabled: %s", e)
        return None


@dataclass(frozen=True)
class EarlyEntry:
    """An entry opened under a guessed key, its weights' check under way (:meth:`CompileCache.open_early`)."""

    key: str
    opened: Opened


class CompileCache:
    """A directory of ``<key>.cuvil-art`` files, each one complete compiled artifact (:mod:`.artifact`).

    An entry that fails any check (truncated by a full disk, garbled, of an older format, not sealed
    by this device under its key) is a miss and is replaced, never loaded. Entries are never changed
    in place, only replaced whole, so a process that has an entry's weights mapped keeps reading
    the bytes it checked. Failing to write an entry is logged, never an error: the compiled session
    works without it.
    """

    SUFFIX = ".cuvil-art"
    FINGERPRINT = "compiler.cuvil-fingerprint"
    HINT_SUFFIX = ".cuvil-hint"

    def __init__(self, directory: str | os.PathLike | None = None, secret_path: str | os.PathLike | None = None,
                 max_bytes: int | None = None):
        self.dir = Path(directory) if directory is not None else default_dir()
        unusable = unusable_dir(self.dir)
        if unusable:  # else every file the cache reads or writes was a warning of its own
            log.warning("compile cache disabled: %s", unusable)
        self.sealer = None if unusable else device_sealer(secret_path)
        self.max_bytes = default_max_bytes() if max_bytes is None else max_bytes

    def path(self, key: str) -> Path:
        return self.dir / f"{key}{self.SUFFIX}"

    def get(self, key: str, target: Target, early: EarlyEntry | None = None) -> OpenedArtifact | None:
        """The entry under ``key`` with its code and plan checked, its weights' check under way: they
        come from :meth:`weights` only. ``early``: what :meth:`open_early` opened, used when its guess is ``key``."""
        if self.sealer is None:
            return None
        path = self.path(key)
        finish_writes(path)
        try:
            opened = early.opened if early is not None and early.key == key else self.sealer.open(path, key)
            entry = open_artifact(self.sealer, path, key, target, opened)
            _note_read(path, opened.stat)
            return entry
        except FileNotFoundError:
            return None
        except (OSError, SealError) as e:
            log.warning("compile cache entry %s is unusable, compiling again: %s", path, _reason(e))
            return None

    def age_s(self, key: str) -> float:
        """Seconds since the entry under ``key`` was written (0 when it is gone)."""
        try:
            return max(0.0, time.time() - os.stat(self.path(key)).st_mtime)
        except OSError:
            return 0.0

    def touch(self, key: str) -> None:
        """Restart the age of the entry under ``key`` (:meth:`age_s`): the decision it left open was just taken
        again, to no end, and is taken again no sooner than a fresh entry's."""
        with contextlib.suppress(OSError):
            os.utime(self.path(key))

    def weights(self, key: str, entry: OpenedArtifact) -> np.ndarray | None:
        """``entry``'s weights once their check holds; None (logged: a miss) when it fails."""
        try:
            return entry.checked().weights
        except SealError as e:
            log.warning("compile cache entry %s is unusable, compiling again: %s", self.path(key), _reason(e))
            return None

    def _hint_path(self, request: str) -> Path:
        return self.dir / f"{short_hex(request, 32)}{self.HINT_SUFFIX}"

    def open_early(self, request: str) -> EarlyEntry | None:
        """The entry that served ``request`` (a compile call's arguments) last time, opened under that key
        before this call's key is computed, so the weights' check (on idle cores) overlaps the
        key's ~2 ms (host facts, compiler fingerprint). The hint is a guess and nothing more: the
        entry is used only when its key turns out to be the computed one (:meth:`get`), and it is
        sealed under that key; a wrong or garbled hint costs an open. None when there is none."""
        if self.sealer is None:
            return None
        finish_writes(self._hint_path(request))
        try:
            fd, _ = open_regular(self._hint_path(request), owned=True)
            try:
                guess = os.read(fd, 65).decode("ascii")
            finally:
                os.close(fd)
            if not is_sha256_hex(guess):
                return None
            return EarlyEntry(guess, self.sealer.open(self.path(guess), guess))
        except (OSError, SealError, UnicodeDecodeError):
            return None

    def remember(self, request: str, key: str) -> None:
        """Note that ``key`` served ``request`` (the hint :meth:`open_early` reads); failing to is logged only."""
        if self.sealer is None:
            return
        try:
            private_dir(self.dir)
            fd, tmp = tempfile.mkstemp(prefix=".hint.", suffix=".tmp", dir=self.dir)  # O_EXCL, 0600
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(key.encode("ascii"))
                os.replace(tmp, self._hint_path(request))
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as e:
            log.warning("could not remember a cache hint in %s: %s", self.dir, _reason(e))

    def fingerprint(self) -> str:
        """:func:`compiler_fingerprint`, remembered in a file sealed under the sources' :func:`source_stamp`:
        a warm start stats the sources instead of reading them (3 ms -> 0.6 ms). Any change to a
        source changes the stamp, the seal then fails, and the fingerprint is computed again."""
        if self.sealer is None:
            return compiler_fingerprint()
        stamp, path = source_stamp(), self.dir / self.FINGERPRINT
        try:
            got = self.sealer.read(path, stamp).meta.decode("ascii")
            if is_sha256_hex(got):
                return got
        except (OSError, SealError, UnicodeDecodeError):
            pass
        fingerprint = compiler_fingerprint()
        try:
            private_dir(self.dir)
            self.sealer.write(path, stamp, fingerprint.encode(), [], b"")
        except (OSError, SealError) as e:
            log.warning("could not remember the compiler fingerprint in %s: %s", path, _reason(e))
        return fingerprint

    def put(self, key: str, lowered: LoweredModel, objects: list[bytes]) -> None:
        if self.sealer is None:
            return
        try:
            private_dir(self.dir)
            write_artifact(self.sealer, self.path(key), key, lowered, objects)
        except (OSError, SealError) as e:
            log.warning("could not write compile cache entry %s: %s", self.path(key), _reason(e))
            return
        self.evict(keep=self.path(key))

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Keep the cache within ``max_bytes`` (:func:`.cache_evict.evict`): delete the least recently used
        entries (by the later of their last read, as :meth:`get` records it, and their last write), the
        temporary files of killed writes and the hints whose entry is gone; never ``keep`` (the entry just
        written). Another process
        still reading an entry keeps its open file; a later compile of its model misses and writes it
        again. Returns the deleted paths."""
        return cache_evict.evict(self.dir, self.SUFFIX, self.max_bytes, keep, self.HINT_SUFFIX)

    def put_behind(self, key: str, lowered: LoweredModel, objects: list[bytes], request: str | None = None) -> None:
        """:meth:`put`, then :meth:`remember` ``request``, on a thread of its own: a cold compile hands
        over its session without waiting for the entry's MAC and write (ResNet-18's 45 MB: 15-390 ms
        on a busy disk). Not a daemon, so the process finishes the entry before it exits; a read of
        that entry or hint in this process waits for it first, and :func:`finish_writes` waits for it
        on demand (another process may miss an entry still being written, and compile it itself)."""
        if self.sealer is None:
            return

        def write() -> None:
            self.put(key, lowered, objects)
            if request:
                self.remember(request, key)

        thread = threading.Thread(target=write, name="cuvil-cache-write")
        paths = [self.path(key)] + ([self._hint_path(request)] if request else [])
        with _writing_lock:  # started and registered at once: finish_writes never meets a writer not yet started
            thread.start()
            _writing.update(dict.fromkeys(paths, thread))


def _note_read(path: Path, st: os.stat_result | None) -> None:
    """Record a hit in the entry's atime (eviction's "last read") once it is ATIME_REFRESH_S old: a relatime
    mount records only the first read after a write, noatime none. Its mtime stays exactly as it was
    (:meth:`CompileCache.age_s`). A fresh atime costs nothing but this comparison; a failure (a read-only
    cache, an entry replaced meanwhile) leaves the atime as it was."""
    now = time.time_ns()
    if st is None or now - st.st_atime_ns < ATIME_REFRESH_S * 1e9:
        return
    with contextlib.suppress(OSError):
        current = os.stat(path, follow_symlinks=False)
        if (current.st_dev, current.st_ino) == (st.st_dev, st.st_ino):
            os.utime(path, ns=(now, current.st_mtime_ns), follow_symlinks=False)


def _reason(e: BaseException) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e) or type(e).__name__
