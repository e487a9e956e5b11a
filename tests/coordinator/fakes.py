"""An in-memory fleet behind the coordinator's Transport (unit tests only; e2e tests use Flower).

A fake device keeps the device-side contract the coordinator relies on: a repeated release-id is
answered from the stored reply without a new charge.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cuvil.coordinator.exchange import Reply
from cuvil.coordinator.messages import Code
from cuvil.coordinator.rounds import BundleRef

from .helpers import device_report

A = BundleRef("m", "1", "a" * 64, b"A" * 1000)
B = BundleRef("m", "2", "b" * 64, b"B" * 2000)
NODE = 2**63 + 100  # Flower node ids are uint64: beyond int64 and exact float range


class Killed(BaseException):
    """Stands in for the coordinator process dying (nothing after it runs in the coordinator)."""


@dataclass
class FakeDevice:
    device_id: str
    profile: str
    behaviour: str = "ok"  # ok | silent | crash | refuse | exhausted | forgetful | inflate (accuracy 999) | stuck
    # (stuck: evaluates, refuses to switch versions)
    held: set = field(default_factory=set)
    accuracy: float = 0.9
    received_bytes: int = 0
    calls: int = 0
    released: dict = field(default_factory=dict)  # release-id -> the reply it got (charged once each)
    release_ids: list = field(default_factory=list)  # every release-id it was asked for, in order
    active: str | None = None  # the version it runs (activate / revert messages)
    previous: str | None = None
    key: bytes = b""  # its node's public key (a fleet where no device has one is treated as simulated)


class FakeTransport:
    def __init__(self, devices: dict[int, FakeDevice], good_hash: str = A.content_hash,
                 accuracy_of: dict[str, float] | None = None):
        """``accuracy_of``: a bundle's true accuracy by content hash (default: the good one 0.9ish, others 0.5)."""
        self.devices, self.good_hash, self.accuracy_of = devices, good_hash, accuracy_of or {}
        self.outbox: dict[str, Reply] = {}
        self.n = 0

    def node_ids(self):
        return list(self.devices)

    def node_keys(self):
        if not any(dev.key for dev in self.devices.values()):
            return None  # like a simulation: names are identities
        return {n: dev.key for n, dev in self.devices.items()}

    def send(self, requests):
        handles = []
        for r in requests:
            self.n += 1
            h = f"m{self.n}"
            handles.append(h)
            dev = self.devices[r.node_id]
            dev.calls += 1
            if dev.behaviour == "silent":
                continue
            if r.kind == "info":
                self.outbox[h] = Reply(h, True, {"device_id": dev.device_id, "profile": dev.profile, "emulated": 0,
                                                 "held_bundles": sorted(dev.held), "cpu": "x", "features": "",
                                                 "runtime_version": "t", "isa": "x86_64/256-bit", "threads": 4})
                continue
            dev.received_bytes += len(r.bundle or b"")
            code = {"crash": Code.DEVICE_ERROR, "refuse": Code.SIGNATURE_REJECTED,
                    "exhausted": Code.BUDGET_EXHAUSTED}.get(dev.behaviour)
            if dev.behaviour == "stuck" and r.kind == "activate":
                code = Code.DEVICE_ERROR
            if dev.behaviour == "forgetful" and r.bundle is None:
                dev.behaviour = "ok"
                code = Code.BUNDLE_MISSING
            if code is not None:
                self.outbox[h] = Reply(h, False, code=code, reason=f"{code}")
                continue
            dev.held.add(r.config["bundle-hash"])
            if r.kind == "activate":
                self.outbox[h] = self._switch(h, dev, r.config)
                continue
            rid = r.config["release-id"]
            dev.release_ids.append(rid)
            if rid not in dev.released:
                acc = self.accuracy_of.get(r.config["bundle-hash"],
                                           dev.accuracy if r.config["bundle-hash"] == self.good_hash else 0.5)
                dev.released[rid] = device_report(self.n, acc)[0]
            reply = dev.released[rid]
            if dev.behaviour == "inflate":
                reply = {**reply, "dp_correct": 999 * reply["dp_count"]}
            self.outbox[h] = Reply(h, True, reply)
        return handles

    def poll(self, handles):
        return [self.outbox.pop(h) for h in list(handles) if h in self.outbox]

    @staticmethod
    def _switch(h: str, dev: FakeDevice, config) -> Reply:
        """A device's active/previous versions, as coordinator.device_versions keeps them."""
        want = config["bundle-hash"]
        if config["action"] == "revert":
            if dev.active != want:
                dev.active, dev.previous = dev.previous, dev.active
        elif dev.active != want:
            dev.active, dev.previous = want, config["base-hash"] or dev.active
        return Reply(h, True, {"active": dev.active or "", "previous": dev.previous or ""})


class DyingTransport(FakeTransport):
    """Hands out replies one per poll, and dies (raises :class:`Killed`) at the poll after ``replies``
    evaluate replies: the rest of the round's messages are out, their devices have released."""

    def __init__(self, devices, replies: int, good_hash: str = A.content_hash):
        super().__init__(devices, good_hash)
        self.left = replies

    def poll(self, handles):
        ready = [h for h in handles if h in self.outbox]
        if ready and self.outbox[ready[0]].payload.get("dp_count") is not None:
            if self.left == 0:
                raise Killed()
            self.left -= 1
        return [self.outbox.pop(h) for h in ready[:1]]


def make_fleet(**behaviours) -> dict[int, FakeDevice]:
    devs = {}
    for i, cls in enumerate(["x86", "x86", "x86", "rpi5", "rpi5", "orin"]):
        devs[NODE + i] = FakeDevice(f"d{i}", cls, behaviours.get(f"d{i}", "ok"))
    return devs
