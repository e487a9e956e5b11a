"""A helper process for parallel cold compiles: IR text in on stdin, a host object file out on stdout.

Started by :func:`command` (spawned, never forked: safe in a process that runs gRPC or ONNX Runtime
threads); ``python -m cuvil.edge_runtime.llvm_worker`` works too, but imports all of Cuvil first. Input:
optionally a line :data:`~cuvil.devices.llvm_facts.FACTS_REQUEST` (answered at once with LLVM's facts
about this CPU, :func:`~cuvil.devices.llvm_facts.answer_request`: the parent then never loads llvmlite
for them), then one JSON
line describing the Target (:func:`target_to_json`), then modules (:func:`frame`); each is
compiled as it arrives and its object file written at once after its 8-byte length (:func:`read_object`).
Exit status 0, or 1 with a one-line reason on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import struct
import sys
from collections.abc import Sequence
from typing import BinaryIO

from ..compiler.target import ConvChoice, Target, TargetKind
from ..compiler.tuning import Tuning
from ..devices import llvm_facts


def target_to_json(target: Target) -> str:
    """The whole Target (LLVM needs triple, cpu and features; the rest travels so it round-trips)."""
    return json.dumps({"name": target.name, "triple": target.triple, "cpu": target.cpu,
                       "features": list(target.features), "vector_bits": target.vector_bits,
                       "kind": target.kind.value, "gpu_arch": target.gpu_arch,
                       "tuning": dataclasses.asdict(target.tuning),
                       "conv_choices": [[g, dataclasses.astuple(c)] for g, c in target.conv_choices],
                       "threads": target.threads, "conv_parts": [[g, k] for g, k in target.conv_parts]})


def _tuples(v):
    return tuple(_tuples(x) for x in v) if isinstance(v, list) else v


def target_from_json(text: str) -> Target:
    d = json.loads(text)
    return Target(d["name"], d["triple"], d["cpu"], tuple(d["features"]), d["vector_bits"], TargetKind(d["kind"]),
                  d["gpu_arch"], Tuning(**{k: _tuples(v) for k, v in d["tuning"].items()}),
                  tuple((_tuples(g), ConvChoice(*c)) for g, c in d["conv_choices"]), d["threads"],
                  tuple((_tuples(g), k) for g, k in d["conv_parts"]))


def frame(level: int, text: str | Sequence[str]) -> bytearray:
    """One module of a helper's input (after the Target's line): ``<speed level> <bytes>`` and its text,
    given whole or as pieces (joined by newlines here). Encoded straight into one buffer of the exact size:
    a module of a few MiB was held three times over while it was joined, encoded and framed (U-Net's
    cold compile at 2 threads peaked 2 MiB higher for one 1.2 MB module)."""
    pieces = [text] if isinstance(text, str) else text
    sizes = [len(t) if t.isascii() else len(t.encode()) for t in pieces]
    head = f"{level} {sum(sizes) + len(pieces) - 1}\n".encode()
    out = bytearray(len(head) + sum(sizes) + len(pieces) - 1)
    out[:len(head)] = head
    at = len(head)
    for i, (t, n) in enumerate(zip(pieces, sizes)):
        if i:
            out[at] = ord("\n")
            at += 1
        out[at:at + n] = t.encode()
        at += n
    return out


def read_module(stream: BinaryIO) -> tuple[int, str] | None:
    """The next (speed level, module text) of a helper's input; None at its end; ValueError when cut short."""
    line = stream.readline()
    if not line:
        return None
    level, size = (int(v) for v in line.split())
    data = stream.read(size)
    if len(data) != size:
        raise ValueError("module cut short")
    return level, data.decode()


MAX_OBJECT_BYTES = 1 << 30  # one module's object: ResNet-50's largest is a few MiB


def read_object(stream: BinaryIO, mapped: bool = False) -> bytes | mmap.mmap | None:
    """The next object file of a helper's output (after its 8-byte length), or None when cut short or
    longer than ``MAX_OBJECT_BYTES`` (a broken helper's length asks no allocation of that size).
    ``mapped``: read into an anonymous mapping of its own instead of the heap, for a thread that only
    reads (:class:`.stream.KernelStream`): glibc gives each thread a heap whose top it never trims, and
    the objects and module texts a compile's reader thread made kept ~2 MiB of one resident to the end."""
    head = stream.read(8)
    if len(head) != 8:
        return None
    (size,) = struct.unpack("<Q", head)
    if size > MAX_OBJECT_BYTES:
        return None
    if not (mapped and size):
        obj = stream.read(size)
        return obj if len(obj) == size else None
    buf, got = mmap.mmap(-1, size), 0
    view = memoryview(buf)
    while got < size and (n := stream.readinto(view[got:])):
        got += n
    view.release()
    if got != size:
        buf.close()
        return None
    return buf


BOOT = """import importlib, json, sys, types
sys.path[:0] = json.loads(sys.argv.pop(1))
for name, path in zip(sys.argv[1:5], sys.argv[5:9]):
    sys.modules[name] = types.ModuleType(name)
    sys.modules[name].__path__ = [path]
facts = importlib.import_module(sys.argv[3] + ".llvm_facts")
worker = importlib.import_module(sys.argv[4] + ".llvm_worker")
if not worker.asked(sys.stdin):
    worker.warm_up()
sys.exit(worker.main(facts.answer_request(sys.stdin.buffer, sys.stdout.buffer)))
"""


def asked(inp) -> bool:
    """Whether the parent has written to ``inp`` already (True where that cannot be told)."""
    import select

    try:
        return bool(select.select([inp], [], [], 0)[0])
    except (OSError, ValueError):
        return True


def warm_up() -> None:
    """Import jit and ready LLVM's host back end before the first module comes. A helper nobody asked
    for host facts (the parent remembered them) read its first line, the Target, only when the parent's
    lowering began, and then spent ~70 ms on this: ResNet-18's handoff probe, the first module, waited
    115-138 ms for it against 71-81 for a helper that answered the facts."""
    from .jit import init_llvm

    init_llvm(all_targets=False)


def command() -> list[str]:
    """The helper's command line: the packages it needs stand in as bare modules, so their
    ``__init__`` (the whole public API: 0.7 s of CPU and 90 MB per helper) never runs; ``-S`` with
    this process's module path, so ``site`` (``.pth`` files: the editable install's finder, certifi)
    does not run either. It answers a request for host facts having imported only llvmlite and the
    Target (a cold compile may be waiting for them), then imports jit; asked nothing yet, it imports
    jit first (:func:`warm_up`)."""
    root = __package__.rsplit(".", 1)[0]
    packages = (root, f"{root}.compiler", llvm_facts.__package__, __package__)
    return [sys.executable, "-S", "-c", BOOT, json.dumps(sys.path), *packages,
            *(list(sys.modules[p].__path__)[0] for p in packages)]


def main(head: bytes | None = None) -> int:
    """Compile each module as it arrives and write its object at once: the parent sends the next
    module when it has read this one's object (:mod:`.stream`). ``head``: the Target's line when it
    was read already (:func:`~cuvil.devices.llvm_facts.answer_request`); None: read it after jit's
    import (the parent may be busy lowering meanwhile)."""
    from .jit import emit_object

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    head = inp.readline() if head is None else head
    if not head.strip():
        return 0  # not needed after all: the parent closed the pipe
    try:
        target = target_from_json(head.decode())
        while (module := read_module(inp)) is not None:
            obj = emit_object(module[1], target, jit=True, speed_level=module[0])
            out.write(struct.pack("<Q", len(obj)) + obj)
            out.flush()
    except Exception as e:  # noqa: BLE001 — reported to the parent, which compiles the parts itself
        print(f"{type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(llvm_facts.answer_request(sys.stdin.buffer, sys.stdout.buffer)))
