"""Device profiles: one TOML file per device class in ``profiles/``; adding a device is adding a file.

A profile holds the facts lowering needs (LLVM triple, cpu, feature string, vector width, caches,
memory budget, optional GPU architecture) and an optional ``[tuning]`` table that overrides fields
of the target's :class:`~cuvil.compiler.tuning.Tuning` (the cache sizes fill it always). Every field is validated on load, and so are the rules
that keep generated code correct: SVE features if and only if the width is ``"scalable"`` (SVE code
on a NEON-only core dies with SIGILL), and a 512-bit x86 width only with ``+avx512f`` and
``-prefer-256-bit`` (without it LLVM emits 256-bit code).
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..compiler.errors import CuvilError
from ..compiler.target import Target, TargetKind
from ..compiler.tuning import check_overrides, default_tuning

PROFILE_DIR = Path(__file__).parent / "profiles"
SCALABLE = "scalable"


class ProfileError(CuvilError):
    """A device profile is missing, malformed, or describes code that could not run correctly."""


@dataclass(frozen=True)
class DeviceProfile:
    """One device class. ``vector_bits`` None means scalable (SVE/SVE2, vector-length agnostic)."""

    name: str
    triple: str
    cpu: str
    features: tuple[str, ...]
    vector_bits: int | None
    l1d_kib: int
    l2_kib: int
    l3_kib: int  # 0: no L3
    memory_budget_mib: int
    description: str = ""
    gpu_arch: str | None = None
    gpu_features: tuple[str, ...] = ()
    clock_ghz: float | None = None  # sustained CPU clock: the latency cost model's time base
    cores: int = 1
    sve_vector_bits: int | None = None  # the SVE length of this class's cores, when one length is known
    tuning: tuple[tuple[str, Any], ...] = ()  # the [tuning] table: (Tuning field, value), sorted

    @property
    def lanes_f32(self) -> int:
        """fp32 lanes of one vector register (SVE: the class's known length, else its 128-bit minimum)."""
        return (self.vector_bits or self.sve_vector_bits or 128) // 32

    @property
    def arch(self) -> str:
        return self.triple.split("-", 1)[0]

    @property
    def memory_budget_bytes(self) -> int:
        return self.memory_budget_mib * 1024 * 1024

    @property
    def default_threads(self) -> int:
        """Threads an inference uses unless told: the cores, at most the tuning's ``max_threads``."""
        return max(1, min(self.cores, self.target().tuning.max_threads))

    def target(self) -> Target:
        """The code-generation target of this profile's CPU (``gpu_arch`` rides along)."""
        tuning = default_tuning(self.triple, self.cpu, self.vector_bits).replace(
            l1d_bytes=self.l1d_kib * 1024, l2_bytes=self.l2_kib * 1024, l3_bytes=self.l3_kib * 1024, **dict(self.tuning))
        return Target(self.name, self.triple, self.cpu, self.features, self.vector_bits, TargetKind.CPU, self.gpu_arch,
                      tuning)


# field validation ---------------------------------------------------------------------------------
REQUIRED = object()
_FEATURE = re.compile(r"[+-][a-z0-9][a-z0-9.\-]*")
_ARCHES = ("x86_64", "aarch64")


def _string(v: Any) -> str:
    if not isinstance(v, str) or not v.strip():
        raise ValueError("must be a non-empty string")
    return v


def _name(v: Any) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"[a-z0-9][a-z0-9\-]*", v):
        raise ValueError("must be lower-case letters, digits and '-'")
    return v


def _triple(v: Any) -> str:
    if not isinstance(v, str) or v.split("-", 1)[0] not in _ARCHES or v.count("-") < 2:
        raise ValueError(f"must be an LLVM triple for one of {', '.join(_ARCHES)}")
    return v


def _features(v: Any) -> tuple[str, ...]:
    if not isinstance(v, list) or not all(isinstance(f, str) and _FEATURE.fullmatch(f) for f in v):
        raise ValueError("must be a list of LLVM feature strings like '+avx2' or '-prefer-256-bit'")
    if len(set(v)) != len(v):
        raise ValueError("lists a feature twice")
    return tuple(v)


def _vector_bits(v: Any) -> int | None:
    if v == SCALABLE:
        return None
    if isinstance(v, bool) or v not in (128, 256, 512):
        raise ValueError(f"must be 128, 256, 512 or {SCALABLE!r}")
    return v


def _count(minimum: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise ValueError(f"must be an integer >= {minimum}")
        return v

    return check


def _clock(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.1 <= v <= 10:
        raise ValueError("must be a clock in GHz between 0.1 and 10")
    return float(v)


def check_sve_bits(v: Any) -> int:
    """An SVE vector length the architecture allows (ValueError else)."""
    if isinstance(v, bool) or not isinstance(v, int) or v % 128 or not 128 <= v <= 2048:
        raise ValueError("must be a multiple of 128 from 128 to 2048")
    return v


def _tuning(v: Any) -> tuple[tuple[str, Any], ...]:
    if not isinstance(v, Mapping):
        raise ValueError("must be a table of tuning fields")
    return tuple(sorted(check_overrides(v).items()))


def _gpu_arch(v: Any) -> str:
    if not isinstance(v, str) or not re.fullmatch(r"sm_\d{2,3}", v):
        raise ValueError("must be an NVIDIA architecture like 'sm_87'")
    return v


FIELDS: Mapping[str, tuple[Callable[[Any], Any], Any]] = {
    "name": (_name, REQUIRED),
    "description": (_string, ""),
    "triple": (_triple, REQUIRED),
    "cpu": (_string, REQUIRED),
    "features": (_features, REQUIRED),
    "vector_bits": (_vector_bits, REQUIRED),
    "l1d_kib": (_count(1), REQUIRED),
    "l2_kib": (_count(1), REQUIRED),
    "l3_kib": (_count(0), REQUIRED),
    "memory_budget_mib": (_count(1), REQUIRED),
    "gpu_arch": (_gpu_arch, None),
    "gpu_features": (_features, ()),
    "clock_ghz": (_clock, None),
    "cores": (_count(1), 1),
    "sve_vector_bits": (check_sve_bits, None),
    "tuning": (_tuning, ()),
}
"""Every field of a profile file: its validator and default (REQUIRED: no default)."""

WIDTH_NEEDS: Mapping[tuple[str, int | None], tuple[str, ...]] = {
    ("x86_64", 128): (),
    ("x86_64", 256): ("+avx2",),
    ("x86_64", 512): ("+avx512f", "-prefer-256-bit"),
    ("aarch64", 128): ("+neon",),
    ("aarch64", None): ("+sve",),
}
"""The features each (architecture, vector width) needs for LLVM to emit code of that width."""


def parse_profile(data: Mapping[str, Any], source: str = "<profile>") -> DeviceProfile:
    """Validate a profile's fields (as read from TOML) and build it; ProfileError names the field."""
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise ProfileError(f"{source}: unknown field(s) {', '.join(unknown)} (known: {', '.join(FIELDS)})")
    values = {}
    for key, (check, default) in FIELDS.items():
        if key not in data:
            if default is REQUIRED:
                raise ProfileError(f"{source}: missing required field {key!r}")
            values[key] = default
            continue
        try:
            values[key] = check(data[key])
        except ValueError as e:
            raise ProfileError(f"{source}: field {key!r} {e}, got {data[key]!r}") from None
    profile = DeviceProfile(**values)
    check_consistent(profile, source)
    return profile


def check_consistent(p: DeviceProfile, source: str) -> None:
    """The cross-field rules that keep generated code runnable on the device."""
    width = SCALABLE if p.vector_bits is None else f"{p.vector_bits}-bit"
    needs = WIDTH_NEEDS.get((p.arch, p.vector_bits))
    if needs is None:
        raise ProfileError(f"{source}: a {width} vector width is not supported on {p.arch}")
    missing = [f for f in needs if f not in p.features]
    if missing:
        raise ProfileError(f"{source}: a {width} vector width needs feature(s) {', '.join(missing)}")
    sve = [f for f in p.features if f.startswith("+sve")]
    if sve and p.vector_bits is not None:
        raise ProfileError(f"{source}: {', '.join(sve)} with a fixed {width} width; SVE code must be {SCALABLE!r}")
    if p.sve_vector_bits is not None and p.vector_bits is not None:
        raise ProfileError(f"{source}: sve_vector_bits on a profile without scalable (SVE) vectors")
    if p.gpu_features and p.gpu_arch is None:
        raise ProfileError(f"{source}: gpu_features without gpu_arch")


# loading ------------------------------------------------------------------------------------------
def list_profiles() -> tuple[str, ...]:
    """Names of the shipped profiles, sorted."""
    return tuple(sorted(p.stem for p in PROFILE_DIR.glob("*.toml")))


@functools.lru_cache(maxsize=None)
def load_profile(name: str) -> DeviceProfile:
    """The shipped profile ``name`` (a file ``profiles/<name>.toml`` whose ``name`` field matches)."""
    if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9\-]*", name):
        raise ProfileError(f"bad profile name {name!r}")
    path = PROFILE_DIR / f"{name}.toml"
    if not path.is_file():
        raise ProfileError(f"unknown device profile {name!r} (known: {', '.join(list_profiles())}, host)")
    return load_profile_file(path)


def load_profile_file(path: str | Path) -> DeviceProfile:
    """A profile from any TOML file (a device class not shipped with Cuvil)."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ProfileError(f"{path.name}: cannot read profile: {e}") from None
    profile = parse_profile(data, source=path.name)
    if profile.name != path.stem:
        raise ProfileError(f"{path.name}: name {profile.name!r} does not match the file name")
    return profile
