"""One record of conv choices per CPU, shared by every tuned compile on it: the same model, the same bits.

Timing is noisy. Two tuned compiles of one model could choose different kernels for a layer whose
candidates run within a few percent of each other, and each kernel sums in its own order: SqueezeNet
tuned at 1, 2, 1 and 2 threads (no cache) chose another kernel for one layer in the second compile,
whose output then differed in its last bits. The answer followed the compile, not the model.

So the first tuned compile that meets a layer geometry fixes its choice for this CPU: the measured
one, or the cost model's where that compile's budget did not reach the layer. Every later tuned
compile here takes the recorded choice without timing it, at any thread count, and spends its budget
on layers not seen before. Whether a layer's split over N threads pays, as the tuner timed it (its
largest part alone against the whole layer, on one core; the cost model's split where the budget
did not reach it), is recorded per thread count too, so a later compile at N threads builds nothing
for it either. The whole-model check (:mod:`.split_check`) runs on each new model structure: once it
settles which plan a structure runs at N threads (the tuned split, the split at the cheapest handoff,
or every layer whole), that plan and the handoff it was made at are recorded under the structure's
digest (:func:`structure_digest`: the graph without its weights' values), and the structure's later
versions (new weights: what a rollout brings) build that plan at once, with no handoff probe, no
check and no rebuild. A verdict left unsettled (busy cores, a first "whole") records nothing.

The record is a file in the compile cache's directory, sealed under the device secret and named by
its scope (:func:`scope`: the CPU, the compiler's fingerprint and the target less its thread count),
so a changed compiler or profile starts a new record; deleting the file starts over. A damaged,
replaced or odd record is a miss, logged, and written again; the tuner takes a recorded choice only
when it is one of the layer's candidates. Tuning holds the record's lock (``flock``) from reading it
to writing it back, so two compiles on one device neither lose each other's choices nor time their
kernels at the same time; a compile that cannot have the lock within ``LOCK_WAIT_S`` tunes alone and
records nothing, and one whose lock file is not this user's alone (another user could hold it
forever) does so at once.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from ..compiler.bundle.format import is_sha256_hex
from ..compiler.digest import sha256
from ..compiler.ir.graph import Graph
from ..compiler.target import ConvChoice, Geometry, Target
from ..devices.detect import cpu_identity
from ..compiler.regular_file import owned_alone
from .private import private_dir
from .sealed import Sealer, SealError

log = logging.getLogger(__name__)

MAX_THREADS = 64  # the most threads a recorded split decision may name (Tuning.max_threads' bound)
LOCK_WAIT_S = 30.0  # longer than any tuning's budget and its builds
MAX_ENTRIES = 4096  # choices, split decisions and verdicts a record keeps in all; a compile that would pass it records nothing
MAX_PLAN = 2  # a verdict's plan: 0 the tuned split, then split_check.fallbacks' (the cheapest handoff's, all whole)
MAX_HANDOFF_US = 1e6
_GEOMETRY_TUPLES = {7: 2, 8: 4, 9: 2}  # strides, pads, dilations: their positions in a Geometry and lengths
_MAX_INT = 1 << 31


def structure_digest(graph: Graph, batch: int, form: str) -> str:
    """sha256 of ``graph``'s text without its constants' values (their names, dtypes and shapes stay),
    the batch and ``form`` (how the compile lowers it): what a model's versions share."""
    from ..compiler.ir.text import print_graph  # the op table: a warm start never needs it

    return sha256(f"{batch} {form}\n{print_graph(graph, data=False)}".encode()).hexdigest()


def scope(target: Target, fingerprint: str) -> str:
    """What a record's choices hold for: this CPU, the compiler (``fingerprint``: the compile cache's)
    and ``target`` at any thread count, before any choice was fixed in it."""
    base = dataclasses.replace(target, threads=1, conv_choices=(), conv_parts=())
    return sha256(f"{cpu_identity()}\n{fingerprint}\n{base!r}".encode()).hexdigest()


@dataclass
class Known:
    """What a record holds, as a working set the tuner reads and adds to: each layer shape's kernel,
    per (shape, threads) whether the cost model's split of it pays (False: the layer runs whole), and
    per (structure digest, threads) the settled plan and the handoff (us) it was made at."""

    choices: dict[Geometry, ConvChoice] = field(default_factory=dict)
    splits: dict[tuple[Geometry, int], bool] = field(default_factory=dict)
    verdicts: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)

    @property
    def entries(self) -> int:
        return len(self.choices) + len(self.splits) + len(self.verdicts)


class TuningRecord:
    """The record of one scope in ``directory``, sealed by ``sealer``."""

    SUFFIX = ".cuvil-tuning"

    def __init__(self, directory: str | os.PathLike, sealer: Sealer, scope: str) -> None:
        self.dir, self.sealer, self.scope = Path(directory), sealer, scope
        self.path = self.dir / f"{scope[:32]}{self.SUFFIX}"
        self.lock_path = self.dir / f"{scope[:32]}{self.SUFFIX}-lock"

    @contextmanager
    def held(self) -> Iterator[Known]:
        """What is recorded, under the record's lock: what the caller adds is written back on leaving.
        Without the lock (another compile held it ``LOCK_WAIT_S``, or the directory refuses a lock
        file), an empty :class:`Known` that nothing writes back."""
        lock = self._lock()
        if lock is None:
            yield Known()
            return
        try:
            read = self._read()
            known = Known(dict(read.choices), dict(read.splits), dict(read.verdicts))
            yield known
            if known != read and known.entries <= MAX_ENTRIES:
                self._write(known)
        finally:
            os.close(lock)  # closing the descriptor releases the flock

    def settle(self, structure: str, threads: int, plan: int, handoff_us: float) -> None:
        """Record a structure's settled plan at ``threads``."""
        if 0 <= plan <= MAX_PLAN and 0 < handoff_us <= MAX_HANDOFF_US and 2 <= threads <= MAX_THREADS:
            with self.held() as known:
                known.verdicts[structure, threads] = (plan, float(handoff_us))

    def _lock(self) -> int | None:
        try:
            private_dir(self.dir)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as e:
            log.warning("tuning without the record in %s: %s", self.dir, e.strerror or e)
            return None
        st = os.fstat(fd)
        if not (stat.S_ISREG(st.st_mode) and owned_alone(st)):  # another user's: they could hold it forever
            os.close(fd)
            log.warning("tuning without the record: its lock %s is not a file of this user alone", self.lock_path)
            return None
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return fd
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    log.warning("tuning without the record: another compile held %s for %.0f s", self.path, LOCK_WAIT_S)
                    return None
                time.sleep(0.05)

    def _read(self) -> Known:
        try:
            return decode(self.sealer.read(self.path, self.scope).meta)
        except FileNotFoundError:
            return Known()
        except (OSError, SealError, ValueError) as e:
            log.warning("tuning record %s is unusable, recording again: %s", self.path, e)
            return Known()

    def _write(self, known: Known) -> None:
        try:
            self.sealer.write(self.path, self.scope, encode(known), [], b"")
        except (OSError, SealError) as e:
            log.warning("could not write the tuning record %s: %s", self.path, e)


def encode(known: Known) -> bytes:
    choices = sorted([_flat(g), [c.method, c.mr, c.nv, c.vl]] for g, c in known.choices.items())
    splits = sorted([_flat(g), threads, keep] for (g, threads), keep in known.splits.items())
    verdicts = sorted([d, threads, plan, handoff] for (d, threads), (plan, handoff) in known.verdicts.items())
    return json.dumps({"choices": choices, "splits": splits, "verdicts": verdicts}, separators=(",", ":")).encode()


def decode(data: bytes) -> Known:
    """What ``data`` records; ValueError for anything but :func:`encode`'s form."""
    try:
        doc = json.loads(data)
        rows, splits, verdicts = doc["choices"], doc["splits"], doc.get("verdicts", [])
    except (UnicodeDecodeError, json.JSONDecodeError, TypeError, KeyError, AttributeError) as e:
        raise ValueError("not a tuning record") from e
    if not (isinstance(rows, list) and isinstance(splits, list) and isinstance(verdicts, list)
            and len(rows) + len(splits) + len(verdicts) <= MAX_ENTRIES):
        raise ValueError("not lists of at most MAX_ENTRIES entries")
    out = Known()
    for row in rows:
        if not (isinstance(row, list) and len(row) == 2):
            raise ValueError("a choice is not a [geometry, choice] pair")
        geom, choice = _geometry(row[0]), row[1]
        if not (isinstance(choice, list) and len(choice) == 4 and isinstance(choice[0], str)
                and len(choice[0]) <= 32 and all(_small_int(v) for v in choice[1:])):
            raise ValueError("a choice is not [method, mr, nv, vl]")
        out.choices[geom] = ConvChoice(*choice)
    for row in splits:
        if not (isinstance(row, list) and len(row) == 3 and _small_int(row[1]) and 2 <= row[1] <= MAX_THREADS
                and type(row[2]) is bool):
            raise ValueError("a split decision is not [geometry, threads, keep]")
        out.splits[_geometry(row[0]), row[1]] = row[2]
    for row in verdicts:
        if not (isinstance(row, list) and len(row) == 4 and is_sha256_hex(row[0]) and _small_int(row[1])
                and 2 <= row[1] <= MAX_THREADS and _small_int(row[2]) and row[2] <= MAX_PLAN
                and type(row[3]) in (int, float) and 0 < row[3] <= MAX_HANDOFF_US):
            raise ValueError("a verdict is not [structure digest, threads, plan, handoff us]")
        out.verdicts[row[0], row[1]] = (row[2], float(row[3]))
    return out


def _flat(geom: Geometry) -> list[int]:
    return [v for part in geom for v in (part if isinstance(part, tuple) else (part,))]


def _geometry(flat) -> Geometry:
    """A Geometry from its :func:`_flat` form (19 integers), or ValueError."""
    if not (isinstance(flat, list) and len(flat) == 11 + sum(n - 1 for n in _GEOMETRY_TUPLES.values())
            and all(_small_int(v) for v in flat)):
        raise ValueError("a geometry is not 19 integers")
    out, i = [], 0
    for pos in range(11):
        n = _GEOMETRY_TUPLES.get(pos)
        out.append(tuple(flat[i:i + n]) if n else flat[i])
        i += n or 1
    return tuple(out)


def _small_int(v) -> bool:
    return type(v) is int and 0 <= v < _MAX_INT
