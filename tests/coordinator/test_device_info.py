"""A device's info typed at the inventory: what an honest device sends is read, anything else is refused."""

from __future__ import annotations

import math

import pytest

from cuvil.compiler.codegen.cpu.threads import MAX_THREADS
from cuvil.coordinator.device_info import MAX_HELD, DeviceInfoError, read_info

HONEST = {"device_id": "d1", "profile": "x86", "cpu": "haswell", "features": "+avx2", "isa": "x86_64/256-bit",
          "threads": 4, "runtime_version": "t", "emulated": 0, "held_bundles": ["a" * 64, "nope"], "can_train": 1}


def test_honest_info_is_read_with_its_types():
    view, record = read_info(HONEST, 7, None)
    assert (view.device_id, view.profile, view.emulated, view.can_train, view.held) == ("d1", "x86", False, True,
                                                                                        {"a" * 64})
    assert (record.threads, record.held_bundles, record.emulated) == (4, ("a" * 64,), False)
    assert read_info({**HONEST, "emulated": True, "can_train": False, "threads": MAX_THREADS}, 7, None)[0].emulated


def test_fields_devices_did_not_always_send_have_their_defaults():
    old = {k: v for k, v in HONEST.items() if k not in ("threads", "can_train", "held_bundles", "cpu")}
    view, record = read_info(old, 7, None)
    assert (record.threads, record.cpu, view.can_train, view.held) == (0, "", False, set())


@pytest.mark.parametrize("field, value", [
    ("threads", math.inf), ("threads", 1e300), ("threads", -5), ("threads", 0), ("threads", MAX_THREADS + 1),
    ("threads", 2**63 - 1), ("threads", True), ("threads", "4"), ("threads", 4.0), ("can_train", "yes"),
    ("can_train", [1]), ("can_train", math.inf), ("can_train", 2), ("can_train", 1.0), ("emulated", "no"),
    ("emulated", -1), ("held_bundles", 5), ("held_bundles", "a" * 64),
])
def test_a_value_no_honest_device_sends_is_refused(field, value):
    with pytest.raises(DeviceInfoError, match=field):
        read_info({**HONEST, field: value}, 7, None)


@pytest.mark.parametrize("field", ["device_id", "profile", "emulated"])
def test_a_missing_required_field_is_refused(field):
    with pytest.raises(DeviceInfoError, match=field):
        read_info({k: v for k, v in HONEST.items() if k != field}, 7, None)


def test_text_is_cut_and_an_error_quotes_only_an_excerpt():
    _, record = read_info({**HONEST, "cpu": "c" * 10**6, "features": "f" * 10**6,
                           "held_bundles": ["b" * 64] * (2 * MAX_HELD)}, 7, None)
    assert (len(record.cpu), len(record.features), record.held_bundles) == (200, 2000, ("b" * 64,))
    with pytest.raises(DeviceInfoError) as e:
        read_info({**HONEST, "threads": "\x1b[2J" + "9" * 10**6}, 7, None)
    assert len(str(e.value)) < 200 and "\x1b" not in str(e.value)

