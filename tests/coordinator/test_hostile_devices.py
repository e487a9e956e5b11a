"""Hostile devices against the coordinator: whole runs over the real GridTransport (real flwr Messages on a
fake Grid). Whatever one device sends is that device's failure, recorded once; the run goes on."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, Error, Message, MetricRecord, RecordDict  # noqa: E402

from cuvil.coordinator import messages  # noqa: E402
from cuvil.coordinator.config import RunConfig  # noqa: E402
from cuvil.coordinator.device_text import REASON_CHARS  # noqa: E402
from cuvil.coordinator.progress import ProgressLog  # noqa: E402
from cuvil.coordinator.rounds import BundleRef  # noqa: E402
from cuvil.coordinator.runs import drive_run  # noqa: E402
from cuvil.coordinator.server_app import GridTransport  # noqa: E402
from cuvil.coordinator.store import ResultsStore  # noqa: E402

from .fleet_helpers import make_bundle, make_keys  # noqa: E402
from .grid_fakes import BAD_ARRAYS, UPDATE_METRICS, FakeGrid, device, trainer  # noqa: E402
from .helpers import device_report  # noqa: E402


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    keys = make_keys(root)
    bundle = make_bundle(root, keys, epochs=1)
    weights = {k: v for k, v in BundleRef.from_file(bundle).graph().constants.items() if v.dtype == np.float32}
    return bundle, keys, weights


def _run(tmp_path, world, nodes, **knobs):
    """Drive a run over ``nodes``; (the results store, the progress lines, the events as emitted)."""
    bundle, keys, _ = world
    shutil.copy(bundle, tmp_path / bundle.name)  # the new version is written beside it
    lines, events = [], []
    log = ProgressLog(lines.append)

    def on_event(event, **kw):
        events.append((event, kw))
        log(event, **kw)

    cfg = RunConfig(db_path=str(tmp_path / "r.db"), bundle=str(tmp_path / bundle.name), round_timeout=10.0,
                    inventory_timeout=5.0, poll_interval=0.005, node_wait=0.1, min_nodes=0,
                    signing_key=str(keys.private_path), **knobs)
    drive_run(GridTransport(FakeGrid(nodes), simulated=True), cfg, on_event)
    return ResultsStore(cfg.db_file), lines, events


def _round(store, kind):
    (run,) = store.runs()
    return next(r for r in store.rounds(run["id"]) if r["kind"] == kind)


def _bad_update(weights, bad: tuple):
    """A training reply whose update has every weight, ``b2`` replaced by the malformed Array ``bad``."""
    def train(m: Message) -> Message:
        arrays = {k: Array(np.full(v.shape, 1e-4, np.float32)) for k, v in weights.items()}
        arrays["b2"] = Array(*bad)
        return Message(RecordDict({"metrics": MetricRecord(UPDATE_METRICS), "update": ArrayRecord(arrays)}),
                       reply_to=m)
    return train


def _junk_evaluate(m: Message) -> Message:
    """A valid report with a malformed update beside it (an evaluation reply's arrays are never read)."""
    reply = messages.metrics_reply(m, device_report(7, 0.9)[0])
    reply.content["update"] = ArrayRecord({"w": Array(*BAD_ARRAYS["empty-data"])})
    return reply


def test_hostile_training_replies_are_their_devices_failures_and_the_version_is_the_honest_ones(tmp_path, world):
    """Malformed arrays (F1), an update naming some of the weights (F4), ε past the budget or δ past the
    protocol's (F5): each a 'bad update' failure; the run finishes with the honest update's version."""
    weights = world[2]
    hostile = {f"arrays-{name}": device(f"arrays-{name}", {"can_train": 1}, train=_bad_update(weights, bad))
               for name, bad in BAD_ARRAYS.items()}
    hostile |= {"some-weights": trainer("some-weights", {"b2": weights["b2"]}),
                "huge-epsilon": trainer("huge-epsilon", weights, dp_epsilon_spent=1e300),
                "loose-delta": trainer("loose-delta", weights, dp_delta=0.9999)}
    nodes = {i: node for i, node in enumerate([trainer("honest", weights), device("junk-eval", evaluate=_junk_evaluate),
                                               *hostile.values()], start=1)}
    store, _, _ = _run(tmp_path, world, nodes, train_rounds=1)
    (run,) = store.runs()
    assert run["status"] == "finished", run["reason"]
    assert "junk-eval" in {r["device_id"] for r in store.reports(_round(store, "eval")["id"])}
    train = _round(store, "train")["id"]
    failures = {f["device_id"]: f for f in store.failures(train)}
    assert set(failures) == set(hostile)
    assert all(f["kind"] == "failure" and f["reason"].startswith("bad update: ") for f in failures.values())
    assert [u["device_id"] for u in store.updates(train)] == ["honest"]
    (version,) = store.versions()
    assert (version["devices"], version["epsilon"], version["delta"]) == (1, 0.5, 1e-6)


HOSTILE_INFO = [{"threads": math.inf}, {"threads": 1e300}, {"threads": -5}, {"threads": 2**63 - 1}, {"threads": 0},
                {"threads": True}, {"threads": "4"}, {"threads": 4.0}, {"can_train": "yes"}, {"can_train": [1]},
                {"can_train": math.inf}, {"can_train": 2}, {"emulated": "no"}, {"held_bundles": 5}]


def test_a_stored_update_todays_check_refuses_is_left_out_of_fedavg(tmp_path, world, monkeypatch):
    """A store written by an older Cuvil may hold an update of some weights only (F4, before the check):
    Flower's FedAvg raised InconsistentMessageReplies and the (resumed) run aborted. Stored here by a
    check that looks at no array, it is left out of the average, with a progress line."""
    from cuvil.coordinator import update_check

    monkeypatch.setattr(update_check, "check_arrays", lambda arrays, graph, bounds: None)  # the older check
    weights = world[2]
    nodes = {1: trainer("honest", weights), 2: trainer("some-weights", {"b2": weights["b2"]})}
    store, lines, _ = _run(tmp_path, world, nodes, train_rounds=1)
    (run,) = store.runs()
    assert run["status"] == "finished", run["reason"]
    assert sorted(u["device_id"] for u in store.updates(_round(store, "train")["id"])) == ["honest", "some-weights"]
    assert store.versions()[0]["devices"] == 1
    (line,) = [ln for ln in lines if "left out of FedAvg" in ln]
    assert "some-weights" in line and "trained weights" in line


def test_device_info_no_honest_device_sends_leaves_only_that_device_out(tmp_path, world):
    """threads and can_train of the wrong type or range (F2, F3): the device is not inventoried, nothing
    it sent is stored, and the fine-tuning run goes on with the honest trainer."""
    weights = world[2]
    nodes = {1: trainer("honest", weights)}
    nodes |= {i: trainer(f"bad-{i}", weights, info) for i, info in enumerate(HOSTILE_INFO, start=2)}
    store, lines, _ = _run(tmp_path, world, nodes, train_rounds=1)
    (run,) = store.runs()
    assert run["status"] == "finished", run["reason"]
    assert [(d["device_id"], d["threads"]) for d in store.devices()] == [("honest", 4)]
    assert [r["device_id"] for r in store.requests(_round(store, "train")["id"])] == ["honest"]
    for node in range(2, len(HOSTILE_INFO) + 2):
        assert any(line.startswith(f"inventory: node {node} failed: bad device info: ") for line in lines), node


def test_a_long_reason_is_cut_to_the_stores_length_in_events_and_progress_lines(tmp_path, world):
    """A 1 MiB reason at the inventory or in a round (F10) is stored, emitted and shown cut to REASON_CHARS."""
    big = "N" * (1 << 20)

    def failing(m: Message) -> Message:
        return Message(Error(code=messages.Code.DEVICE_ERROR, reason=big), reply_to=m)

    nodes = {1: device("honest"), 2: device("evil", evaluate=failing), 3: failing}
    store, lines, events = _run(tmp_path, world, nodes)
    assert store.runs()[0]["status"] == "finished"
    reasons = [kw["reason"] for event, kw in events if event in ("inventory_error", "reply") and kw["reason"]]
    assert reasons and all(len(r) == REASON_CHARS for r in reasons)
    assert max(len(line) for line in lines) < REASON_CHARS + 100
    assert [len(f["reason"]) for f in store.failures(_round(store, "eval")["id"])] == [REASON_CHARS]
