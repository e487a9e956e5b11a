"""Which machine the tests run on, and which named profiles' code it can execute.

Tests about the shape of generated code compile for a named profile and read that code; tests that
execute code run the profiles this host can execute and skip the others with a reason naming the
hosts that run them. ``python -m tests.hosts`` prints the host line ``scripts/test.sh`` starts with.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cuvil.compiler.target import Target
from cuvil.devices.detect import resolve_profile, resolve_target
from cuvil.edge_runtime.compile import runnable_here

HOST = resolve_target("host")

RUN_ON: dict[str, str] = {
    "x86-avx2": "an x86-64 host with AVX2 and FMA (AMD Zen, Intel Haswell or newer)",
    "x86-avx512": "an AVX-512 host (Intel Xeon Skylake-SP or newer, AMD Zen 4)",
    "x86-avx512-vnni": "an AVX-512 VNNI host (Intel Xeon Cascade Lake or newer, AMD Zen 4)",
}
"""Per executed profile: the build machines whose CPUs run its code (named in skip reasons)."""


def executable(profile: str) -> Target:
    """The named profile's target; the calling test is skipped where this host cannot run its code."""
    target = resolve_target(profile)
    if not runnable_here(target):
        pytest.skip(f"{profile} code does not run on this host ({HOST.cpu}); runs on {RUN_ON.get(profile, profile)}")
    return target


def vector_isa(features: tuple[str, ...]) -> str:
    """The widest vector ISA a feature list enables, with the AVX-512 subsets named."""
    on = {f[1:] for f in features if f.startswith("+")}
    wide = sorted(f for f in on if f.startswith("avx512"))
    if wide:
        return "AVX-512 (" + " ".join(wide) + ")"
    for name, feature in (("AVX2", "avx2"), ("AVX", "avx"), ("SVE", "sve"), ("NEON", "neon"), ("SSE4.2", "sse4.2")):
        if feature in on:
            return name + (" + FMA" if "fma" in on else "")
    return "scalar only"


def describe_host() -> str:
    """One line: the CPU's model name, LLVM's name for it, its vector ISA and the width Cuvil uses."""
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    p = resolve_profile("host")
    width = "scalable" if p.vector_bits is None else f"{p.vector_bits}-bit"
    return f"host: {model} (LLVM cpu {p.cpu}); vector ISA: {vector_isa(p.features)}; Cuvil vectors: {width}"


if __name__ == "__main__":
    print(describe_host())
