"""A helper process for parallel cold compiles: IR text in on stdin, a host object file out on stdout.

Started by :func:`command` (spawned, never forked: safe in a process that runs gRPC or ONNX Runtime
threads); ``python -m cuvil.edge_runtime.llvm_worker`` works too, but imports all of Cuvil first. Input
(:func:`write_modules`): one JSON line describing the Target, then per module a line ``<speed level>
<bytes>`` and its text; each module is compiled as it arrives and its object file written at once after
its 8-byte length (:func:`read_objects`). Exit status 0, or 1 with a one-line reason on stderr.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import sys

from ..compiler.target import ConvChoice, Target, TargetKind
from ..compiler.tuning import Tuning


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


def write_modules(target: Target, modules: list[tuple[int, str]]) -> bytes:
    """A helper's whole input: the Target, then each (speed level, module text)."""
    out = [(target_to_json(target) + "\n").encode()]
    for level, text in modules:
        data = text.encode()
        out += [f"{level} {len(data)}\n".encode(), data]
    return b"".join(out)


def _read_modules(data: bytes) -> tuple[Target, list[tuple[int, str]]]:
    head, _, rest = data.partition(b"\n")
    modules, pos = [], 0
    while pos < len(rest):
        end = rest.index(b"\n", pos)
        level, size = (int(v) for v in rest[pos:end].split())
        modules.append((level, rest[end + 1:end + 1 + size].decode()))
        pos = end + 1 + size
    return target_from_json(head.decode()), modules


def read_objects(data: bytes) -> list[bytes] | None:
    """The object files of a helper's output, or None when it is cut short."""
    objs, pos = [], 0
    while pos + 8 <= len(data):
        (size,) = struct.unpack_from("<Q", data, pos)
        if pos + 8 + size > len(data):
            return None
        objs.append(data[pos + 8:pos + 8 + size])
        pos += 8 + size
    return objs if pos == len(data) else None


BOOT = """import importlib, sys, types
for name, path in zip(sys.argv[1:4], sys.argv[4:7]):
    sys.modules[name] = types.ModuleType(name)
    sys.modules[name].__path__ = [path]
sys.exit(importlib.import_module(sys.argv[3] + ".llvm_worker").main())
"""


def command() -> list[str]:
    """The helper's command line: the three packages it needs stand in as bare modules, so their
    ``__init__`` (the whole public API: 0.7 s of CPU and 90 MB per helper) never runs; the worker
    itself imports only llvmlite, the Target and jit."""
    root = __package__.rsplit(".", 1)[0]
    packages = (root, f"{root}.compiler", __package__)
    return [sys.executable, "-c", BOOT, *packages, *(list(sys.modules[p].__path__)[0] for p in packages)]


def main() -> int:
    """Compile each module as it arrives and write its object at once, so a parent may stream
    modules (one at a time, waiting for each object) or send them all and read all the objects."""
    from .jit import emit_object

    inp, out = sys.stdin.buffer, sys.stdout.buffer
    head = inp.readline()
    if not head.strip():
        return 0  # not needed after all: the parent closed the pipe
    try:
        target = target_from_json(head.decode())
        while line := inp.readline():
            level, size = (int(v) for v in line.split())
            text = inp.read(size)
            if len(text) != size:
                raise ValueError("module cut short")
            obj = emit_object(text.decode(), target, jit=True, speed_level=level)
            out.write(struct.pack("<Q", len(obj)) + obj)
            out.flush()
    except Exception as e:  # noqa: BLE001 — reported to the parent, which compiles the parts itself
        print(f"{type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
