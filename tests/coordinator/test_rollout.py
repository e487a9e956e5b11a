"""Canary rollout per class over a fake fleet: a damaged candidate is rolled back, a better one promoted."""

from __future__ import annotations

import dataclasses

import pytest
from flwr.common.constant import ErrorCode

from cuvil.coordinator.config import RunConfig
from cuvil.coordinator.exchange import Reply
from cuvil.coordinator.rollout import UNKNOWN, canaries, rollout
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


def _late(coord, devs, device_ids, actions, flower_error=False):
    """The devices apply ``actions`` (switch actions) but their answers never come in time (or Flower
    answers for them that the message expired): a SuperNode stalled past the deadline, then resumed."""
    transport_send = coord.t.send
    coord.cfg = dataclasses.replace(coord.cfg, round_timeout=0.5)  # how long a switch waits for its answers

    def send(requests):
        handles = transport_send(requests)
        for h, r in zip(handles, requests):
            dev = devs[r.node_id]
            if r.kind == "activate" and dev.device_id in device_ids and r.config["action"] in actions:
                coord.t.outbox.pop(h)
                if flower_error:
                    coord.t.outbox[h] = Reply(h, False, code=ErrorCode.MESSAGE_UNAVAILABLE, reason="expired")
        return handles

    coord.t.send = send


@pytest.mark.parametrize("flower_error", [False, True])
def test_a_rollback_reverts_a_canary_whose_activation_answered_late(store, flower_error):
    coord, devs = _coord(store, {A.content_hash: 0.9, B.content_hash: 0.2})
    groups = canaries(coord, 1, 0.3)
    late = set(groups["x86"])
    _late(coord, devs, late, {"activate"}, flower_error)
    outcome = rollout(coord, A, B, 1, 0.3, DecisionRule())
    assert outcome.decisions["x86"].decision == "rollback"
    for dev in devs.values():
        assert dev.active in (None, A.content_hash), dev.device_id  # the late canary activated B, then reverted
    assert outcome.running() == {A.content_hash: sorted(d.device_id for d in devs.values())}
    assert {r["device_class"]: r["applied"] for r in store.rollouts(coord.run_id)}["x86"] == 1


def test_a_device_whose_switches_went_unanswered_runs_an_unknown_version(store):
    coord, devs = _coord(store, {A.content_hash: 0.9, B.content_hash: 0.2})
    late = set(canaries(coord, 1, 0.3)["x86"])
    _late(coord, devs, late, {"activate", "revert"})
    events = []
    coord.emit = lambda event, **kw: events.append((event, kw))
    outcome = rollout(coord, A, B, 1, 0.3, DecisionRule())
    assert {d: v for d, v in outcome.active.items() if v == UNKNOWN} == dict.fromkeys(late, UNKNOWN)
    assert set(outcome.running()[A.content_hash]).isdisjoint(late)  # never evaluated as running A
    x86 = next(kw for e, kw in events if e == "rollout" and kw["device_class"] == "x86")
    assert x86["applied"] == 0 and x86["unknown"] == 1
    stored = {r["device_class"]: r for r in store.rollouts(coord.run_id)}["x86"]  # the results say so too
    assert (stored["applied"], stored["unknown"]) == (0, 1)


def test_a_promoted_device_that_answered_late_is_not_counted_as_running_a(store):
    coord, devs = _coord(store, {A.content_hash: 0.6, B.content_hash: 0.9})
    late = {next(d for d in ("d0", "d1", "d2") if d not in canaries(coord, 1, 0.3)["x86"])}
    _late(coord, devs, late, {"activate"})
    outcome = rollout(coord, A, B, 1, 0.3, DecisionRule())
    assert all(d.decision == "promote" for d in outcome.decisions.values())
    assert {d: outcome.active[d] for d in late} == dict.fromkeys(late, UNKNOWN)
    assert set(outcome.running()[B.content_hash]) | late == {d.device_id for d in devs.values()}


def test_canaries_are_a_fraction_of_each_class_at_least_one(store):
    coord, _ = _coord(store, {})
    assert {c: len(d) for c, d in canaries(coord, 1, 0.5).items()} == {"orin": 1, "rpi5": 1, "x86": 2}
    assert canaries(coord, 1, 0.5) == canaries(coord, 1, 0.5)  # seeded: a resumed run picks the same
    with pytest.raises(RolloutError):
        canaries(coord, 1, 1.5)
