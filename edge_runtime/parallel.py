"""Parallel native compilation: the model's one module, split by kernel, compiled in worker processes.

LLVM spends nearly all of a cold compile optimising and generating code for kernels that never
call each other (0.3-0.9 s each for ResNet-18's convolutions), and llvmlite serialises every call
behind one lock, so threads cannot help: forked workers can. The lowering still produces one
module (its text is the unit that is printed, hashed and cross-compiled); only here is its text
cut into parts: part 0 keeps the entry points and their globals, every other part a share of the
kernel groups (``k<i>_<op>`` plus helpers named ``k<i>_...``), balanced by size. Kernel wrappers
become external so the entry's part can call them; MCJIT links the objects in one engine.
"""

from __future__ import annotations

import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor

from ..compiler.target import Target

_DEFINE = re.compile(r'^define (internal )?(.*?)@"([^"]+)"\((.*)\)(.*)$')
_GROUP = re.compile(r"^(k\d+)_")
_WRAPPER = re.compile(r"^k\d+_[A-Za-z0-9]+$")  # what the lowering calls from the entry point
MIN_SPLIT_BYTES = 200_000  # below this a fork costs more than it saves


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


def split_module(ir_text: str, parts: int) -> list[str]:
    """Cut the module text into at most ``parts`` self-contained modules (part 0: entry points)."""
    header, singles, funcs = _items(ir_text)
    groups: dict[str, list[tuple[str, list[str]]]] = {}
    entry_funcs = []
    for name, body in funcs:
        m = _GROUP.match(name)
        (groups.setdefault(m.group(1), []) if m else entry_funcs).append((name, body))
    if parts < 2 or len(groups) < 2:
        return [ir_text]
    bins: list[list[tuple[str, list[str]]]] = [[] for _ in range(min(parts, len(groups)))]
    sizes = [sum(len(b) for _, b in entry_funcs)] + [0] * (len(bins) - 1)
    bins[0].extend(entry_funcs)
    for key in sorted(groups, key=lambda k: -sum(len(b) for _, b in groups[k])):  # largest first
        target = min(range(len(bins)), key=lambda k: sizes[k])
        bins[target].extend(groups[key])
        sizes[target] += sum(len(b) for _, b in groups[key])
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


def _compile_part(ir_text: str, target: Target) -> bytes:
    from .jit import emit_object

    return emit_object(ir_text, target, jit=True)


def workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def emit_objects(ir_text: str, target: Target, jobs: int | None = None) -> list[bytes]:
    """Host objects for ``ir_text``: one, or one per part compiled in ``jobs`` forked workers."""
    from .jit import emit_object

    jobs = workers() if jobs is None else jobs
    if jobs < 2 or len(ir_text) < MIN_SPLIT_BYTES or "fork" not in multiprocessing.get_all_start_methods():
        return [emit_object(ir_text, target, jit=True)]
    parts = split_module(ir_text, jobs)
    if len(parts) == 1:
        return [emit_object(ir_text, target, jit=True)]
    with ProcessPoolExecutor(max_workers=min(jobs, len(parts)), mp_context=multiprocessing.get_context("fork")) as pool:
        return list(pool.map(_compile_part, parts, [target] * len(parts)))
