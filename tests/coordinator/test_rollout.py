"""Canary rollout per class over a fake fleet: a damaged candidate is rolled back, a better one promoted."""

from __future__ import annotations

import pytest

from cuvil.coordinator.config import RunConfig
from cuvil.coordinator.rollout import canaries, rollout
from cuvil.coordinator.rollout_rule import DecisionRule, RolloutError
from cuvil.coordinator.rounds import Coordinator
from cuvil.coordinator.store import ResultsStore

from .fakes import NODE, A, B, FakeTransport, make_fleet


@pytest.fixture
def store(tmp_path):
    s = ResultsStore(tmp_path / "r.db")
    yield s
    s.close()


def _coord(store, accuracy_of):
    devs = make_fleet()
    for d in devs.values():
        d.held.add(A.content_hash)  # the fleet runs A and holds it
    t = FakeTransport(devs, accuracy_of=accuracy_of)
    coord = Coordinator(t, store, store.start_run({}), RunConfig(poll_interval=0.001, round_timeout=5.0))
    coord.inventory()
    return coord, devs


def test_a_damaged_candidate_is_rolled_back_on_its_canaries_and_reaches_no_other_device(store):
    coord, devs = _coord(store, {A.content_hash: 0.9, B.content_hash: 0.2})
    outcome = rollout(coord, A, B, 1, 0.3, DecisionRule())
    decisions = outcome.decisions
    assert {c: d.decision for c, d in decisions.items()} == {"orin": "rollback", "rpi5": "rollback", "x86": "rollback"}
    rows = store.rollouts(coord.run_id)
    assert [(r["device_class"], r["decision"], r["canaries"], r["class_devices"]) for r in rows] == [
        ("orin", "rollback", 1, 1), ("rpi5", "rollback", 1, 2), ("x86", "rollback", 1, 3)]
    assert all(r["diff"] < -0.5 and r["bound"] < 0 and r["applied"] == 1 for r in rows)
    canary = {dev.device_id for dev in devs.values() if dev.previous}
    assert len(canary) == 3  # one per class tried B, kept A as previous ...
    for dev in devs.values():
        assert dev.active in (None, A.content_hash)  # ... and every device runs A again
        assert (B.content_hash in dev.held) == (dev.device_id in canary)  # B went to the canaries only
    assert outcome.running() == {A.content_hash: sorted(d.device_id for d in devs.values())}


def test_a_better_candidate_is_promoted_to_the_whole_class(store):
    coord, devs = _coord(store, {A.content_hash: 0.6, B.content_hash: 0.9})
    outcome = rollout(coord, A, B, 1, 0.3, DecisionRule())
    assert all(d.decision == "promote" and d.diff > 0.2 for d in outcome.decisions.values())
    for dev in devs.values():
        assert dev.active == B.content_hash and dev.previous == A.content_hash  # can revert without a download
    assert [r["applied"] for r in store.rollouts(coord.run_id)] == [1, 2, 3]
    assert outcome.running() == {B.content_hash: sorted(d.device_id for d in devs.values())}


def test_a_class_whose_canaries_did_not_report_is_rolled_back(store):
    coord, devs = _coord(store, {A.content_hash: 0.6, B.content_hash: 0.9})
    for dev in devs.values():
        if dev.profile == "orin":
            dev.behaviour = "crash"
    decisions = rollout(coord, A, B, 1, 0.5, DecisionRule()).decisions
    assert decisions["orin"].decision == "rollback" and "no canary" in decisions["orin"].reason
    assert decisions["x86"].decision == "promote"


def test_a_device_that_fails_to_switch_is_counted_as_running_what_it_reported(store):
    coord, devs = _coord(store, {A.content_hash: 0.6, B.content_hash: 0.9})
    devs[NODE + 2].behaviour = "stuck"  # d2 (x86) evaluates but refuses every activate/revert
    outcome = rollout(coord, A, B, 1, 0.3, DecisionRule())
    assert outcome.decisions["x86"].decision == "promote"
    assert outcome.running()[A.content_hash] == ["d2"]  # not counted as running B
    assert outcome.active["d0"] == B.content_hash and devs[NODE + 2].active is None
    assert {r["device_class"]: r["applied"] for r in store.rollouts(coord.run_id)}["x86"] == 2


def test_a_canary_that_fails_to_revert_still_runs_the_candidate(store):
    coord, devs = _coord(store, {A.content_hash: 0.9, B.content_hash: 0.2})
    orin = next(n for n, d in devs.items() if d.profile == "orin")
    transport_send = coord.t.send

    def send(requests):  # the orin device switches to B, then refuses the revert
        if any(r.kind == "activate" and r.config["action"] == "revert" for r in requests):
            devs[orin].behaviour = "stuck"
        return transport_send(requests)

    coord.t.send = send
    outcome = rollout(coord, A, B, 1, 0.3, DecisionRule())
    assert outcome.decisions["orin"].decision == "rollback"
    assert outcome.running()[B.content_hash] == [devs[orin].device_id]
    assert {r["device_class"]: r["applied"] for r in store.rollouts(coord.run_id)}["orin"] == 0


def test_canaries_are_a_fraction_of_each_class_at_least_one(store):
    coord, _ = _coord(store, {})
    assert {c: len(d) for c, d in canaries(coord, 1, 0.5).items()} == {"orin": 1, "rpi5": 1, "x86": 2}
    assert canaries(coord, 1, 0.5) == canaries(coord, 1, 0.5)  # seeded: a resumed run picks the same
    with pytest.raises(RolloutError):
        canaries(coord, 1, 1.5)
