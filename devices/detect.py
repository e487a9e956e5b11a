"""Host detection: a DeviceProfile named "host" for the CPU this process runs on.

The host profile carries LLVM's exact host feature list (enabled and disabled), so generated code
never uses an instruction the CPU lacks, not even one its cpu name implies (virtual machines mask
features). The vector width follows the features; for AVX-512 ``-prefer-256-bit`` is added so LLVM
really uses 512-bit registers.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
from collections.abc import Mapping

from ..compiler.digest import sha256
from ..compiler.target import Target
from .llvm_facts import HostFacts, llvm_host_facts
from .profile import DeviceProfile, ProfileError, check_consistent, load_profile

HOST = "host"
WIDTH_RULES: Mapping[str, tuple[tuple[str, int | None], ...]] = {
    "x86_64": (("avx512f", 512), ("avx2", 256)),
    "aarch64": (("sve", None),),
}
"""Per architecture, the first enabled feature decides the vector width (None: scalable); else 128."""

EXTRA_FEATURES: Mapping[str, tuple[str, ...]] = {"avx512f": ("-prefer-256-bit",)}
"""Features added when a host feature is enabled (512-bit code needs LLVM to stop preferring 256)."""

_CACHE_DIR = "/sys/devices/system/cpu/cpu0/cache"
_DEFAULT_CACHE_KIB = {"l1d": 32, "l2": 512, "l3": 0}
_DEFAULT_BUDGET_MIB = 1024


def vector_bits_for(arch: str, enabled: set[str]) -> int | None:
    for feature, bits in WIDTH_RULES.get(arch, ()):
        if feature in enabled:
            return bits
    return 128


def profile_from_host(triple: str, cpu: str, features: Mapping[str, bool],
                      cache_kib: Mapping[str, int] | None = None, budget_mib: int | None = None,
                      cores: int | None = None) -> DeviceProfile:
    """Build the host profile from what LLVM reports (pure, so tests can feed other hosts)."""
    triple = _normalize_triple(triple)
    arch = triple.split("-", 1)[0]
    if arch not in WIDTH_RULES:
        raise ProfileError(f"host architecture {arch!r} is not supported (supported: {', '.join(WIDTH_RULES)})")
    enabled = {f for f, on in features.items() if on}
    flags = [("+" if on else "-") + f for f, on in sorted(features.items())]
    for feature, extra in EXTRA_FEATURES.items():
        if feature in enabled:
            names = {e[1:] for e in extra}
            flags = [f for f in flags if f[1:] not in names] + list(extra)
    caches = {**_DEFAULT_CACHE_KIB, **(cache_kib or {})}
    profile = DeviceProfile(
        name=HOST, triple=triple, cpu=cpu or "generic", features=tuple(flags),
        vector_bits=vector_bits_for(arch, enabled), l1d_kib=caches["l1d"], l2_kib=caches["l2"],
        l3_kib=caches["l3"], memory_budget_mib=budget_mib or _DEFAULT_BUDGET_MIB,
        description=f"this machine ({cpu}, detected)", cores=cores or 1,
    )
    check_consistent(profile, "host")
    return profile


_TOLD: list[HostFacts] = []


def know_host(facts: HostFacts) -> None:
    """Facts about this CPU learned without LLVM in this process (a sealed memo, an LLVM helper
    process): :func:`host_profile` uses them instead of loading llvmlite to ask again."""
    _TOLD[:] = [facts]


def profile_of(facts: HostFacts) -> DeviceProfile:
    """The host profile from LLVM's facts (asked now, or remembered under :func:`host_stamp`) and this system's."""
    return profile_from_host(facts.triple, facts.cpu, dict(facts.features), _host_caches(), _host_budget_mib(),
                             _host_cores())


@functools.lru_cache(maxsize=1)
def host_profile() -> DeviceProfile:
    """The profile of the running CPU, from llvmlite's host CPU name and feature map (asked once,
    unless :func:`know_host` told them)."""
    return profile_of(_TOLD[0] if _TOLD else llvm_host_facts())


_VOLATILE_CPUINFO = ("cpu MHz", "bogomips", "BogoMIPS")


@functools.lru_cache(maxsize=1)
def llvmlite_stamp() -> str:
    """llvmlite's version file, hashed, read without importing llvmlite (a warm start must not map libLLVM)."""
    spec = importlib.util.find_spec("llvmlite")
    try:
        with open(os.path.join(spec.submodule_search_locations[0], "_version.py"), "rb") as f:
            return sha256(f.read()).hexdigest()
    except (AttributeError, IndexError, TypeError, OSError):
        return "unknown"


def cpuid_features() -> str:
    """The CPU features this process may use, as NumPy's start-up read them (CPUID and XGETBV on x86,
    HWCAP on Arm): an emulator (qemu-user, Rosetta, FEX) shows the real CPU's /proc/cpuinfo to a process
    whose CPUID says less, so the file alone would let a memo of another CPU's features through."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__
    except ImportError:
        try:
            from numpy.core._multiarray_umath import __cpu_features__  # NumPy 1.x
        except ImportError:
            return "unknown"
    return " ".join(sorted(name for name, on in __cpu_features__.items() if on))


def host_stamp() -> str | None:
    """sha256 over what decides :func:`llvm_host_facts`: the machine, llvmlite's version, the features
    CPUID reports and the first CPU's /proc/cpuinfo entry (vendor, model, stepping, microcode, flags; not
    its clock); None without cpuinfo."""
    head = _cpuinfo_head()
    if head is None:
        return None
    lines = [line for line in head.splitlines() if line.split(":", 1)[0].strip() not in _VOLATILE_CPUINFO]
    text = "\n".join([platform.machine(), llvmlite_stamp(), cpuid_features(), *lines])
    return sha256(text.encode()).hexdigest()


def _host_cores() -> int:
    """The cores this process may run on (its affinity mask, which a container or taskset narrows)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:
        return os.cpu_count() or 1


def resolve_profile(name_or_host: str) -> DeviceProfile:
    """``"host"`` detects this machine; any other name is a shipped profile."""
    return host_profile() if name_or_host == HOST else load_profile(name_or_host)


def resolve_target(name_or_host: str) -> Target:
    return resolve_profile(name_or_host).target()


def _normalize_triple(triple: str) -> str:
    """LLVM spells aarch64 hosts ``arm64-apple-...`` on macOS; profiles use ``aarch64``."""
    return "aarch64" + triple[len("arm64"):] if triple.startswith("arm64") else triple


@functools.lru_cache(maxsize=1)
def _cpuinfo_head() -> str | None:
    """The first CPU's entry of /proc/cpuinfo, read once per process (the host stamp and the CPU's
    identity both read it on a warm start); None where there is no such file."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read(1 << 16).split("\n\n", 1)[0]
    except OSError:
        return None


def _read_small(dir_fd: int, name: str) -> str:
    fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
    try:
        return os.read(fd, 64).decode("ascii", "replace").strip()
    finally:
        os.close(fd)


def _host_caches() -> dict[str, int]:
    """Data and unified cache sizes in KiB from Linux sysfs; defaults where it is not readable. Plain
    ``os`` calls relative to the opened directory: pathlib's glob and read_text cost a warm start
    0.3 ms here, ``open`` by full paths 0.15 ms more."""
    found: dict[str, int] = {}
    try:
        dir_fd = os.open(_CACHE_DIR, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return found
    try:
        for index in sorted(n for n in os.listdir(dir_fd) if n.startswith("index")):
            try:
                level, kind, size = (_read_small(dir_fd, f"{index}/{n}") for n in ("level", "type", "size"))
            except OSError:
                continue
            if kind in ("Data", "Unified") and size.endswith("K") and size[:-1].isdigit():
                found[f"l{level}d" if level == "1" else f"l{level}"] = int(size[:-1])
    finally:
        os.close(dir_fd)
    return {k: v for k, v in found.items() if k in _DEFAULT_CACHE_KIB}


def _host_budget_mib() -> int:
    """Half of physical memory: the arena and weights must leave room for everything else."""
    import os

    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return _DEFAULT_BUDGET_MIB
    return max(1, total // (2 * 1024 * 1024))


def cpu_identity() -> str:
    """The exact CPU: /proc/cpuinfo's vendor, family, model, stepping and name (LLVM's cpu name and
    features are in the Target already); the platform's processor string elsewhere."""
    keys = ("vendor_id", "cpu family", "model", "stepping", "model name")
    head = _cpuinfo_head()
    if head is None:
        return platform.processor() or platform.machine()
    fields = {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in head.splitlines() if ":" in line)}
    return "; ".join(fields.get(k, "") for k in keys)
