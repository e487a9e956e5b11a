"""Delivery in Flower's simulation engine in proportion to the messages waiting, not to the fleet.

Flower 1.42's engine (``vce_api.add_messages_to_queue``) asks the in-memory link state for every
registered node's next message on every pass, 0.1 s apart, and each ask checks every message in the
store: a pass costs nodes x messages in flight (at 10,000 nodes it never rests), and a node gets at
most one message per pass, so the engine delivers at most a window of messages every pass.
:func:`pending_delivery` swaps in a pass that reads which nodes hold an undelivered message (one look
at the store) and asks only those, through Flower's own ``get_message_ins`` (its expiry and
federation checks, its delivery mark), with a shorter pause. It holds for in-process simulations
(:func:`cuvil.coordinator.simulation.run_fleet_simulation`) while they run; a link state without the
in-memory store gets Flower's own pass.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from queue import Queue
from typing import Any

PASS_PAUSE_S = 0.01  # between passes: a pass now costs what waits, so it may come often


def deliver_pending(state: Any, queue: Queue, nodes_mapping: Mapping[int, int], f_stop: threading.Event,
                    flower_pass: Callable[..., None] | None = None) -> None:
    """Flower's extractor thread, asking only the nodes that have a message waiting."""
    store, lock = getattr(state, "message_ins_store", None), getattr(state, "lock", None)
    if not isinstance(store, dict) or lock is None:
        if flower_pass is None:
            raise TypeError("this link state keeps no in-memory message store")
        return flower_pass(state, queue, nodes_mapping, f_stop)
    while not f_stop.is_set():
        with lock:
            waiting = {m.metadata.dst_node_id for m in store.values() if m.metadata.delivered_at == ""}
        for node_id in waiting:
            if node_id in nodes_mapping:
                for msg in state.get_message_ins(node_id=node_id, limit=1):
                    queue.put(msg)
        f_stop.wait(PASS_PAUSE_S)
    return None


@contextmanager
def pending_delivery() -> Iterator[None]:
    """Flower's simulation engine delivers with :func:`deliver_pending` inside this block."""
    from flwr.server.superlink.fleet.vce import vce_api

    flower_pass = vce_api.add_messages_to_queue

    def extractor(state, queue, nodes_mapping, f_stop):
        return deliver_pending(state, queue, nodes_mapping, f_stop, flower_pass)

    vce_api.add_messages_to_queue = extractor
    try:
        yield
    finally:
        vce_api.add_messages_to_queue = flower_pass
