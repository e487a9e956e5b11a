"""The simulation engine's delivery pass asks only nodes with a message waiting, through Flower's own ask."""

from __future__ import annotations

import pickle
import threading
from queue import Queue
from types import SimpleNamespace

import pytest

pytest.importorskip("flwr")

from flwr.server.superlink.fleet.vce import vce_api  # noqa: E402
from flwr.server.superlink.linkstate.in_memory_linkstate import InMemoryLinkState  # noqa: E402

from cuvil.coordinator.client_app import make_client_app  # noqa: E402
from cuvil.coordinator.sim_delivery import deliver_pending, pending_delivery  # noqa: E402


class FakeState:
    """The in-memory link state's store and lock, and an ask that delivers (marks) one message."""

    def __init__(self, waiting: dict[str, int]):
        self.lock = threading.RLock()
        self.message_ins_store = {mid: SimpleNamespace(metadata=SimpleNamespace(dst_node_id=node, delivered_at=""))
                                  for mid, node in waiting.items()}
        self.asked: list[int] = []

    def get_message_ins(self, node_id: int, limit: int):
        self.asked.append(node_id)
        for mid, m in self.message_ins_store.items():
            if m.metadata.dst_node_id == node_id and not m.metadata.delivered_at:
                m.metadata.delivered_at = "now"
                return [mid]
        return []


def test_only_nodes_with_a_waiting_message_are_asked():
    state = FakeState({"m1": 3, "m2": 7, "m3": 7, "m4": 99})  # node 99 is not in this simulation
    queue, stop = Queue(), threading.Event()
    thread = threading.Thread(target=deliver_pending, args=(state, queue, {n: n for n in range(10)}, stop))
    thread.start()
    delivered = sorted(queue.get(timeout=5) for _ in range(3))
    stop.set()
    thread.join(5)
    assert delivered == ["m1", "m2", "m3"] and queue.empty()
    assert set(state.asked) == {3, 7}  # never the 7 idle nodes, never a node outside the simulation


def test_a_state_without_the_in_memory_store_gets_flowers_pass():
    calls = []
    deliver_pending(object(), Queue(), {}, threading.Event(), lambda *a: calls.append(a))
    assert len(calls) == 1
    with pytest.raises(TypeError):
        deliver_pending(object(), Queue(), {}, threading.Event())


def test_the_swap_holds_inside_the_block_only_and_flower_still_has_what_it_replaces():
    original = vce_api.add_messages_to_queue
    assert original.__code__.co_varnames[:4] == ("state", "queue", "nodes_mapping", "f_stop")
    with pending_delivery():
        assert vce_api.add_messages_to_queue is not original
    assert vce_api.add_messages_to_queue is original
    fields = InMemoryLinkState.__init__.__code__.co_names
    assert "message_ins_store" in fields and "lock" in fields  # what deliver_pending reads


def test_the_client_app_pickles_as_the_call_that_builds_it():
    app = make_client_app({"sim-fleet-dir": "/x"})
    data = pickle.dumps(app)
    assert len(data) < 2000  # the overrides and a reference, not the handlers' code
    again = pickle.loads(data)
    assert type(again) is type(app) and again._built_from == app._built_from
