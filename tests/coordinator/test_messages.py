"""A training reply's arrays as the coordinator reads them: checked before they are decoded, a ValueError else."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, Message, RecordDict  # noqa: E402

from cuvil.coordinator import messages  # noqa: E402

from .grid_fakes import BAD_ARRAYS, UPDATE_METRICS, npy  # noqa: E402  (it sets the task identity Messages need)


def _reply(arrays: dict) -> Message:
    request = Message(RecordDict({}), 7, messages.TRAIN)
    return Message(RecordDict({"update": ArrayRecord(arrays)}), reply_to=request)


def test_an_honest_update_decodes_to_its_arrays():
    update = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.zeros(0, np.float32),
              "f": np.asfortranarray(np.arange(6, dtype=np.float32).reshape(3, 2))}
    request = Message(RecordDict({}), 7, messages.TRAIN)
    got = messages.reply_arrays(messages.update_reply(request, UPDATE_METRICS, update))
    assert sorted(got) == ["b", "f", "w"]
    for k, v in update.items():
        assert got[k].dtype == np.float32 and got[k].shape == v.shape and np.array_equal(got[k], v)
    assert messages.reply_arrays(messages.metrics_reply(request, {"a": 1})) == {}


@pytest.mark.parametrize("name", sorted(BAD_ARRAYS))
def test_a_malformed_array_is_a_value_error_before_numpy_reads_it(name):
    """Empty data, another serialization, garbage, a header claiming 1 TiB, other bytes than declared."""
    with pytest.raises(ValueError, match="update array 'b2'"):
        messages.reply_arrays(_reply({"w": Array(np.zeros(3, np.float32)), "b2": Array(*BAD_ARRAYS[name])}))


@pytest.mark.parametrize("array", [
    Array("float64", (3,), "numpy.ndarray", npy(np.zeros(3))),  # honest .npy, but not float32
    Array("float32", (2, 2), "numpy.ndarray", npy(np.zeros(4, np.float32))),  # the header's shape is another
    Array("float32", (-1,), "numpy.ndarray", npy(np.zeros(3, np.float32))),
    Array("float32", (1,) * 33, "numpy.ndarray", npy(np.zeros((1,) * 33, np.float32))),
])
def test_declared_and_stored_dtype_and_shape_must_agree(array):
    with pytest.raises(ValueError, match="update array 'x'"):
        messages.reply_arrays(_reply({"x": array}))


def test_an_update_past_the_size_bound_is_refused_unread(monkeypatch):
    monkeypatch.setattr(messages, "MAX_UPDATE_BYTES", 1000)
    with pytest.raises(ValueError, match="larger than 1000 bytes"):
        messages.reply_arrays(_reply({"w": Array(np.zeros(300, np.float32))}))


def test_an_error_quotes_only_an_excerpt_of_what_the_device_sent():
    with pytest.raises(ValueError) as e:
        messages.reply_arrays(_reply({"\x1b[2J" + "n" * 10_000: Array("x" * 10_000, (1,), "y" * 10_000, b"")}))
    assert len(str(e.value)) < 400 and "\x1b" not in str(e.value)


def test_flowers_expiry_answer_is_a_timeout_and_the_devices_codes_keep_their_kinds():
    from flwr.common.constant import ErrorCode

    assert [messages.classify(c) for c in (ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE)] == [
        "timeout", "timeout"]
    assert messages.classify(ErrorCode.NODE_UNAVAILABLE) == "failure"  # a node gone is not merely slow
    assert [messages.classify(c) for c in (messages.Code.BUDGET_EXHAUSTED, messages.Code.SIGNATURE_REJECTED,
                                           messages.Code.DEVICE_ERROR)] == ["budget_exhausted", "refused", "failure"]
