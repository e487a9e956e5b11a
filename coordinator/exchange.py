"""Messages to devices and their replies over an abstract transport (Flower's Grid in production).

:func:`exchange` sends requests, hands every reply to a callback *as it arrives* (so the caller can
commit it at once: a coordinator killed mid-round has committed every reply it pulled), and never
waits past its deadline. Sending goes out in batches so that replies are pulled, and ``on_wait`` is
called (heartbeat, progress), between batches of a large round too.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .messages import Code

SEND_BATCH = 256  # messages per push: bounded request size, and replies pulled between pushes
TTL_SLACK_S = 10.0  # a message outlives its deadline by this much: the deadline, not Flower's expiry, ends a wait


@dataclass(frozen=True)
class Request:
    node_id: int
    kind: str  # "info", "evaluate", "train" or "activate"
    config: Mapping[str, Any] = field(default_factory=dict)
    bundle: bytes | None = None
    ttl: float = 60.0
    delta: bytes | None = None  # instead of ``bundle``: a signed delta from a version the device holds

    @property
    def pushed(self) -> int:
        """Bytes of bundle or delta this request carries."""
        return len(self.bundle or b"") + len(self.delta or b"")


def ttl_until(deadline: float) -> float:
    """A request's TTL for a wait that ends at ``deadline`` (``time.monotonic()``): a little past it, so that
    the SuperLink never answers for a device that is merely slow (its expiry reply would arrive just before
    the deadline and read as a device error, not as the timeout it is)."""
    return max(1.0, deadline - time.monotonic()) + TTL_SLACK_S


def no_update() -> Mapping[str, Any]:
    return {}


@dataclass(frozen=True)
class Reply:
    handle: str
    ok: bool
    payload: Mapping[str, Any] = field(default_factory=dict)
    code: int = 0
    reason: str = ""
    update: Callable[[], Mapping[str, Any]] = no_update
    """A training reply's update: decoded and checked only when called, by the round that expects one (a
    ValueError names what is malformed), so a device's arrays are never read where none are expected."""


class Transport(Protocol):
    def node_ids(self) -> list[int]: ...
    def node_keys(self) -> Mapping[int, bytes] | None:
        """Node id -> the public key the node authenticated with; None where this process provisioned
        every node itself (simulation), so a node's name is its identity (:mod:`.identity`)."""
    def send(self, requests: Sequence[Request]) -> list[str | None]: ...
    def poll(self, handles: Collection[str]) -> list[Reply]: ...


def exchange(transport: Transport, requests: Sequence[Request], deadline: float, poll_interval: float,
             on_reply: Callable[[Request, Reply], Request | None],
             on_wait: Callable[[], None] = lambda: None, window: int = 0) -> list[Request]:
    """Send ``requests``; call ``on_reply`` per reply as it arrives until all are answered or ``deadline``
    (``time.monotonic()``) passes; return the requests left without a reply (sent or not).

    ``on_reply`` may return a follow-up request (a retry) to send at once; it is waited for like the rest.
    ``window``: at most this many requests out at once (0: no limit).
    """
    waiting: dict[str, Request] = {}
    outbox: list[Request] = list(requests)

    def answer(req: Request, rep: Reply) -> None:
        follow_up = on_reply(req, rep)
        if follow_up is not None:
            outbox.append(follow_up)

    def pull() -> None:
        if waiting:
            for rep in transport.poll(list(waiting)):
                req = waiting.pop(rep.handle, None)
                if req is not None:
                    answer(req, rep)

    while (outbox or waiting) and time.monotonic() < deadline:
        room = min(SEND_BATCH, window - len(waiting) if window else SEND_BATCH)
        if outbox and room > 0:
            batch, outbox[:room] = outbox[:room], []
            for handle, req in zip(transport.send(batch), batch):
                if handle is None:
                    answer(req, Reply("", False, code=Code.DEVICE_ERROR, reason="the message could not be pushed"))
                else:
                    waiting[handle] = req
        else:
            time.sleep(min(poll_interval, max(0.0, deadline - time.monotonic())))
        pull()
        on_wait()
    return [*waiting.values(), *outbox]
