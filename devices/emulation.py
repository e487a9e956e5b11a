"""Run a model as a foreign device would: link its object file into a small C harness and run it
under qemu-user with the CPU model of that device.

Emulation proves correctness, never speed: a latency measured here is not a device latency. The
harness keeps the arena and the (read-only) weights between inaccessible pages, so code that reads
or writes outside them dies with SIGSEGV, reported as such, instead of computing on a neighbour's
bytes. The harness reads every example of a run from one file and writes every output to another,
so a whole evaluation dataset (hundreds of examples) costs one qemu start. Object code comes from
the caller (the edge runtime's native compiler, see ``edge_runtime/emulated.py``), so what runs
here is exactly what the device would compile; this module only knows the toolchain, the harness
and qemu.

Toolchain (Debian): ``qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..compiler.codegen.lowered import IOSpec, LoweredModel
from ..compiler.errors import CuvilError, RunTimeCheckError
from ..compiler.ir.dtypes import clean_bools
from ..compiler.target import Target

HARNESS_VERSION = "4"
FAULT_EXIT = 4  # the harness's status when the model set its fault word (LoweredModel.fault_offset)
INSTALL_HINT = "apt-get install qemu-user gcc-aarch64-linux-gnu libc6-dev-arm64-cross"
SVE_LENGTHS = (128, 256, 512, 1024, 2048)


class EmulationError(CuvilError):
    """An emulated run could not be built or did not finish (the reason says which)."""


class ToolchainMissing(EmulationError):
    """The cross compiler or qemu-user is not installed."""


@dataclass(frozen=True)
class Toolchain:
    """How to build and run code of one architecture on this machine."""

    cc: str
    qemu: str
    sysroot: str


TOOLCHAINS: Mapping[str, Toolchain] = {
    "aarch64": Toolchain("aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu"),
}
"""Per architecture (the triple's first part): cross compiler, qemu-user binary, sysroot."""

QEMU_CPUS: Mapping[str, str] = {
    "cortex-a76": "cortex-a76",      # rpi5
    "carmel": "cortex-a76",          # jetson-xavier: ARMv8.2 + fp16, no SVE
    "cortex-a78ae": "neoverse-n1",   # jetson-orin: ARMv8.2 + dotprod, no SVE
    "neoverse-n1": "neoverse-n1",
    "cortex-a72": "cortex-a72",
    "cortex-a57": "cortex-a57",
    "cortex-a53": "cortex-a53",
}
"""qemu CPU model for each fixed-width (NEON-only) LLVM cpu: a core without SVE, so SVE code dies."""
NEON_FALLBACK_CPU = "neoverse-n1"

DEVICE_SVE_BITS: Mapping[str, int] = {"neoverse-v1": 256, "neoverse-v2": 128, "neoverse-v3ae": 128}
"""The SVE register width of real cores, used when the caller names no vector length."""
DEFAULT_SVE_BITS = 256

SIGNAL_HINTS: Mapping[int, str] = {
    signal.SIGILL: "illegal instruction: the code uses an instruction this CPU model lacks "
                   "(SVE code on a NEON-only core?)",
    signal.SIGSEGV: "segmentation fault: the code read or wrote outside its buffers",
    signal.SIGBUS: "bus error: misaligned or unmapped access",
    signal.SIGFPE: "arithmetic exception",
    signal.SIGABRT: "aborted",
}


def toolchain_for(target: Target) -> Toolchain:
    arch = target.triple.split("-", 1)[0]
    tc = TOOLCHAINS.get(arch)
    if tc is None:
        raise EmulationError(f"no emulation for {arch} targets ({target.name}); emulated architectures: "
                             f"{', '.join(TOOLCHAINS)}")
    return tc


def find_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ToolchainMissing(f"{name} is not installed; emulated devices need {INSTALL_HINT}")
    return path


def qemu_cpu(target: Target, sve_vector_bits: int | None = None) -> str:
    """The ``-cpu`` argument: ``max`` with one SVE length for scalable targets, a NEON core otherwise."""
    if target.scalable:
        bits = sve_vector_bits or DEVICE_SVE_BITS.get(target.cpu, DEFAULT_SVE_BITS)
        if bits not in SVE_LENGTHS:
            raise EmulationError(f"SVE vector length must be one of {SVE_LENGTHS} bits, got {bits}")
        return f"max,sve-default-vector-length={bits // 8}"
    if sve_vector_bits is not None:
        raise EmulationError(f"{target.name} has no SVE (fixed {target.vector_bits}-bit vectors); "
                             "an SVE vector length makes no sense for it")
    return QEMU_CPUS.get(target.cpu, NEON_FALLBACK_CPU)


# --- the harness ----------------------------------------------------------------------------------
_C_TEMPLATE = r"""/* Cuvil emulation harness (generated, v{version}): {entry} */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

extern void {entry}(uint8_t *arena, const uint8_t *weights);
extern void {entry}_start(void);  /* the model's worker threads (none when compiled for one) */
extern void {entry}_stop(void);

typedef struct {{ size_t off, len; }} span;
static const span IN[] = {{ {ins} }};
static const span OUT[] = {{ {outs} }};

/* n zeroed bytes, 64-byte aligned, ending (rounded up to 64) where an inaccessible page begins and
   with another one below: the code's reads and writes past either end fault (guard pages). */
static uint8_t *alloc_guarded(size_t n) {{
    size_t page = (size_t)sysconf(_SC_PAGESIZE), used = n ? (n + 63) / 64 * 64 : 64;
    size_t inner = (used + page - 1) / page * page;
    uint8_t *base = mmap(NULL, inner + 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) return NULL;
    if (mprotect(base, page, PROT_NONE) || mprotect(base + page + inner, page, PROT_NONE)) return NULL;
    return base + page + (inner - used);
}}

static int read_only(const uint8_t *p, size_t n) {{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p / page * page, hi = ((uintptr_t)p + (n ? n : 1) + page - 1) / page * page;
    return mprotect((void *)lo, hi - lo, PROT_READ);
}}

static int die(const char *what, const char *path) {{
    fprintf(stderr, "harness: %s %s\n", what, path);
    return 2;
}}

/* usage: harness WEIGHTS INPUTS OUTPUTS COUNT */
int main(int argc, char **argv) {{
    if (argc != 5) return die("usage:", "WEIGHTS INPUTS OUTPUTS COUNT");
    long count = atol(argv[4]);
    uint8_t *arena = alloc_guarded({arena}), *weights = alloc_guarded({wbytes});
    if (!arena || !weights) return die("out of memory for", "arena/weights");
    FILE *fw = fopen(argv[1], "rb");
    if (!fw || fread(weights, 1, {wbytes}, fw) != (size_t){wbytes}) return die("cannot read", argv[1]);
    fclose(fw);
    if (read_only(weights, {wbytes})) return die("cannot protect", "the weights");
    FILE *fi = fopen(argv[2], "rb"), *fo = fopen(argv[3], "wb");
    if (!fi) return die("cannot read", argv[2]);
    if (!fo) return die("cannot write", argv[3]);
    {entry}_start();
    for (long e = 0; e < count; e++) {{
        for (size_t i = 0; i < sizeof IN / sizeof IN[0]; i++)
            if (IN[i].len && fread(arena + IN[i].off, 1, IN[i].len, fi) != IN[i].len) return die("short read", argv[2]);
        {entry}(arena, weights);
        {check_fault}
        for (size_t i = 0; i < sizeof OUT / sizeof OUT[0]; i++)
            if (OUT[i].len && fwrite(arena + OUT[i].off, 1, OUT[i].len, fo) != OUT[i].len) return die("short write", argv[3]);
    }}
    {entry}_stop();
    return fclose(fo) ? die("cannot close", argv[3]) : 0;
}}
"""


def harness_source(lowered: LoweredModel) -> str:
    """C source of a harness that runs ``lowered``'s entry once per example read from a file."""

    def spans(specs: Sequence[IOSpec]) -> str:
        return ", ".join(f"{{{s.offset}u, {s.nbytes}u}}" for s in specs) or "{0u, 0u}"

    check = "" if lowered.fault_offset is None else \
        f"if (*(volatile int32_t *)(arena + {lowered.fault_offset}u)) return {FAULT_EXIT};"
    return _C_TEMPLATE.format(version=HARNESS_VERSION, entry=lowered.entry, ins=spans(lowered.inputs),
                              outs=spans(lowered.outputs), arena=lowered.arena_bytes,
                              wbytes=len(lowered.weights), check_fault=check)


def link_harness(lowered: LoweredModel, obj: bytes, out_dir: Path) -> Path:
    """Write ``harness.c``, ``model.o`` and ``weights.bin`` into ``out_dir``; link ``harness``."""
    tc = toolchain_for(lowered.target)
    cc = find_tool(tc.cc)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "harness.c").write_text(harness_source(lowered))
    (out_dir / "model.o").write_bytes(obj)
    (out_dir / "weights.bin").write_bytes(lowered.weights)
    exe = out_dir / "harness"
    cmd = [cc, "-O2", "-static", "-pthread", "-o", str(exe), str(out_dir / "harness.c"), str(out_dir / "model.o"), "-lm"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise EmulationError(f"linking the harness with {tc.cc} failed: {done.stderr.strip()[-2000:]}")
    return exe


def _pack_inputs(specs: Sequence[IOSpec], examples: Sequence[Mapping[str, np.ndarray]]) -> bytes:
    parts = []
    for n, ex in enumerate(examples):
        for s in specs:
            if s.name not in ex:
                raise EmulationError(f"example {n}: missing input {s.name!r}; the model takes "
                                     f"{[t.name for t in specs]}")
            a = np.asarray(ex[s.name])
            if a.shape != s.shape:
                raise EmulationError(f"example {n}: input {s.name!r} has shape {a.shape}, the compiled "
                                     f"model wants {s.shape}")
            parts.append(clean_bools(np.ascontiguousarray(a, dtype=s.dtype.numpy)).tobytes())
    return b"".join(parts)


def _unpack_outputs(specs: Sequence[IOSpec], data: bytes, count: int) -> list[dict[str, np.ndarray]]:
    per = sum(s.nbytes for s in specs)
    if len(data) != per * count:
        raise EmulationError(f"the harness wrote {len(data)} output bytes, expected {per * count}")
    out, pos = [], 0
    for _ in range(count):
        row = {}
        for s in specs:
            row[s.name] = s.take(np.frombuffer(data, np.uint8, s.nbytes, pos))
            pos += s.nbytes
        out.append(row)
    return out


def run_harness(exe: Path, lowered: LoweredModel, examples: Sequence[Mapping[str, np.ndarray]], *,
                sve_vector_bits: int | None = None, workdir: str | os.PathLike | None = None,
                timeout: float | None = 1800.0) -> list[dict[str, np.ndarray]]:
    """Run every example through the linked harness in one qemu process; outputs in example order."""
    if not examples:
        return []
    tc = toolchain_for(lowered.target)
    qemu = find_tool(tc.qemu)
    cpu = qemu_cpu(lowered.target, sve_vector_bits)
    with tempfile.TemporaryDirectory(prefix="cuvil-emu-", dir=workdir) as tmp:
        ins, outs = Path(tmp) / "inputs.bin", Path(tmp) / "outputs.bin"
        ins.write_bytes(_pack_inputs(lowered.inputs, examples))
        cmd = [qemu, "-cpu", cpu, "-L", tc.sysroot, str(exe), str(exe.with_name("weights.bin")), str(ins), str(outs),
               str(len(examples))]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise EmulationError(f"emulated run ({cpu}) did not finish within {timeout:.0f} s") from None
        if done.returncode == FAULT_EXIT:
            raise RunTimeCheckError()
        if done.returncode != 0:
            raise EmulationError(_failure(done.returncode, done.stderr, lowered.target, cpu))
        return _unpack_outputs(lowered.outputs, outs.read_bytes(), len(examples))


def _failure(rc: int, stderr: str, target: Target, cpu: str) -> str:
    """A one-line reason: qemu re-raises the guest's fatal signal, so rc is -signal (or 128+signal)."""
    sig = -rc if rc < 0 else rc - 128 if rc > 128 else None
    why = SIGNAL_HINTS.get(sig, f"signal {sig}") if sig else f"exit status {rc}: {stderr.strip()[-500:]}"
    return f"emulated {target.name} on qemu cpu {cpu.split(',')[0]} failed: {why}"


def emulation_banner(target: Target, sve_vector_bits: int | None = None) -> str:
    """What the CLI prints so nobody mistakes an emulated run for the device itself."""
    cpu = qemu_cpu(target, sve_vector_bits)
    if target.scalable:
        cpu = f"max with {int(cpu.rsplit('=', 1)[1]) * 8}-bit SVE"
    return (f"EMULATED: {target.name} ({target.cpu}) under qemu-user, cpu model {cpu}; "
            "outputs are what the device computes, speed is not the device's")
