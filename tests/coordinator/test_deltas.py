"""The coordinator pushes a version as a signed delta from one the device holds, over real devices
(the ClientApp called in-process): smaller on the wire, the exact bundle installed, and the full
bundle sent when the device lacks the parent or refuses the delta."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Context, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from cuvil.compiler.bundle import bundle_bytes, load_private_key  # noqa: E402
from cuvil.coordinator import messages  # noqa: E402
from cuvil.coordinator.client_app import make_client_app  # noqa: E402
from cuvil.coordinator.config import RunConfig  # noqa: E402
from cuvil.coordinator.deltas import DeltaBook  # noqa: E402
from cuvil.coordinator.device import DeviceState  # noqa: E402
from cuvil.coordinator.device_versions import read_versions  # noqa: E402
from cuvil.coordinator.exchange import Reply  # noqa: E402
from cuvil.coordinator.fleet import device_data, host_class  # noqa: E402
from cuvil.coordinator.rollout import switch  # noqa: E402
from cuvil.coordinator.rounds import BundleRef, Coordinator  # noqa: E402
from cuvil.coordinator.server_app import CONTENT  # noqa: E402
from cuvil.coordinator.store import ResultsStore  # noqa: E402
from cuvil.fleet_example import digits_mlp  # noqa: E402

from .fleet_helpers import make_keys  # noqa: E402

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1


class AppTransport:
    """Each node a real device: its ClientApp answers every message at once; ``tamper`` flips a delta byte."""

    def __init__(self, states: dict[int, DeviceState], tamper: bool = False):
        self.app, self.states, self.tamper = make_client_app(), states, tamper
        self.outbox: dict[str, Reply] = {}
        self.sent: list = []

    def node_ids(self):
        return list(self.states)

    def node_keys(self):
        return None

    def send(self, requests):
        handles = []
        for r in requests:
            self.sent.append(r)
            delta = r.delta
            if delta is not None and self.tamper:
                delta = delta[:-1] + bytes([delta[-1] ^ 1])
            build, mtype = CONTENT[r.kind]
            ctx = Context(run_id=1, node_id=r.node_id, node_config={"state-dir": str(self.states[r.node_id].root)},
                          state=RecordDict(), run_config={})
            m = self.app(Message(build(r.config, r.bundle, delta), r.node_id, mtype), ctx)
            h = f"m{len(self.sent)}"
            self.outbox[h] = Reply(h, False, code=int(m.error.code), reason=m.error.reason) if m.has_error() else \
                Reply(h, True, messages.reply_payload(m))
            handles.append(h)
        return handles

    def poll(self, handles):
        return [self.outbox.pop(h) for h in list(handles) if h in self.outbox]


@pytest.fixture()
def world(tmp_path):
    keys = make_keys(tmp_path)
    key = load_private_key(keys.private_path)
    g = digits_mlp(0, hidden=64, epochs=2)  # big enough (some 20 kB) that a delta pays
    moved = {n: (w + np.random.default_rng(1).normal(0, 1e-4, w.shape)).astype(w.dtype) if n.endswith("w2") or
             w.ndim == 2 and w.shape[1] == 10 else w for n, w in g.constants.items()}
    v1 = BundleRef.from_bytes(bundle_bytes(g, key, name="m", version="1"))
    v2 = BundleRef.from_bytes(bundle_bytes(g.replace(constants=moved), key, name="m", version="2"))
    assert v1.content_hash != v2.content_hash
    states = {n: DeviceState.provision(tmp_path / f"d{n}", f"dev-{n}", host_class(), [keys.public_path],
                                       data=device_data(n, 4)) for n in (1, 2, 3)}
    for n in (1, 2):  # two devices hold and run v1; the third holds nothing
        states[n].bundle_path(v1.content_hash).write_bytes(v1.data)
    store = ResultsStore(tmp_path / "r.db")
    yield keys, v1, v2, states, store
    store.close()


def _coord(store, transport, key_path: str) -> Coordinator:
    coord = Coordinator(transport, store, store.start_run({}),
                        RunConfig(poll_interval=0.001, round_timeout=30.0, signing_key=key_path))
    coord.inventory()
    return coord


def test_a_rollout_pushes_the_candidate_as_a_delta_to_devices_holding_its_parent(world):
    keys, v1, v2, states, store = world
    t = AppTransport(states)
    coord = _coord(store, t, str(keys.private_path))
    coord.deltas.know(v1)
    active = {**switch(coord, ["dev-1", "dev-2"], v2, "activate", base=v1), **switch(coord, ["dev-3"], v2, "activate")}
    assert active == {f"dev-{n}": v2.content_hash for n in (1, 2, 3)}
    by_node = {r.node_id: r for r in t.sent if r.kind == "activate"}
    assert by_node[1].delta and by_node[2].delta and by_node[1].bundle is None
    assert by_node[3].bundle == v2.data and by_node[3].delta is None  # no parent held: the full bundle
    assert len(by_node[1].delta) < 0.6 * len(v2.data)
    for n in (1, 2, 3):
        assert states[n].bundle_path(v2.content_hash).read_bytes() == v2.data
    w = coord.deltas.wire
    assert (w.deltas, w.delta, w.replaced, w.full) == (2, 2 * len(by_node[1].delta), 2 * len(v2.data), len(v2.data))
    assert w.not_smaller == 0


def test_a_device_that_lost_the_parent_or_refuses_the_delta_gets_the_full_bundle(world):
    keys, v1, v2, states, store = world
    t = AppTransport(states, tamper=True)
    coord = _coord(store, t, str(keys.private_path))
    coord.deltas.know(v1)
    states[2].bundle_path(v1.content_hash).unlink()  # the inventory said it holds v1; it no longer does
    active = switch(coord, ["dev-1", "dev-2"], v2, "activate")
    assert active == {"dev-1": v2.content_hash, "dev-2": v2.content_hash}
    sent = [(r.node_id, r.delta is not None, r.bundle is not None) for r in t.sent if r.kind == "activate"]
    assert sorted(sent) == [(1, False, True), (1, True, False), (2, False, True), (2, True, False)]
    assert read_versions(states[1])["m"].active == v2.content_hash


def test_an_evaluation_round_pushes_deltas_and_without_a_key_full_bundles(world, tmp_path):
    keys, v1, v2, states, store = world
    for key_path, want_delta in ((str(keys.private_path), True), ("", False)):
        for s in states.values():
            s.bundle_path(v2.content_hash).unlink(missing_ok=True)
        t = AppTransport(states)
        coord = _coord(store, t, key_path)
        coord.evaluate_round(v1, 1 if want_delta else 3, devices=["dev-1"])
        out = coord.evaluate_round(v2, 2 if want_delta else 4, devices=["dev-1"])
        assert len(out.reports) == 1, out.failures
        pushed = [r for r in t.sent if r.kind == "evaluate" and r.config["bundle-hash"] == v2.content_hash][0]
        assert (pushed.delta is not None) == want_delta and out.bundle_bytes_sent == pushed.pushed
        assert (out.bundle_bytes_sent < len(v2.data)) == want_delta


def test_the_delta_book_picks_the_latest_held_version_of_the_same_model_and_only_a_smaller_delta(world):
    keys, v1, v2, _, _ = world
    book = DeltaBook(str(keys.private_path))
    other = BundleRef("other", "1", "c" * 64, b"x")
    for b in (v1, other):
        book.know(b)
    assert book.delta_for(v2, {other.content_hash}) is None  # another model is no parent
    assert book.delta_for(v2, set()) is None
    assert book.delta_for(v2, {v1.content_hash}) is not None
    assert book.delta_for(v1, {v2.content_hash}) is not None
    assert DeltaBook("").delta_for(v2, {v1.content_hash}) is None  # no key: full bundles
    tiny = BundleRef("m", "0", "d" * 64, b"not a bundle")  # a delta that cannot be made or is no smaller: none
    book.know(tiny)
    assert book.payload(v2, {tiny.content_hash}) == (v2.data, None) and book.wire.not_smaller == 1
    shutil.rmtree(keys.private_path.parent)
    assert book.delta_for(v2, {v1.content_hash}) is not None  # made once per pair, the key read once
