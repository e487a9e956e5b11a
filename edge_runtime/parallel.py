"""Parallel native compilation: the model's one module, split by kernel, compiled in helper processes.

LLVM spends nearly all of a cold compile optimising and generating code for kernels that never
call each other (0.3-0.9 s each for ResNet-18's convolutions), and llvmlite serialises every call
behind one lock, so threads cannot help: other processes can. They are spawned (``llvm_worker``),
not forked, so a process running gRPC or ONNX Runtime threads may use them too. The lowering still
produces one module (its text is the unit that is printed, hashed and cross-compiled); only here
is its text cut into parts: part 0 keeps the entry points and their globals, every other part a
share of the kernel groups (``k<i>_<op>`` plus helpers named ``k<i>_...``, and the shared internal
helpers they call), balanced by size. Kernel wrappers become external so the entry's part can call
them; MCJIT links the objects in one engine.
"""

from __future__ import annotations

import os
import re
import subprocess
import threading
from dataclasses import dataclass

from ..compiler.codegen.irhelpers import PREVECTORIZED
from ..compiler.target import Target
from .jit import SPEED_LEVEL as FULL_LEVEL
from .jit import emit_object
from .llvm_worker import command, read_objects, target_to_json, write_modules

_DEFINE = re.compile(r'^define (internal )?(.*?)@"([^"]+)"\((.*)\)(.*)$')
_GROUP = re.compile(r"^(k\d+)_")
_WRAPPER = re.compile(r"^k\d+_[A-Za-z0-9]+$")  # what the lowering calls from the entry point
MIN_SPLIT_BYTES = 200_000  # below this a helper costs more than it saves
_LIGHT_ATTR = f'"{PREVECTORIZED}"'
LIGHT_LEVEL = 0  # prevectorized kernels: no module optimizer, code generation at full level (same speed, measured)
LIGHT_COST = 0.4  # their LLVM time per byte of IR against the full pipeline's (ResNet-18, MobileNetV2: 0.35-0.45)
HELPER_TIMEOUT_S = 600


def _items(ir_text: str) -> tuple[list[str], list[str], list[tuple[str, list[str]]]]:
    """(header lines, single-line declarations and globals, [(function name, lines)])."""
    header, singles, funcs = [], [], []
    lines = ir_text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("define "):
            j = lines.index("}", i)
            funcs.append((_DEFINE.match(line).group(3), lines[i:j + 1]))
            i = j + 1
            continue
        if line.startswith(("declare ", "@")):
            singles.append(line)
        elif line.strip():
            header.append(line)
        i += 1
    return header, singles, funcs


def _declaration(define_line: str) -> str:
    m = _DEFINE.match(define_line)
    return f'declare {m.group(2)}@"{m.group(3)}"({m.group(4)})'


def _calls(body: list[str], names: set[str]) -> set[str]:
    return {n for n in names if any(f'@"{n}"' in line for line in body[1:])}


def _clusters(groups: dict[str, list], helpers: dict[str, list[str]]) -> list[tuple[list[str], set[str]]]:
    """Kernel groups that share an internal helper (a Winograd stage, its GEMM) go together, with the
    helpers they need (transitively): a helper is compiled once, in the one part that calls it."""
    names = set(helpers)
    needs = {}
    for key, members in groups.items():
        seen: set[str] = set()
        todo = set().union(*(_calls(body, names) for _, body in members))
        while todo:
            n = todo.pop()
            seen.add(n)
            todo |= _calls(helpers[n], names) - seen
        needs[key] = seen
    clusters: list[tuple[list[str], set[str]]] = []
    for key in groups:
        joined = [c for c in clusters if c[1] & needs[key]]
        keys, used = [key], set(needs[key])
        for c in joined:
            keys, used = c[0] + keys, used | c[1]
            clusters.remove(c)
        clusters.append((keys, used))
    return clusters


@dataclass(frozen=True)
class Part:
    """One self-contained module, the module optimizer level it gets, and the process that compiles it (0: this one)."""

    text: str
    speed_level: int
    worker: int


def _light(keys: list[str], groups: dict[str, list[tuple[str, list[str]]]]) -> bool:
    """A cluster skips the module optimizer when every kernel group in it has a prevectorized function."""
    return all(any(_LIGHT_ATTR in body[0] for _, body in groups[key]) for key in keys)


def split_module(ir_text: str, parts: int) -> list[Part]:
    """Cut the module text into self-contained modules for ``parts`` processes (part 0: entry points).

    Clusters of prevectorized kernels (:data:`PREVECTORIZED`) go to modules of their own compiled
    at ``LIGHT_LEVEL``; the rest at the full level. Each process gets at most one module of each
    level, balanced by estimated LLVM time. The module is returned whole when there is nothing to cut.
    """
    header, singles, funcs = _items(ir_text)
    groups: dict[str, list[tuple[str, list[str]]]] = {}
    entry_funcs, helpers = [], {}
    for name, body in funcs:
        m = _GROUP.match(name)
        if m:
            groups.setdefault(m.group(1), []).append((name, body))
        elif body[0].startswith("define internal "):
            helpers[name] = body
        else:
            entry_funcs.append((name, body))
    clusters = _clusters(groups, helpers)

    def members(cluster):
        return [m for key in cluster[0] for m in groups[key]] + [(n, helpers[n]) for n in sorted(cluster[1])]

    light = [_light(c[0], groups) for c in clusters]
    workers_ = max(1, min(parts, len(clusters)))
    if not any(light) and (workers_ < 2 or len(clusters) < 2):
        return [Part(ir_text, FULL_LEVEL, 0)]
    bins: dict[tuple[int, bool], list[tuple[str, list[str]]]] = {(0, False): list(entry_funcs)}
    cost = [sum(len(b) for _, b in entry_funcs)] + [0] * (workers_ - 1)
    weighted = [(sum(len(b) for _, b in members(c)) * (LIGHT_COST if lt else 1.0), c, lt) for c, lt in zip(clusters, light)]
    for w, cluster, lt in sorted(weighted, key=lambda x: -x[0]):  # largest first
        k = min(range(workers_), key=lambda i: cost[i])
        bins.setdefault((k, lt), []).extend(members(cluster))
        cost[k] += w
    wrappers = {name: body[0] for members_ in groups.values() for name, body in members_ if _WRAPPER.match(name)}
    out = []
    for (k, lt), members_ in sorted(bins.items()):
        text = "\n".join(line for _, body in members_ for line in body)
        here = {name for name, _ in members_}
        lines = list(header)
        lines += [s for s in singles if s.startswith("declare ") or (s.split(" ", 1)[0] in text)]
        if (k, lt) == (0, False):
            lines += [_declaration(d) for name, d in wrappers.items() if name not in here]
        for name, body in members_:
            first = body[0].replace("define internal ", "define ", 1) if name in wrappers else body[0]
            lines += [first] + body[1:]
        out.append(Part("\n".join(lines) + "\n", LIGHT_LEVEL if lt else FULL_LEVEL, k))
    return out


def workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


class Helpers:
    """LLVM helper processes, started before lowering so their start-up (llvmlite, ~0.1 s) overlaps the Python lowering instead of adding to the cold compile."""

    def __init__(self, count: int):
        cmd = command()
        self.procs: list[subprocess.Popen] = []
        for _ in range(max(0, count)):
            try:
                self.procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                   stderr=subprocess.PIPE))
            except OSError:
                break  # no helper: the parts are compiled here

    def compile(self, parts: list[Part], target: Target) -> list[bytes]:
        """Worker 0's parts here, the others' in the helpers (a helper that fails: its parts here too)."""
        results: list[bytes | None] = [None] * len(parts)
        errors: list[str | None] = [None] * len(parts)
        mine = {w: [i for i, p in enumerate(parts) if p.worker == w] for w in range(1 + len(self.procs))}

        def remote(w: int, proc: subprocess.Popen) -> None:
            idx = mine[w]
            try:
                out, err = proc.communicate(write_modules(target, [(parts[i].speed_level, parts[i].text) for i in idx]),
                                            timeout=HELPER_TIMEOUT_S)
                objs = read_objects(out) if proc.returncode == 0 else None
                if objs is not None and len(objs) == len(idx):
                    for i, o in zip(idx, objs):
                        results[i] = o
                else:
                    errors[idx[0]] = err.decode(errors="replace").strip()
            except (OSError, subprocess.TimeoutExpired) as e:
                proc.kill()
                errors[idx[0]] = str(e)

        threads = [threading.Thread(target=remote, args=(w, p), daemon=True)
                   for w, p in enumerate(self.procs, start=1) if mine.get(w)]
        for t in threads:
            t.start()
        for i in mine[0]:
            results[i] = emit_object(parts[i].text, target, jit=True, speed_level=parts[i].speed_level)
        for t in threads:
            t.join()
        return [r if r is not None else emit_object(p.text, target, jit=True, speed_level=p.speed_level)
                for r, p in zip(results, parts)]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for f in (p.stdin, p.stdout, p.stderr):
                if f is not None:
                    try:
                        f.close()
                    except OSError:  # a dead helper's stdin: its unflushed bytes have nowhere to go
                        pass
        self.procs = []

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def emit_objects(ir_text: str, target: Target, helpers: Helpers | None = None) -> list[bytes]:
    """Host objects for ``ir_text``: prevectorized kernels apart (:data:`LIGHT_LEVEL`), and the work
    shared with the helper processes when there are any and the module is big enough to gain."""
    n = 1 + len(helpers.procs) if helpers is not None and len(ir_text) >= MIN_SPLIT_BYTES else 1
    parts = split_module(ir_text, n)
    if n > 1 and helpers is not None:
        return helpers.compile(parts, target)
    return [emit_object(p.text, target, jit=True, speed_level=p.speed_level) for p in parts]
