"""A device's answer to ``query.device_info``, checked where it is received: the one place its fields get types.

A device is hostile until its info checks out, and what it says is stored and acted on (who trains,
where the bundle goes), so every field read is typed here, once, by :data:`FLAGS` and
:func:`read_info`'s rules:

- text (name, class, CPU, ISA, runtime version, features) is cut to what the store keeps (and shown
  escaped wherever it appears);
- ``threads`` is an int in ``[1, MAX_THREADS]``, the thread counts generated code may have (absent: 0,
  unknown, as devices that did not report it are stored);
- ``emulated`` and ``can_train`` are a bool or the int 0 or 1 (``can_train`` absent: False);
- ``held_bundles`` is a list, of which only content hashes count (at most :data:`MAX_HELD`).

Anything else is a :class:`DeviceInfoError`: the device is left out of the inventory with that reason
(the run goes on), and no value it chose reaches the store.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..compiler.bundle.format import is_sha256_hex
from ..compiler.codegen.cpu.threads import MAX_THREADS
from .device_text import FEATURES_CHARS, cut, excerpt
from .identity import device_identity
from .store import DeviceRecord

MAX_HELD = 1000  # bundle hashes read from one device's info, at most
FLAGS = {"emulated": None, "can_train": False}  # 0/1 fields -> the value when absent (None: required)


class DeviceInfoError(ValueError):
    """A device's info that an honest device would not send (the reason holds only a bounded excerpt)."""


@dataclass
class DeviceView:
    """What the coordinator knows of a device in this run; ``held`` grows as it is sent bundles."""

    node_id: int
    device_id: str
    profile: str
    emulated: bool
    held: set[str]
    can_train: bool = False


def read_info(info: Mapping[str, Any], node_id: int,
              keys: Mapping[int, bytes] | None) -> tuple[DeviceView, DeviceRecord]:
    """The device's view for this run and its row for the store; :class:`DeviceInfoError` if ``info`` is bad."""
    for required in ("device_id", "profile"):
        if required not in info:
            raise DeviceInfoError(f"no {required}")
    flags = {name: _flag(name, info.get(name, absent)) for name, absent in FLAGS.items()}
    held = info.get("held_bundles", [])
    if not isinstance(held, list):
        raise DeviceInfoError("held_bundles is not a list")
    hashes = tuple(sorted({h for h in held[:MAX_HELD] if is_sha256_hex(h)}))
    identity = device_identity(info["device_id"], node_id, keys)
    profile = cut(info["profile"])
    view = DeviceView(node_id, identity, profile, flags["emulated"], set(hashes), flags["can_train"])
    record = DeviceRecord(identity, profile, cut(info.get("cpu", "")), cut(info.get("features", ""), FEATURES_CHARS),
                          cut(info.get("runtime_version", "")), flags["emulated"], cut(info.get("isa", "")),
                          _threads(info["threads"]) if "threads" in info else 0, hashes)
    return view, record


def _flag(name: str, value: object) -> bool:
    if value is None:
        raise DeviceInfoError(f"no {name}")
    if isinstance(value, bool) or (type(value) is int and value in (0, 1)):
        return bool(value)
    raise DeviceInfoError(f"{name} {excerpt(value)} is not 0, 1 or a bool")


def _threads(value: object) -> int:
    if type(value) is int and 1 <= value <= MAX_THREADS:
        return value
    raise DeviceInfoError(f"threads {excerpt(value)} is not an integer in [1, {MAX_THREADS}]")
