"""Host detection: exact features, the vector width they imply, and LLVM really using that width."""

from __future__ import annotations

import llvmlite.binding as llvm
import pytest

from cuvil.devices import ProfileError, detect, host_profile, load_profile, profile_from_host, resolve_profile, resolve_target

from .llvm_asm import compile_loop, uses_sve

X86 = "x86_64-unknown-linux-gnu"
ARM = "aarch64-unknown-linux-gnu"
SSE = {"sse": True, "sse2": True, "avx": False, "avx2": False, "avx512f": False}
AVX2 = {**SSE, "avx": True, "avx2": True, "fma": True}
AVX512 = {**AVX2, "avx512f": True, "avx512bw": True, "avx512vl": True, "amx-tile": False}
NEON = {"neon": True, "fp-armv8": True, "dotprod": True, "sve": False, "sve2": False}
SVE2 = {**NEON, "sve": True, "sve2": True}

CASES = [
    ("avx512", X86, "skylake-avx512", AVX512, 512),
    ("avx2", X86, "znver3", AVX2, 256),
    ("sse", X86, "x86-64", SSE, 128),
    ("neon", ARM, "cortex-a76", NEON, 128),
    ("sve2", ARM, "neoverse-v2", SVE2, None),
]


@pytest.mark.parametrize("what,triple,cpu,features,bits", CASES, ids=[c[0] for c in CASES])
def test_width_follows_the_features(what, triple, cpu, features, bits):
    p = profile_from_host(triple, cpu, features)
    assert (p.name, p.cpu, p.triple, p.vector_bits) == ("host", cpu, triple, bits)
    flags = {f for f in p.features if f != "-prefer-256-bit"}
    assert flags == {("+" if on else "-") + f for f, on in features.items()}  # exact, disabled ones too
    assert ("-prefer-256-bit" in p.features) == (bits == 512)
    assert p.target().vector_bits == bits


def test_fake_avx512_host_gets_zmm_code():
    p = profile_from_host(X86, "skylake-avx512", AVX512)
    assert "zmm" in compile_loop(p.triple, p.cpu, p.target().feature_string)


def test_neon_host_gets_no_sve_code():
    p = profile_from_host(ARM, "cortex-a76", NEON)
    assert not uses_sve(compile_loop(p.triple, p.cpu, p.target().feature_string))


def test_triples_and_unsupported_hosts():
    assert profile_from_host("arm64-apple-darwin23", "apple-m1", NEON).triple == "aarch64-apple-darwin23"
    with pytest.raises(ProfileError, match="riscv64"):
        profile_from_host("riscv64-unknown-linux-gnu", "generic-rv64", {})


def test_real_host(capfd):
    p = host_profile()
    features = dict(llvm.get_host_cpu_features())
    assert p.name == "host" and p.cpu == llvm.get_host_cpu_name()
    assert {f for f in p.features if f != "-prefer-256-bit"} == {("+" if on else "-") + f for f, on in features.items()}
    asm = compile_loop(p.triple, p.cpu, p.target().feature_string)
    assert "not a recognized" not in capfd.readouterr().err
    register = {512: "zmm", 256: "ymm", 128: "xmm"}.get(p.vector_bits)
    if register and p.arch == "x86_64":
        assert register in asm
    assert p.l1d_kib > 0 and p.memory_budget_mib > 0


def test_resolve():
    assert resolve_target("host") == host_profile().target()
    assert resolve_target("jetson-orin") == load_profile("jetson-orin").target()
    assert resolve_profile("rpi5") is load_profile("rpi5")
    with pytest.raises(ProfileError, match="unknown device profile"):
        resolve_target("jetson-nano")


def test_the_host_stamp_follows_cpuid_not_only_cpuinfo(monkeypatch):
    """An emulator shows the real CPU's /proc/cpuinfo; what CPUID reports must change the stamp too."""
    stamp = detect.host_stamp()
    monkeypatch.setattr(detect, "cpuid_features", lambda: "SSE2 AVX AVX2 FMA3")
    assert stamp is not None and detect.host_stamp() != stamp


def test_cpuid_features_agree_with_llvm():
    features = detect.cpuid_features().split()
    p = host_profile()
    if p.arch == "x86_64":
        assert "SSE2" in features
        assert ("AVX512F" in features) == ("+avx512f" in p.features)
        assert ("AVX2" in features) == ("+avx2" in p.features)


def test_cache_sizes_come_from_sysfs_data_and_unified_caches_only(tmp_path, monkeypatch):
    for index, (level, kind, size) in enumerate([("1", "Data", "48K"), ("1", "Instruction", "32K"),
                                                 ("2", "Unified", "1024K"), ("3", "Unified", "32768K")]):
        d = tmp_path / f"index{index}"
        d.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (d / name).write_text(value + "\n")
    (tmp_path / "uevent").write_text("")
    monkeypatch.setattr(detect, "_CACHE_DIR", str(tmp_path))
    assert detect._host_caches() == {"l1d": 48, "l2": 1024, "l3": 32768}
    monkeypatch.setattr(detect, "_CACHE_DIR", str(tmp_path / "absent"))
    assert detect._host_caches() == {}
