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

from ..compiler.target import Target
from .llvm_worker import command, target_to_json

_DEFINE = re.compile(r'^define (internal )?(.*?)@"([^"]+)"\((.*)\)(.*)$')
_GROUP = re.compile(r"^(k\d+)_")
_WRAPPER = re.compile(r"^k\d+_[A-Za-z0-9]+$")  # what the lowering calls from the entry point
MIN_SPLIT_BYTES = 200_000  # below this a helper costs more than it saves
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


def split_module(ir_text: str, parts: int) -> list[str]:
    """Cut the module text into at most ``parts`` self-contained modules (part 0: entry points)."""
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
    if parts < 2 or len(clusters) < 2:
        return [ir_text]
    bins: list[list[tuple[str, list[str]]]] = [[] for _ in range(min(parts, len(clusters)))]
    sizes = [sum(len(b) for _, b in entry_funcs)] + [0] * (len(bins) - 1)
    bins[0].extend(entry_funcs)

    def members(cluster):
        return [m for key in cluster[0] for m in groups[key]] + [(n, helpers[n]) for n in sorted(cluster[1])]

    for cluster in sorted(clusters, key=lambda c: -sum(len(b) for _, b in members(c))):  # largest first
        target = min(range(len(bins)), key=lambda k: sizes[k])
        bins[target].extend(members(cluster))
        sizes[target] += sum(len(b) for _, b in members(cluster))
    wrappers = {name: body[0] for members in groups.values() for name, body in members if _WRAPPER.match(name)}
    out = []
    for k, members in enumerate(bins):
        text = "\n".join(line for _, body in members for line in body)
        here = {name for name, _ in members}
        lines = list(header)
        lines += [s for s in singles if s.startswith("declare ") or (s.split(" ", 1)[0] in text)]
        if k == 0:
            lines += [_declaration(d) for name, d in wrappers.items() if name not in here]
        for name, body in members:
            first = body[0].replace("define internal ", "define ", 1) if name in wrappers else body[0]
            lines += [first] + body[1:]
        out.append("\n".join(lines) + "\n")
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

    def compile(self, parts: list[str], target: Target) -> list[bytes]:
        """parts[0] here, parts[1:] in the helpers (a helper that fails: that part here too)."""
        from .jit import emit_object

        head = (target_to_json(target) + "\n").encode()
        results: list[bytes | None] = [None] * len(parts)
        errors: list[str | None] = [None] * len(parts)

        def remote(i: int, proc: subprocess.Popen) -> None:
            try:
                out, err = proc.communicate(head + parts[i].encode(), timeout=HELPER_TIMEOUT_S)
                if proc.returncode == 0 and out:
                    results[i] = out
                else:
                    errors[i] = err.decode(errors="replace").strip()
            except (OSError, subprocess.TimeoutExpired) as e:
                proc.kill()
                errors[i] = str(e)

        threads = [threading.Thread(target=remote, args=(i, p), daemon=True)
                   for i, p in zip(range(1, len(parts)), self.procs)]
        for t in threads:
            t.start()
        results[0] = emit_object(parts[0], target, jit=True)
        for t in threads:
            t.join()
        return [r if r is not None else emit_object(parts[i], target, jit=True) for i, r in enumerate(results)]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for f in (p.stdin, p.stdout, p.stderr):
                if f is not None:
                    f.close()
        self.procs = []

    def __enter__(self) -> Helpers:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def emit_objects(ir_text: str, target: Target, helpers: Helpers | None = None) -> list[bytes]:
    """Host objects for ``ir_text``: one, or one per part when helper processes are there to share it."""
    from .jit import emit_object

    n = 1 + len(helpers.procs) if helpers is not None else 1
    if n < 2 or len(ir_text) < MIN_SPLIT_BYTES:
        return [emit_object(ir_text, target, jit=True)]
    parts = split_module(ir_text, n)
    if len(parts) == 1:
        return [emit_object(ir_text, target, jit=True)]
    return helpers.compile(parts, target)
