"""A helper process for parallel cold compiles: IR text in on stdin, a host object file out on stdout.

Started with ``python -m cuvil.edge_runtime.llvm_worker`` (spawned, never forked: safe in a process
that runs gRPC or ONNX Runtime threads). Input: one JSON line describing the Target, then the
module text. Exit status 0 with the object bytes, or 1 with a one-line reason on stderr.
"""

from __future__ import annotations

import json
import sys

from ..compiler.target import Target, TargetKind


def target_to_json(target: Target) -> str:
    return json.dumps({"name": target.name, "triple": target.triple, "cpu": target.cpu,
                       "features": list(target.features), "vector_bits": target.vector_bits,
                       "kind": target.kind.value, "gpu_arch": target.gpu_arch})


def target_from_json(text: str) -> Target:
    d = json.loads(text)
    return Target(d["name"], d["triple"], d["cpu"], tuple(d["features"]), d["vector_bits"], TargetKind(d["kind"]),
                  d["gpu_arch"])


def main() -> int:
    from .jit import emit_object

    data = sys.stdin.buffer.read()
    if not data:
        return 0  # not needed after all: the parent closed the pipe
    try:
        head, _, ir_text = data.partition(b"\n")
        obj = emit_object(ir_text.decode(), target_from_json(head.decode()), jit=True)
    except Exception as e:  # noqa: BLE001 — reported to the parent, which compiles the part itself
        print(f"{type(e).__name__}: {e}".splitlines()[0], file=sys.stderr)
        return 1
    sys.stdout.buffer.write(obj)
    sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
