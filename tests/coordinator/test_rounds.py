"""The coordinator's main loop over a fake in-memory transport (unit tests only; e2e tests use Flower)."""

from __future__ import annotations

import time

import pytest
from flwr.common.constant import ErrorCode

from cuvil.coordinator.config import RunConfig
from cuvil.coordinator.rounds import Coordinator, compare
from cuvil.coordinator.exchange import Reply
from cuvil.coordinator.store import ResultsStore, StoreError

from .fakes import NODE, A, B, FakeDevice, FakeTransport, make_fleet
from .helpers import device_report


@pytest.fixture
def store(tmp_path):
    s = ResultsStore(tmp_path / "r.db")
    yield s
    s.close()


def _coord(store, devs, **cfg):
    config = RunConfig(round_timeout=1.0, inventory_timeout=0.5, poll_interval=0.01, node_wait=0.1, **cfg)
    return Coordinator(FakeTransport(devs), store, store.start_run({}), config)


def test_inventory_records_devices_and_never_waits_for_a_silent_one(store):
    devs = make_fleet(d5="silent")
    coord = _coord(store, devs)
    t0 = time.monotonic()
    found = coord.inventory()
    assert time.monotonic() - t0 < 2.0
    assert sorted(v.device_id for v in found.values()) == ["d0", "d1", "d2", "d3", "d4"]
    assert [d["device_id"] for d in store.devices()] == ["d0", "d1", "d2", "d3", "d4"]


def test_sampling_is_per_class(store):
    coord = _coord(store, make_fleet(), sample_per_class=1)
    coord.inventory()
    picked = coord.sample(1)
    profile = {v.device_id: v.profile for v in coord.devices.values()}
    assert sorted(profile[d] for d in picked) == ["orin", "rpi5", "x86"]
    assert coord.sample(1) == picked  # seeded per round


def test_bundle_goes_only_to_devices_that_do_not_hold_it(store):
    devs = make_fleet()
    devs[NODE + 1].held.add(A.content_hash)
    coord = _coord(store, devs)
    coord.inventory()
    r1 = coord.evaluate_round(A, 1)
    assert len(r1.reports) == 6 and r1.bundle_bytes_sent == 5 * len(A.data)
    assert devs[NODE + 1].received_bytes == 0
    r2 = coord.evaluate_round(A, 2)
    assert len(r2.reports) == 6 and r2.bundle_bytes_sent == 0
    assert [r["bundle_bytes_sent"] for r in store.rounds(coord.run_id)] == [5000, 0]


def test_failures_timeouts_refusals_and_budget_are_counted_apart(store):
    devs = make_fleet(d1="crash", d3="refuse", d4="exhausted")
    coord = _coord(store, devs)
    coord.inventory()
    devs[NODE + 5].behaviour = "silent"  # answered the inventory, then went away
    t0 = time.monotonic()
    out = coord.evaluate_round(A, 1)
    assert time.monotonic() - t0 < 3.0  # bounded by the round timeout
    assert out.failure_counts() == {"failure": 1, "refused": 1, "budget_exhausted": 1, "timeout": 1}
    assert len(out.reports) == 2
    kinds = sorted((f["device_id"], f["kind"]) for f in store.failures(out.round_id))
    assert kinds == [("d1", "failure"), ("d3", "refused"), ("d4", "budget_exhausted"), ("d5", "timeout")]
    agg = out.aggregates
    assert agg["all"].failures == {"failure": 1, "refused": 1, "budget_exhausted": 1, "timeout": 1}


def test_an_implausible_report_is_a_failure_and_moves_no_estimate(store):
    devs = make_fleet(d1="inflate")  # d1 claims 999 times as many correct examples as it has
    coord = _coord(store, devs)
    coord.inventory()
    out = coord.evaluate_round(A, 1)
    assert [(f["device_id"], f["kind"]) for f in out.failures] == [("d1", "failure")]
    assert out.failures[0]["reason"].startswith("bad report: noisy correct")
    assert len(store.reports(out.round_id)) == 5 and "d1" not in {r["device_id"] for r in out.reports}
    assert 0.8 < out.aggregates["all"].accuracy < 1.0  # the honest devices' 0.9


def test_a_device_whose_budget_is_spent_is_not_sampled_again_for_that_dataset(store):
    devs = make_fleet(d4="exhausted")
    coord = _coord(store, devs)
    coord.inventory()
    coord.evaluate_round(A, 1)
    calls = devs[NODE + 4].calls
    coord.evaluate_round(A, 2)
    assert devs[NODE + 4].calls == calls and store.exhausted_devices("digits-local") == {"d4"}
    other = _coord(store, devs, dataset="other-data")
    other.inventory()
    assert "d4" in other.sample(1)


def test_a_device_that_lost_the_bundle_gets_it_again_in_the_same_round(store):
    devs = make_fleet(d2="forgetful")
    devs[NODE + 2].held.add(A.content_hash)
    coord = _coord(store, devs)
    coord.inventory()
    out = coord.evaluate_round(A, 1)
    assert len(out.reports) == 6 and not out.failures and devs[NODE + 2].received_bytes == len(A.data)


def test_ab_round_compares_both_versions_on_the_same_devices(store):
    devs = make_fleet(d5="exhausted")
    coord = _coord(store, devs, sample_per_class=2)
    coord.inventory()
    ra, rb, cmp = coord.ab_round(A, B, 1)
    assert {r["device_id"] for r in ra.reports} == {r["device_id"] for r in rb.reports}
    assert [r["kind"] for r in store.rounds(coord.run_id)] == ["ab:A", "ab:B"]
    assert cmp["all"]["devices"] == len(ra.reports) and cmp["all"]["diff"] < -0.2
    assert cmp["all"]["se"] > 0 and "x86" in cmp


def test_compare_uses_only_paired_devices():
    ra = [{"device_id": "x", "profile": "p", "metrics": device_report(1, 0.9)[0]}]
    rb = [{"device_id": "y", "profile": "p", "metrics": device_report(2, 0.5)[0]}]
    assert compare(ra, rb) == {}


def test_results_survive_a_killed_coordinator(tmp_path):
    path = tmp_path / "r.db"
    s1 = ResultsStore(path)
    coord = _coord(s1, make_fleet())
    coord.inventory()
    coord.evaluate_round(A, 1)
    del coord, s1  # no close, no finish_run: as if killed
    s2 = ResultsStore(path)
    (run,) = s2.runs()
    assert run["status"] == "running" and len(s2.reports(s2.rounds(run["id"])[0]["id"])) == 6


def test_a_device_back_under_a_new_node_id_replaces_its_old_entry(store):
    devs = make_fleet()
    coord = _coord(store, devs)
    coord.inventory()
    old = next(n for n, d in devs.items() if d.device_id == "d2")
    devs[NODE + 7] = FakeDevice("d2", devs[old].profile)  # its old node is still listed: Flower has not noticed
    coord.refresh()
    assert [n for n, v in coord.devices.items() if v.device_id == "d2"] == [NODE + 7]
    assert len(coord.devices) == len(devs) - 1


def _flower_expires(coord, device_ids):
    """Flower answers for these devices that their message expired (its TTL passed before a reply)."""
    send = coord.t.send

    def expiring(requests):
        handles = send(requests)
        for h, r in zip(handles, requests):
            if coord.t.devices[r.node_id].device_id in device_ids:
                coord.t.outbox[h] = Reply(h, False, code=ErrorCode.MESSAGE_UNAVAILABLE,
                                          reason="Error: Message Unavailable - ... It may have expired due to its TTL")
        return handles

    coord.t.send = expiring


def test_a_message_that_expired_unanswered_is_a_timeout_not_a_failure(store):
    devs = make_fleet()
    coord = _coord(store, devs)
    events = []
    coord.emit = lambda event, **kw: events.append((event, kw))
    _flower_expires(coord, {"d5"})
    coord.inventory()
    assert ("inventory", {"devices": 5, "silent": 1, "classes": {"rpi5": 2, "x86": 3}}) in events
    assert not [e for e, _ in events if e == "inventory_error"]
    _flower_expires(coord, {"d4"})
    out = coord.evaluate_round(A, 1)
    assert [(f["device_id"], f["kind"], f["reason"]) for f in store.failures(out.round_id)] == [
        ("d4", "timeout", "no reply within the round's 1 s")]


def test_a_message_outlives_its_deadline_so_the_deadline_decides(store):
    coord = _coord(store, make_fleet())
    sent = []
    send = coord.t.send
    coord.t.send = lambda requests: sent.extend(requests) or send(requests)
    coord.inventory()
    coord.evaluate_round(A, 1)
    assert {r.kind for r in sent} == {"info", "evaluate"}
    assert all(r.ttl > {"info": 0.5, "evaluate": 1.0}[r.kind] + 1 for r in sent)


def test_a_heartbeat_that_cannot_be_written_is_skipped_and_the_round_goes_on(store, monkeypatch):
    devs = make_fleet()
    coord = _coord(store, devs)
    coord.inventory()
    devs[NODE + 5].behaviour = "silent"  # the round waits for it: the heartbeat is due meanwhile
    events = []
    coord.emit = lambda event, **kw: events.append((event, kw))

    def locked(run_id):
        raise StoreError("cannot write results database r.db: database is locked")

    monkeypatch.setattr(store, "heartbeat", locked)
    monkeypatch.setattr("cuvil.coordinator.rounds.HEARTBEAT_EVERY_S", 0.2)
    out = coord.evaluate_round(A, 1)
    assert len(out.reports) == 5 and out.failure_counts() == {"timeout": 1}
    skipped = [kw for e, kw in events if e == "heartbeat_skipped"]
    assert skipped and "database is locked" in skipped[0]["reason"]
