"""A device is who its node's key says, not what it calls itself: an impostor cannot act for a victim."""

from __future__ import annotations

import hashlib

import pytest

from cuvil.coordinator.config import RunConfig
from cuvil.coordinator.identity import NAME_CHARS, device_identity
from cuvil.coordinator.rounds import Coordinator
from cuvil.coordinator.store import ResultsStore

from .fakes import NODE, A, FakeDevice, FakeTransport


def test_identity_is_the_name_bound_to_the_key_fingerprint():
    key = b"\x01" * 32
    fp = hashlib.sha256(key).hexdigest()[:16]
    assert device_identity("cam-7", 5, {5: key}) == f"cam-7@{fp}"
    assert device_identity("cam-7", 5, {5: b"\x02" * 32}) != f"cam-7@{fp}"
    assert device_identity("cam-7", 5, {}) == "cam-7@node5"
    assert device_identity("cam-7", 5, None) == "cam-7"  # simulation: this process provisioned the device
    assert device_identity("x" * 1000, 5, None) == "x" * NAME_CHARS


@pytest.fixture
def store(tmp_path):
    s = ResultsStore(tmp_path / "r.db")
    yield s
    s.close()


def _fleet(impostor_behaviour: str):
    return {NODE: FakeDevice("victim", "x86", key=b"victim-key"),
            NODE + 1: FakeDevice("other", "x86", key=b"other-key"),
            NODE + 2: FakeDevice("victim", "x86", impostor_behaviour, key=b"impostor-key")}


def _coord(store, devs):
    cfg = RunConfig(round_timeout=1.0, inventory_timeout=0.5, poll_interval=0.01, node_wait=0.1)
    coord = Coordinator(FakeTransport(devs), store, store.start_run({}), cfg)
    coord.inventory()
    return coord


def test_an_impostor_refusing_for_budget_does_not_exclude_the_victim(store):
    devs = _fleet("exhausted")
    coord = _coord(store, devs)
    assert len(coord.devices) == 3  # the impostor does not replace the victim's node either
    victim, impostor = (device_identity("victim", 0, {0: k}) for k in (b"victim-key", b"impostor-key"))
    out = coord.evaluate_round(A, 1)
    assert [(f["device_id"], f["kind"]) for f in out.failures] == [(impostor, "budget_exhausted")]
    assert victim in {r["device_id"] for r in out.reports}
    assert store.exhausted_devices("digits-local") == {impostor}
    later = _coord(store, devs)  # a later run: the victim is sampled, the impostor is not
    assert victim in later.sample(1) and impostor not in later.sample(1)


def test_an_impostors_report_is_kept_apart_from_the_victims(store):
    devs = _fleet("inflate")
    out = _coord(store, devs).evaluate_round(A, 1)
    by_device = {r["device_id"] for r in out.reports}
    assert len(by_device) == 2 and all(d.split("@")[0] in ("victim", "other") for d in by_device)
    assert len(out.failures) == 1 and out.failures[0]["device_id"] not in by_device
