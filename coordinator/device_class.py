"""A device's class (what the coordinator groups and samples by): its profile, with ``host`` resolved.

A device provisioned with ``--profile host`` compiles for whatever CPU it finds, but it is grouped
with the shipped profile that names its hardware (``x86-avx512`` on an AVX-512 server), so a fleet's
classes say what the devices are. Its CPU name, ISA and inference threads travel beside the class in the
inventory (``query.device_info``).
"""

from __future__ import annotations

import functools

from ..devices import load_profile
from ..devices.detect import HOST
from ..devices.profile import DeviceProfile
from ..edge_runtime.compile import runnable_here

NATIVE_CANDIDATES = ("x86-amx", "x86-avx512-vnni", "x86-avx512", "x86-avx2", "graviton4", "graviton3",
                     "rpi5")  # most capable first: an int8 model then runs the host's integer dot products


@functools.lru_cache(maxsize=1)
def host_class() -> str:
    """The shipped profile that names this host's class (natively runnable), else ``"host"``."""
    for name in NATIVE_CANDIDATES:
        if runnable_here(load_profile(name).target()):
            return name
    return HOST


def device_class(profile: str) -> str:
    return host_class() if profile == HOST else profile


def isa(profile: DeviceProfile) -> str:
    """The instruction set a device's code is built for: architecture and vector width."""
    bits = profile.vector_bits
    return f"{profile.arch}/{bits}-bit" if bits else f"{profile.arch}/scalable"
