"""A device's class is its profile; `host` resolves to the shipped profile that names the hardware."""

from __future__ import annotations

import os

from cuvil.coordinator import fleet
from cuvil.coordinator.device import DeviceState
from cuvil.coordinator.device_class import device_class, host_class, isa
from cuvil.devices import load_profile, resolve_profile
from cuvil.edge_runtime.compile import runnable_here

from .fleet_helpers import make_keys


def test_host_resolves_to_a_shipped_profile_this_machine_runs():
    cls = host_class()
    assert device_class("host") == cls and device_class("rpi5") == "rpi5"
    if cls != "host":  # every build machine is x86 with AVX2 at least: a shipped profile names it
        assert runnable_here(load_profile(cls).target())
    assert cls in ("x86-amx", "x86-avx512-vnni", "x86-avx512", "x86-avx2", "graviton4", "graviton3", "rpi5", "host")


def test_the_most_capable_runnable_class_names_the_host():
    """A VNNI host is x86-avx512-vnni, not x86-avx512: its int8 code then uses vpdpbusd."""
    from cuvil.devices.detect import resolve_target

    host = resolve_target("host")
    want = ("x86-amx" if host.has("amx-int8") and host.has("avx512vnni") else
            "x86-avx512-vnni" if host.has("avx512vnni") and host.has("avx512f") else None)
    if want is not None:
        assert host_class() == want


def test_isa_names_architecture_and_vector_width():
    assert isa(load_profile("x86-avx2")) == "x86_64/256-bit"
    assert isa(load_profile("x86-avx512")) == "x86_64/512-bit"
    assert isa(load_profile("graviton3")).startswith("aarch64/")


def test_a_host_device_reports_its_class_cpu_isa_and_threads(tmp_path):
    keys = make_keys(tmp_path)
    dev = DeviceState.provision(tmp_path / "d", "d", "host", [keys.public_path], data=fleet.device_data(0, 4))
    info = dev.info()
    host = resolve_profile("host")
    assert info["profile"] == host_class()
    assert info["cpu"] == host.cpu and info["isa"] == isa(host)
    assert info["threads"] == len(os.sched_getaffinity(0)) and info["runtime_version"].startswith("cuvil ")
    assert DeviceState.open(dev.root).profile == "host"  # it still compiles for exactly this CPU
