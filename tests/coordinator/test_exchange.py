"""exchange(): replies handed over as they arrive, a bounded number of messages out, never past the deadline."""

from __future__ import annotations

import time

from cuvil.coordinator.exchange import Reply, Request, exchange


class Echo:
    """Answers every message at the next poll; records how many were out at once."""

    def __init__(self, silent=()):
        self.silent, self.out, self.most_out, self.n = set(silent), {}, 0, 0

    def node_ids(self):
        return []

    def node_keys(self):
        return None

    def send(self, requests):
        handles = []
        for r in requests:
            self.n += 1
            handles.append(f"h{self.n}")
            self.out[f"h{self.n}"] = r
        self.most_out = max(self.most_out, len(self.out))
        return handles

    def poll(self, handles):
        ready = [h for h in handles if self.out[h].node_id not in self.silent]
        for h in ready:
            del self.out[h]
        return [Reply(h, True, {"n": 1}) for h in ready]


def test_a_window_bounds_the_messages_out_and_every_reply_is_handed_over_once():
    t, seen = Echo(), []
    missing = exchange(t, [Request(i, "info") for i in range(20)], time.monotonic() + 10, 0.001,
                       lambda req, rep: seen.append(req.node_id), window=3)
    assert missing == [] and sorted(seen) == list(range(20)) and t.most_out == 3


def test_a_follow_up_request_goes_out_in_the_same_exchange():
    t, seen = Echo(), []

    def on_reply(req, rep):
        seen.append((req.node_id, req.kind))
        return Request(req.node_id, "evaluate") if req.kind == "info" and req.node_id == 1 else None

    exchange(t, [Request(0, "info"), Request(1, "info")], time.monotonic() + 10, 0.001, on_reply)
    assert sorted(seen) == [(0, "info"), (1, "evaluate"), (1, "info")]


def test_silent_and_unsent_requests_come_back_at_the_deadline():
    t, waits = Echo(silent={1, 2, 3}), []
    start = time.monotonic()
    missing = exchange(t, [Request(i, "info") for i in range(6)], start + 0.3, 0.01, lambda req, rep: None,
                       lambda: waits.append(time.monotonic()), window=3)
    assert time.monotonic() - start < 2.0 and waits
    # 0 answered; 1-3 filled the window and stayed silent; 4 and 5 were never sent
    assert sorted(r.node_id for r in missing) == [1, 2, 3, 4, 5] and t.n == 4
