"""Kernels compiled while the lowering goes on: each finished kernel group goes to LLVM at once.

A cold compile used to lower the whole model in Python (one core busy), print it, and only then
hand it to LLVM. Here the lowering reports each node it finished (``lower(..., stream=)``); the
kernel groups it added (``k<i>_...`` plus the internal helpers they call) are printed once and
batched into modules (prevectorized ones apart, at :data:`.levels.LIGHT_LEVEL` or, sums in stack
slots, :data:`.levels.SLOTS_LEVEL`), and consumers take those modules meanwhile: each helper
process (:mod:`.llvm_worker`, one module at a time) or, with none, a thread of this process
(llvmlite releases the GIL inside LLVM). With helpers, LLVM
never runs in this process (its code pages would add ~30 MiB to a cold compile's peak): the entry
points' module is queued too when lowering ends. With none, this process compiles the entry
points' module, then takes queued modules too. The tuner's candidate kernels go the same way
(:meth:`KernelStream.submit`), so their LLVM work runs on the helper while the next candidate's IR
is built here. The entry point is printed as it grows, its calls leaving its block node by node
(LSTM KWS's 4,543 instructions held ~3 MiB to the end of lowering), and every ``RELEASE_EVERY`` nodes
the heap pages of the weights the lowering freed go back to the system (:mod:`.heap`). A batch is closed
when it holds ``MIN_PART_BYTES`` (its groups and the helpers they call), or at ``MAX_PART_BYTES``; a group
that calls a shared internal helper (a Winograd stage, a rows conv's sums, the body that a split conv's parts
share) keeps its batch open, since the next group usually calls it too, until a group comes that calls none
of the batch's helpers: a helper that two batches call is compiled in both, internal as in one module, so
each kernel's code is the same as without streaming. Sizes alone close batches, never how busy the
consumers are, so one plan always gives the same objects (closing on an idle consumer split ResNet-18 differently from
compile to compile; a tuned session that kept every choice then ran other code than the untuned one).
A plan built again in the same compile (the split check's next) closes its batches where the build
before did, and takes the objects of the modules whose text is unchanged from it (:class:`Reuse`).
"""

from __future__ import annotations

import io
import mmap
import re
import threading
import time
from collections import deque

from llvmlite import ir

from ..compiler.codegen.irtext import drop_body, function_text, take_instructions
from ..compiler.digest import sha256
from ..compiler.target import Target
from . import heap
from .levels import ENTRY_LEVEL, FULL_LEVEL, LIGHT_LEVEL, SLOTS_LEVEL
from .llvm_worker import frame, read_module, read_object, target_to_json
from .parallel import HELPER_TIMEOUT_S, LIGHT_ATTR, SLOTS_ATTR, Helpers, workers

RELEASE_EVERY = 16  # nodes: the weights the lowering freed meanwhile go back to the system (:mod:`.heap`)
MIN_PART_BYTES = 150_000  # fewer, larger modules: each is an object a warm start loads
MAX_PART_BYTES = 600_000
FULL_COST = {FULL_LEVEL: 3.0, LIGHT_LEVEL: 1.0, SLOTS_LEVEL: 1.0}
"""LLVM time per byte by speed level, relative (the module optimizer's: MobileNetV3-ish on a Xeon, 1.2-2.0 ms
per kB at the full level against 0.4-0.6 prevectorized), to queue the longest module first."""
TAIL_MIN_S = 0.15
"""LLVM seconds queued per helper when lowering ends that are worth a helper more (:meth:`KernelStream._tail_helper`):
a little over its ~0.12 s start (at 0.25, ResNet-18's 0.18-0.27 s mostly got none: 0.96x its wall at 0.15, Zen 4)."""
_REF = re.compile(r'@"([^"]+)"')
_DEFINE = re.compile(r'^define (internal )?(.*?)@"([^"]+)"\((.*)\)(.*)$')
_GROUP = re.compile(r"^(k[0-9a-f]+)_")  # a kernel and the functions of its own: k<digest>_... (lowering.kernel_name)
_WRAPPER = re.compile(r"^k[0-9a-f]+_[A-Za-z0-9]+$")  # what the lowering calls from the entry point
LEVELS = {LIGHT_ATTR: LIGHT_LEVEL, SLOTS_ATTR: SLOTS_LEVEL, None: FULL_LEVEL}
"""A kernel group's speed level by the first of these attributes on a member's define line."""


def _level(members: list[tuple[str, str]]) -> int:
    heads = [text.split("\n", 1)[0] for _, text in members]
    return next(level for attr, level in LEVELS.items() if attr is None or any(attr in h for h in heads))


class Reuse:
    """What one compile's builds hand on to its next: each model module's object by a digest of its text, and
    the kernel groups the last build closed a module after (and saw). The split check's next plan changes
    only its split layers' kernels; named by what they compute (``lowering.kernel_name``), the others print
    the same text, and a rebuild that closes its modules where the build before did (:meth:`KernelStream.
    _closes`) gets the same modules, whose objects need no LLVM again."""

    def __init__(self) -> None:
        self.objects: dict[bytes, bytes] = {}
        self.closed_after: set[str] = set()
        self.groups: set[str] = set()


def _groups(members: list[tuple[str, str]]) -> list[str]:
    """The kernel group of each member of a batch, in order."""
    return [_GROUP.match(n).group(1) for n, _ in members]


def _digest(level: int, module: str | bytearray) -> bytes:
    h = sha256(str(level).encode())
    h.update(module.encode() if isinstance(module, str) else module)
    return h.digest()


def _printed(fn: ir.Function) -> str:
    """``fn``'s text, its body then dropped (:func:`~cuvil.compiler.codegen.irtext.drop_body`): its
    instructions are most of the memory a cold compile's peak holds in Python."""
    text = function_text(fn)
    drop_body(fn)
    return text


class KernelStream:
    """``lower``'s stream hook: call it with the module after each node; :meth:`finish` returns the objects."""

    def __init__(self, target: Target, helpers: Helpers | None = None, reuse: Reuse | None = None) -> None:
        self.target = target
        self.reuse = reuse
        self.closed_before = reuse.closed_after if reuse else set()  # the build before's (:class:`Reuse`)
        self.groups_before = reuse.groups if reuse else set()
        self.reused = 0  # modules whose object a build before made (:class:`Reuse`)
        self.closed_after: set[str] = set()  # this build's: the groups a module ended with, and all it had
        self.groups: set[str] = set()
        self.seen = 0
        self.calls = 0
        self.header: list[str] = []
        self.singles: list[str] = []  # declarations and global variables, printed
        self.helpers: dict[str, str] = {}  # shared internal functions, printed
        self.helper_refs: dict[str, set[str]] = {}  # the globals each of them names
        self.wrappers: dict[str, str] = {}  # streamed kernels' define lines (the entry declares them)
        self.entry: dict[str, list[str]] = {}  # external non-kernel functions: their text taken so far (see __call__)
        self.batch: dict[int, list[tuple[str, str]]] = {level: [] for level in LEVELS.values()}
        self.calls_of: dict[int, set[str]] = {level: set() for level in LEVELS.values()}  # helpers each batch calls
        self.texts: list[tuple[int, str | bytearray]] = []  # (speed level, the module; framed for helpers: frame())
        self.results: list[bytes | mmap.mmap | None] = []  # a helper's object mapped until taken (_taken)
        self.seconds: list[float] = []  # LLVM time of each module (a helper's: its round trip)
        self.kernels: list[int] = []  # the modules of the model (the rest: the tuner's candidates)
        self.lost: set[int] = set()  # taken by a consumer that failed: compiled here
        self.todo: deque[int] = deque()
        self.closed = False
        self.cv = threading.Condition()
        self.digests: list[bytes | None] = []  # a model module's digest, for :class:`Reuse`
        self.sizes: list[int] = []  # each module's bytes: with :attr:`seconds`, the rate a tail helper is judged by
        self.processes = helpers
        procs = list(helpers.procs) if helpers is not None else []
        self.remote = bool(procs)  # then LLVM never runs in this process (see :meth:`finish`)
        self.threads = [threading.Thread(target=self._remote, args=(p,), daemon=True) for p in procs] or \
                       [threading.Thread(target=self._local, daemon=True)]
        for t in self.threads:
            t.start()

    @property
    def workers(self) -> int:
        """LLVM compiles that run at once: one per helper process, else this process's one thread."""
        return len(self.threads)

    def __call__(self, module: ir.Module) -> None:
        self.module = module
        if not self.header:
            self.header = [f'; ModuleID = "{module.name}"', f'target triple = "{module.triple}"',
                           f'target datalayout = "{module.data_layout}"', ""]
        names = list(module.globals)
        groups: dict[str, list[tuple[str, str]]] = {}
        for name in names[self.seen:]:
            v = module.globals[name]
            if not isinstance(v, ir.Function) or not v.blocks:
                self.singles.append(str(v))
            elif (m := _GROUP.match(name)) is not None:
                groups.setdefault(m.group(1), []).append((name, _printed(v)))
            elif v.linkage == "internal":
                self.helpers[name] = _printed(v)
                self.helper_refs[name] = set(_REF.findall(self.helpers[name]))
            else:
                self.entry[name] = []
        self.seen = len(names)
        for name, taken in self.entry.items():  # the entry's calls so far: printed, then let go
            if len((fn := module.globals[name]).blocks) == 1:
                taken.append(take_instructions(fn))
        self.calls += 1
        if self.calls % RELEASE_EVERY == 0:  # packed, each weight's pages would stay beside its copy in the block
            heap.release()
        for group, members in groups.items():
            level, calls = _level(members), self._helpers_of(t for _, t in members)
            if group in self.groups_before and any(g not in self.groups_before for g in _groups(self.batch[level])):
                self._flush(level)  # a changed stretch ends: the module holding it closes before
            elif group not in self.groups_before and self._size(level) >= MIN_PART_BYTES and \
                    not calls & self.calls_of[level]:
                self._flush(level)  # kept open for a helper this group does not call
            self.batch[level] += members
            self.calls_of[level] |= calls
            self.groups.add(group)
            for name, text in members:
                if _WRAPPER.match(name):
                    self.wrappers[name] = text.split("\n", 1)[0]
            if self._closes(group, level, calls):
                self._flush(level)

    def _size(self, level: int) -> int:
        """The batch's module's size: its members and the helpers they call (a Winograd or split conv's code)."""
        return sum(len(t) for _, t in self.batch[level]) + sum(len(self.helpers[n]) for n in self.calls_of[level])

    def _closes(self, group: str, level: int, calls: set[str]) -> bool:
        """Whether the batch closes after ``group``: at ``MAX_PART_BYTES``; where the build before closed one after
        it (a group that build had: its modules again); else at ``MIN_PART_BYTES`` unless the group calls a shared
        helper (``calls``; then at a group that calls none of the batch's helpers: :meth:`__call__`)."""
        size = self._size(level)
        if size >= MAX_PART_BYTES or group in self.closed_before:
            return True
        if group in self.groups_before:
            return False
        return size >= MIN_PART_BYTES and not calls

    def _helpers_of(self, texts) -> set[str]:
        """The internal helpers that ``texts`` call, directly or through other helpers."""
        need, todo = set(), {r for t in texts for r in _REF.findall(t) if r in self.helpers}
        while todo:
            n = todo.pop()
            need.add(n)
            todo |= {r for r in self.helper_refs[n] if r in self.helpers} - need
        return need

    def _module(self, members: list[tuple[str, str]], extra: list[str] = (), calls: set | None = None) -> list[str]:
        """A self-contained module, as pieces that newlines join (:func:`~.llvm_worker.frame`): ``members``, the
        internal helpers they call (transitively; ``calls`` where a batch has them already), the declarations and
        the globals they name; kernel wrappers external, so the entry can call them."""
        body = [t.replace("define internal ", "define ", 1) if _WRAPPER.match(n) else t for n, t in members]
        body += [self.helpers[n] for n in sorted(self._helpers_of(body) if calls is None else calls)]
        singles = [s for s in self.singles if s.startswith("declare ") or any(s.split(" ", 1)[0] in t for t in body)]
        return self.header + singles + list(extra) + body + [""]

    def _flush(self, level: int) -> None:
        members, calls = self.batch[level], self.calls_of[level]
        self.batch[level], self.calls_of[level] = [], set()
        if members:
            self.kernels.append(self.submit(level, self._module(members, calls=calls), reusable=True))
            self.closed_after.add(_groups(members)[-1])

    def submit(self, level: int, text: str | list[str], reusable: bool = False) -> int:
        """Queue a self-contained module, whole or as pieces that newlines join (the tuner's candidates come this
        way too); its index for :meth:`result`. ``reusable``: a model's module, whose object a build before in
        the same compile may have made already (:class:`Reuse`), and a later one may take."""
        if self.remote:
            module = frame(level, text)  # encoded here, not on a reader thread's heap
        else:
            module = text if isinstance(text, str) else "\n".join(text)
        digest = _digest(level, module) if reusable and self.reuse is not None else None
        made = self.reuse.objects.get(digest) if digest is not None else None
        with self.cv:
            self.texts.append((level, module) if made is None else (0, ""))
            self.digests.append(digest)
            self.sizes.append(len(module))
            self.results.append(made)
            self.seconds.append(0.0)
            if made is None:
                self.todo.append(len(self.texts) - 1)
                self.cv.notify()
            else:
                self.reused += 1
            return len(self.texts) - 1

    def result(self, i: int) -> bytes:
        """Module ``i``'s object: waited for from a helper process; without one, compiled here if the
        local thread has not taken it yet."""
        with self.cv:
            mine = not self.remote and i in self.todo
            if mine:
                self.todo.remove(i)
            if not mine:
                self.cv.wait_for(lambda: self.results[i] is not None or i in self.lost, HELPER_TIMEOUT_S)
        if self.results[i] is None:
            self._compile(i)
        return self._taken(i)

    def _taken(self, i: int) -> bytes:
        """Module ``i``'s object as bytes on the calling thread's heap; a helper's arrives mapped
        (:func:`.llvm_worker.read_object`), and its mapping goes once copied."""
        obj = self.results[i]
        if isinstance(obj, mmap.mmap):
            self.results[i] = obj[:]
            obj.close()
        return self.results[i]

    def _done(self, i: int, obj: bytes | None, seconds: float) -> None:
        with self.cv:
            if obj is None:
                self.lost.add(i)
            else:  # its text is not needed again: freed as the compile goes on
                self.results[i], self.seconds[i], self.texts[i] = obj, seconds, (0, "")
            self.cv.notify_all()

    def _take(self) -> int | None:
        with self.cv:
            while not self.todo and not self.closed:
                self.cv.wait()
            return self.todo.popleft() if self.todo else None

    def _compile(self, i: int) -> None:
        level, text = self.texts[i]
        if isinstance(text, bytearray):  # framed for a helper that lost it
            level, text = read_module(io.BytesIO(text))
        t0 = time.perf_counter()
        obj = self._emit(text, level)
        self._done(i, obj, time.perf_counter() - t0)

    def _emit(self, text: str, level: int) -> bytes:
        """LLVM in this process: :mod:`.jit` (llvmlite's library, ~40 MiB resident) is imported only
        here, so a compile whose helpers deliver every module never loads it."""
        from .jit import emit_object

        return emit_object(text, self.target, jit=True, speed_level=level)

    def _local(self) -> None:
        while (i := self._take()) is not None:
            try:
                self._compile(i)
            except Exception:  # noqa: BLE001 — result() or finish() compiles it again and raises there
                self._done(i, None, 0.0)

    def _remote(self, proc) -> None:
        """Feed one helper process a module at a time; on any failure stop (what it held is compiled here)."""
        i = None
        try:
            proc.stdin.write((target_to_json(self.target) + "\n").encode())
            proc.stdin.flush()
            while (i := self._take()) is not None:
                t0 = time.perf_counter()
                proc.stdin.write(self.texts[i][1])
                proc.stdin.flush()
                obj = read_object(proc.stdout, mapped=True)
                self._done(i, obj, time.perf_counter() - t0)
                if obj is None:
                    return
        except (OSError, ValueError):
            if i is not None:
                self._done(i, None, 0.0)

    def close(self) -> None:
        """No more modules: idle consumers end (also when lowering failed)."""
        with self.cv:
            self.closed = True
            self.cv.notify_all()

    def __enter__(self) -> KernelStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def finish(self) -> list[bytes]:
        """Queue what is left and return every object (a module no consumer delivered is compiled
        here). With helper processes the entry points' module is queued too and this process waits:
        LLVM run here would fault in ~30 MiB of its code pages (ResNet-18's cold peak 268 -> 240 MiB);
        with none, the entry is compiled here and this thread helps drain the queue."""
        module = self.module
        self(module)
        for level in LEVELS.values():
            self._flush(level)
        entry = [(n, function_text(module.globals[n], "".join(taken))) for n, taken in self.entry.items()]
        declared = [f'declare {m.group(2)}@"{m.group(3)}"({m.group(4)})'
                    for m in map(_DEFINE.match, self.wrappers.values())]
        text = self._module(entry, declared)
        del module, entry
        self.module, self.helpers, self.singles = None, {}, []  # the IR objects (tens of MB) go before LLVM runs here
        if self.remote:
            first = self.submit(ENTRY_LEVEL, text)
            del text
            with self.cv:  # the longest first: the entry, queued last, no longer ends the tail alone
                self.todo = deque(sorted(self.todo, key=lambda i: -self.sizes[i] * FULL_COST[self.texts[i][0]]))
            self._tail_helper()
            return self._collect([first] + self.kernels)
        objs = [self._emit("\n".join(text), ENTRY_LEVEL)]
        del text
        while True:
            with self.cv:
                i = next((k for k in self.todo if k in self.kernels), None)
                if i is not None:
                    self.todo.remove(i)
            if i is None:
                break
            self._compile(i)
        return objs + self._collect(self.kernels)

    def _tail_helper(self) -> None:
        """Lowering is over and this process only waits from here: one helper more takes queued modules when
        they would keep the others busy ``TAIL_MIN_S`` or longer (at this stream's own LLVM seconds per byte
        so far) and a CPU is left for it. It starts in ~0.12 s, and, started only now, it never competes
        with the lowering or the tuner's timings: two helpers from the start slowed ResNet-18's lowering
        more than they saved (docs/performance-log.md). Objects do not depend on who compiles them."""
        with self.cv:
            queued = sum(self.sizes[i] for i in self.todo)
            done = [i for i, r in enumerate(self.results) if r is not None and self.seconds[i]]  # compiled, not reused
        if not done or len(self.threads) >= workers():
            return
        rate = sum(self.seconds[i] for i in done) / max(1, sum(self.sizes[i] for i in done))
        if queued * rate / len(self.threads) < TAIL_MIN_S or (proc := self.processes.spawn()) is None:
            return
        t = threading.Thread(target=self._remote, args=(proc,), daemon=True)
        t.start()
        self.threads.append(t)

    def _collect(self, modules: list[int]) -> list[bytes]:
        self.close()
        for t in self.threads:
            t.join(HELPER_TIMEOUT_S)
        for i in modules:
            if self.results[i] is None:  # lost, or held by a helper that never answered
                self._compile(i)
        objs = [self._taken(i) for i in modules]
        if self.reuse is not None:
            self.reuse.objects.update((self.digests[i], o) for i, o in zip(modules, objs) if self.digests[i] is not None)
            self.reuse.closed_after, self.reuse.groups = self.closed_after, self.groups
        return objs
