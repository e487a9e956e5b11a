"""The shipped device profiles: complete, valid, understood by LLVM, and safe (no SVE on NEON cores)."""

from __future__ import annotations

import subprocess
import sys
import tomllib

import pytest

from cuvil.compiler.target import Target, TargetKind
from cuvil.devices import DeviceProfile, ProfileError, list_profiles, load_profile, load_profile_file, parse_profile
from cuvil.devices.profile import PROFILE_DIR

from .llvm_asm import compile_loop, uses_sve

# docs/devices.md: the device classes the fleet must cover, with the facts that decide correct code.
EXPECTED = {
    "x86-avx2": ("haswell", 256, None),
    "x86-avx512": ("skylake-avx512", 512, None),
    "x86-avx512-vnni": ("cascadelake", 512, None),
    "rpi5": ("cortex-a76", 128, None),
    "graviton3": ("neoverse-v1", None, None),
    "graviton4": ("neoverse-v2", None, None),
    "arm64-sve2": ("generic", None, None),
    "jetson-xavier": ("carmel", 128, "sm_72"),
    "jetson-orin": ("cortex-a78ae", 128, "sm_87"),
    "jetson-thor": ("neoverse-v3ae", None, "sm_110"),
}
NEON_ONLY = ("rpi5", "jetson-xavier", "jetson-orin")


def test_every_device_class_has_a_profile():
    assert set(EXPECTED) <= set(list_profiles())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_profile_facts_and_target(name):
    cpu, bits, gpu = EXPECTED[name]
    p = load_profile(name)
    assert isinstance(p, DeviceProfile) and p.name == name and p.description
    assert (p.cpu, p.vector_bits, p.gpu_arch) == (cpu, bits, gpu)
    assert p.l1d_kib > 0 and p.l2_kib > 0 and p.memory_budget_bytes > 0
    t = p.target()
    assert isinstance(t, Target) and t.kind is TargetKind.CPU
    assert (t.name, t.triple, t.cpu, t.features, t.vector_bits, t.gpu_arch) == (
        name, p.triple, cpu, p.features, bits, gpu)
    assert t.scalable == (bits is None)


@pytest.mark.parametrize("name", NEON_ONLY)
def test_neon_only_profiles_never_mention_sve(name):
    p = load_profile(name)
    assert not any("sve" in f for f in p.features)
    assert "+neon" in p.features and p.vector_bits == 128


def test_avx512_profile_uses_512_bit_registers():
    p = load_profile("x86-avx512")
    assert "-prefer-256-bit" in p.features and "+avx512f" in p.features
    assert "zmm" in compile_loop(p.triple, p.cpu, p.target().feature_string)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_llvm_knows_every_cpu_and_feature(name, capfd):
    p = load_profile(name)
    asm = compile_loop(p.triple, p.cpu, p.target().feature_string)
    err = capfd.readouterr().err
    assert "not a recognized" not in err, err
    if name in NEON_ONLY:
        assert not uses_sve(asm)
    if name in ("graviton3", "arm64-sve2"):  # graviton4 prefers NEON for plain loops (docs/devices.md)
        assert uses_sve(asm)


def test_gpu_arch_and_ptx_version_are_accepted_by_nvptx():
    """In a subprocess: LLVM aborts the whole process when a PTX version is too old for the arch."""
    checks = [(load_profile(n).gpu_arch, ",".join(load_profile(n).gpu_features)) for n in EXPECTED if EXPECTED[n][2]]
    code = (
        "import sys, llvmlite.binding as llvm\n"
        "llvm.initialize_all_targets(); llvm.initialize_all_asmprinters()\n"
        "t = llvm.Target.from_triple('nvptx64-nvidia-cuda')\n"
        f"for cpu, feats in {checks!r}:\n"
        "    tm = t.create_target_machine(cpu=cpu, features=feats)\n"
        "    m = llvm.parse_assembly('define void @k() { ret void }'); m.triple = 'nvptx64-nvidia-cuda'\n"
        "    print(tm.emit_assembly(m).count('.target ' + cpu))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1"] * len(checks)
    assert "not a recognized" not in run.stderr


def _data(name: str = "rpi5") -> dict:
    return tomllib.loads((PROFILE_DIR / f"{name}.toml").read_text())


BAD = [
    ("missing field", "rpi5", lambda d: d.pop("cpu"), "missing required field 'cpu'"),
    ("unknown field", "rpi5", lambda d: d.update(colour="red"), "unknown field(s) colour"),
    ("bad width", "rpi5", lambda d: d.update(vector_bits=100), "field 'vector_bits'"),
    ("width as bool", "rpi5", lambda d: d.update(vector_bits=True), "field 'vector_bits'"),
    ("bad triple", "rpi5", lambda d: d.update(triple="riscv64-unknown-linux-gnu"), "field 'triple'"),
    ("bad feature", "rpi5", lambda d: d.update(features=["neon"]), "field 'features'"),
    ("feature ending in a newline", "rpi5", lambda d: d.update(features=["+neon\n"]), "field 'features'"),
    ("duplicate feature", "rpi5", lambda d: d.update(features=["+neon", "+neon"]), "twice"),
    ("negative cache", "rpi5", lambda d: d.update(l2_kib=-1), "field 'l2_kib'"),
    ("zero budget", "rpi5", lambda d: d.update(memory_budget_mib=0), "field 'memory_budget_mib'"),
    ("bad gpu", "jetson-orin", lambda d: d.update(gpu_arch="ampere"), "field 'gpu_arch'"),
    ("gpu features alone", "rpi5", lambda d: d.update(gpu_features=["+ptx78"]), "without gpu_arch"),
    ("sve on fixed width", "rpi5", lambda d: d["features"].append("+sve"), "SVE code must be 'scalable'"),
    ("scalable without sve", "graviton3", lambda d: d["features"].remove("+sve"), "needs feature(s) +sve"),
    ("512 without prefer flag", "x86-avx512", lambda d: d["features"].remove("-prefer-256-bit"), "-prefer-256-bit"),
    ("512 on arm", "rpi5", lambda d: d.update(vector_bits=512), "not supported on aarch64"),
    ("avx2 width without avx2", "x86-avx2", lambda d: d["features"].remove("+avx2"), "needs feature(s) +avx2"),
]


@pytest.mark.parametrize("what,base,mutate,message", BAD, ids=[b[0] for b in BAD])
def test_invalid_profiles_are_rejected_with_the_reason(what, base, mutate, message):
    data = _data(base)
    mutate(data)
    with pytest.raises(ProfileError) as info:
        parse_profile(data, source=f"{base}.toml")
    assert message in str(info.value) and f"{base}.toml" in str(info.value)


def test_unknown_and_malformed_names():
    with pytest.raises(ProfileError, match="unknown device profile 'nope'.*rpi5"):
        load_profile("nope")
    for bad in ("../etc/passwd", "RPI5", "", "a/b"):
        with pytest.raises(ProfileError, match="bad profile name"):
            load_profile(bad)


def test_a_new_device_is_a_new_toml_file(tmp_path):
    text = (PROFILE_DIR / "rpi5.toml").read_text().replace('name = "rpi5"', 'name = "my-board"')
    (tmp_path / "my-board.toml").write_text(text)
    assert load_profile_file(tmp_path / "my-board.toml").target().cpu == "cortex-a76"
    (tmp_path / "other.toml").write_text(text)
    with pytest.raises(ProfileError, match="does not match the file name"):
        load_profile_file(tmp_path / "other.toml")
    (tmp_path / "broken.toml").write_text("name = ")
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile_file(tmp_path / "broken.toml")
