"""The per-CPU tuning record: its file under attack, its lock, and tuned compiles that give the same bits."""

from __future__ import annotations

import dataclasses
import fcntl
import json
import logging
import os
import pwd
import time

import numpy as np
import pytest

from cuvil.compiler.target import ConvChoice
from cuvil.edge_runtime import autotune, tuning_record
from cuvil.edge_runtime.cache import finish_writes
from cuvil.edge_runtime.compile import compile_graph
from cuvil.edge_runtime.sealed import Sealer
from cuvil.edge_runtime.tuning_record import Known, TuningRecord, decode, encode, scope

from ..hosts import HOST

G1 = (1, 16, 8, 8, 32, 3, 3, (1, 1), (1, 1, 1, 1), (1, 1), 1)
G2 = (1, 32, 4, 4, 32, 1, 1, (2, 2), (0, 0, 0, 0), (1, 1), 32)
A, B = ConvChoice("direct", 4, 3, 8), ConvChoice("winograd", 4, 1, 16)
SCOPE = "5e" * 32


def _doc(choices=(), splits=(), verdicts=None) -> bytes:
    doc = {"choices": list(choices), "splits": list(splits)} | ({} if verdicts is None else {"verdicts": verdicts})
    return json.dumps(doc).encode()


@pytest.fixture
def record(tmp_path):
    return TuningRecord(tmp_path / "cache", Sealer(bytes(range(32))), SCOPE)


def test_choices_split_decisions_and_verdicts_round_trip_through_the_file_form():
    known = Known({G1: A, G2: B}, {(G1, 2): True, (G1, 3): False, (G2, 2): False}, {(SCOPE, 2): (1, 4.0), (SCOPE, 3): (0, 1.0)})
    assert decode(encode(known)) == known
    assert decode(encode(Known())) == Known()
    before = json.loads(encode(Known(splits={(G1, 2): True})))
    del before["verdicts"]  # a record written before verdicts were kept
    assert decode(json.dumps(before).encode()) == Known(splits={(G1, 2): True})


@pytest.mark.parametrize("data", [
    b"", b"\xff", b"[]", b'{"choices": 3, "splits": []}', b'{"other": []}', b'{"choices": []}',
    _doc([[list(range(18)), ["direct", 1, 1, 8]]]),  # a geometry of 18 integers
    _doc([[[1] * 19, ["direct", 1, 1]]]),  # a choice of three fields
    _doc([[[1] * 18 + [-1], ["direct", 1, 1, 8]]]),  # a negative size
    _doc([[[1] * 18 + [True], ["direct", 1, 1, 8]]]),  # a boolean for an integer
    _doc([[[1] * 19, ["direct", 1, 1.0, 8]]]),  # a float
    _doc([[[1] * 19, ["x" * 33, 1, 1, 8]]]),  # a method name past any of ours
    _doc([[[1] * 19, ["direct", 1, 1, 8]]] * (tuning_record.MAX_ENTRIES + 1)),
    _doc(splits=[[[1] * 19, 1, True]]),  # a split at one thread
    _doc(splits=[[[1] * 19, tuning_record.MAX_THREADS + 1, True]]),  # more threads than any device runs
    _doc(splits=[[[1] * 19, 2, 1]]),  # an integer for a boolean
    _doc(splits=[[[1] * 19, 2]]),  # no decision
    _doc(verdicts=[["ab" * 31, 2, 0, 1.0]]),  # a digest of 62 digits
    _doc(verdicts=[["AB" * 32, 2, 0, 1.0]]),  # upper-case hex
    _doc(verdicts=[[SCOPE, 1, 0, 1.0]]),  # a verdict at one thread
    _doc(verdicts=[[SCOPE, 2, tuning_record.MAX_PLAN + 1, 1.0]]),  # a plan past the last
    _doc(verdicts=[[SCOPE, 2, True, 1.0]]),  # a boolean for the plan
    _doc(verdicts=[[SCOPE, 2, 0, 0.0]]),  # a free handoff
    _doc(verdicts=[[SCOPE, 2, 0, 1e300]]),  # a handoff past any machine's
    _doc(verdicts=[[SCOPE, 2, 0, "1"]]),  # a string
    _doc(verdicts=[[SCOPE, 2, 0]]),  # no handoff
    _doc(verdicts={"a": 1}),  # not a list
    b'{"choices": [], "splits": [], "verdicts": [["' + SCOPE.encode() + b'", 2, 0, NaN]]}',
])
def test_anything_but_the_record_form_is_refused(data):
    with pytest.raises(ValueError):
        decode(data)


def test_what_a_holder_adds_is_there_for_the_next(record):
    with record.held() as known:
        assert known == Known()
        known.choices[G1] = A
    with record.held() as known:
        assert known == Known({G1: A})
        known.choices[G2] = B
        known.splits[G2, 2] = False
    with TuningRecord(record.dir, record.sealer, SCOPE).held() as known:
        assert known == Known({G1: A, G2: B}, {(G2, 2): False})


def test_a_record_is_private_to_its_scope_and_its_device(record):
    with record.held() as known:
        known.choices[G1] = A
    with TuningRecord(record.dir, record.sealer, "6f" * 32).held() as other_scope:
        assert other_scope == Known()
    with TuningRecord(record.dir, Sealer(bytes(32)), SCOPE).held() as other_device:
        assert other_device == Known()  # sealed under another secret: not this device's record


def test_a_damaged_record_is_ignored_logged_and_written_again(record, caplog):
    with record.held() as known:
        known.choices[G1] = A
    data = bytearray(record.path.read_bytes())
    data[data.index(b'"direct"') + 1] ^= 1  # the method's name
    record.path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING), record.held() as known:
        assert known == Known()
        known.choices[G2] = B
    assert "unusable" in caplog.text
    with record.held() as known:
        assert known == Known({G2: B})


def test_a_record_sealed_for_another_scope_copied_over_this_one_is_ignored(record, caplog):
    other = TuningRecord(record.dir, record.sealer, "6f" * 32)
    with other.held() as known:
        known.choices[G1] = B
    os.replace(other.path, record.path)
    with caplog.at_level(logging.WARNING), record.held() as known:
        assert known == Known()


def test_a_fifo_at_the_record_path_is_ignored_not_waited_on(record, caplog):
    record.dir.mkdir(mode=0o700)
    os.mkfifo(record.path, 0o600)
    with caplog.at_level(logging.WARNING), record.held() as known:
        assert known == Known()


def test_a_compile_that_cannot_have_the_lock_tunes_alone_and_writes_nothing(record, monkeypatch, caplog):
    monkeypatch.setattr(tuning_record, "LOCK_WAIT_S", 0.1)
    with record.held() as known:
        known.choices[G1] = A
    lock = os.open(record.lock_path, os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)  # another compile tuning now
    try:
        with caplog.at_level(logging.WARNING), record.held() as known:
            assert known == Known()
            known.choices[G2] = B
        assert "another compile held" in caplog.text
    finally:
        os.close(lock)
    with record.held() as known:
        assert known == Known({G1: A})


@pytest.mark.parametrize("whose", ["another user's", "others may write"])
def test_a_lock_file_not_this_users_alone_is_not_waited_on(record, monkeypatch, caplog, whose):
    """Where others may create files in the cache directory, one who creates the lock file first could
    hold it forever and stall every tuned compile LOCK_WAIT_S: such a lock is refused at once, and the
    compile tunes without the record (nothing read, nothing written)."""
    if whose == "another user's" and os.geteuid() != 0:
        pytest.skip("planting a file of another user takes chown, which takes root")
    monkeypatch.setattr(tuning_record, "LOCK_WAIT_S", 2.0)
    with record.held() as known:
        known.choices[G1] = A
    recorded = record.path.read_bytes()
    if whose == "others may write":
        os.chmod(record.lock_path, 0o666)
    else:
        nobody = pwd.getpwnam("nobody")
        os.chown(record.lock_path, nobody.pw_uid, nobody.pw_gid)
    lock = os.open(record.lock_path, os.O_RDWR)
    fcntl.flock(lock, fcntl.LOCK_EX)  # held by its owner, who never lets go
    try:
        start = time.monotonic()
        with caplog.at_level(logging.WARNING), record.held() as known:
            assert known == Known()
            known.choices[G2] = B
        assert time.monotonic() - start < 1.0 and "is not a file of this user alone" in caplog.text
    finally:
        os.close(lock)
    assert record.path.read_bytes() == recorded


def test_the_scope_ignores_the_thread_count_and_fixed_choices_but_not_the_target_or_compiler():
    two = dataclasses.replace(HOST, threads=2, conv_choices=((G1, A),), conv_parts=((G1, 2),))
    assert scope(two, "f" * 64) == scope(HOST, "f" * 64)
    assert scope(HOST, "e" * 64) != scope(HOST, "f" * 64)
    assert scope(dataclasses.replace(HOST, tuning=HOST.tuning.replace(rows_channel_block=8)), "f" * 64) != \
        scope(HOST, "f" * 64)


def _fake_timing(favour: int):
    """interleaved_seconds where the candidate at ``favour`` (its index among those timed) is fastest
    in every round by far: what a compile's noisy timing could make of two near-equal kernels."""
    def timing(calls, *args, **kwargs):
        keys = list(calls)
        best = keys[favour % len(keys)]
        return {k: (1e-4,) * 5 if k == best else (1e-3,) * 5 for k in keys}
    return timing


def test_tuned_compiles_at_one_and_two_threads_take_the_first_ones_choices_and_give_the_same_bits(tmp_path, monkeypatch):
    """SqueezeNet tuned at 1, 2, 1 and 2 threads chose another kernel for one layer in one compile, and
    its output differed. Here each compile's timing favours other candidates; the first compile's
    choices still hold for the rest, untimed, so every output is the first one's bit for bit."""
    from .test_autotune import _one_conv

    graph = _one_conv(32, 16)
    x = {"x": np.random.default_rng(3).standard_normal((1, 32, 16, 16), dtype=np.float32)}
    target = dataclasses.replace(HOST, tuning=HOST.tuning.replace(autotune=True, autotune_budget_s=60.0,
                                                                  autotune_fraction=100.0))
    monkeypatch.setattr(autotune, "interleaved_seconds", _fake_timing(-1))
    first = compile_graph(graph, target, cache_dir=tmp_path, tune=True, threads=1)
    chosen = first.lowered.target.conv_choices
    assert chosen  # the last candidate won: a choice other than the cost model's
    expected = first.run(x)[graph.outputs[0]]
    for threads in (2, 1, 3):
        finish_writes()  # the last compile's entry is written, then removed
        for art in tmp_path.glob("*.cuvil-art"):
            art.unlink()  # a cold compile each time: only the tuning record is shared
        monkeypatch.setattr(autotune, "interleaved_seconds", _fake_timing(threads))
        again = compile_graph(graph, target, cache_dir=tmp_path, tune=True, threads=threads)
        assert not again.stats.cache_hit and again.lowered.target.conv_choices == chosen
        np.testing.assert_array_equal(again.run(x)[graph.outputs[0]], expected)


def test_without_the_record_each_compile_takes_what_its_own_timing_says(tmp_path, monkeypatch):
    """The test above can fail: the same compiles with no cache choose by their own timing."""
    from .test_autotune import _one_conv

    graph = _one_conv(32, 16)
    target = dataclasses.replace(HOST, tuning=HOST.tuning.replace(autotune=True, autotune_budget_s=60.0,
                                                                  autotune_fraction=100.0))
    monkeypatch.setattr(autotune, "interleaved_seconds", _fake_timing(-1))
    last = compile_graph(graph, target, use_cache=False, tune=True).lowered.target.conv_choices
    monkeypatch.setattr(autotune, "interleaved_seconds", _fake_timing(0))
    cost_model = compile_graph(graph, target, use_cache=False, tune=True).lowered.target.conv_choices
    assert last and cost_model == () and last != cost_model


def test_a_compile_records_every_layer_it_met_even_those_its_budget_did_not_reach(record, monkeypatch):
    """The first compile fixes what later ones take: a layer it could not time keeps the cost model's
    kernel, and a split it could not time the cost model's split, in the record as in its code."""
    from cuvil.compiler.codegen.cpu.kernels.conv import tunable_convs
    from cuvil.edge_runtime import pool_probe

    from .test_autotune import _one_conv

    monkeypatch.setattr(pool_probe, "handoff_us", lambda target, llvm=None: 1.0)
    graph = _one_conv(64, 16)
    macs = 64 * 16 * 16 * 64 * 9
    no_time = HOST.tuning.replace(conv_macs_per_us=1.0, parallel_sync_ratio=macs / 2, autotune_budget_s=0.0)
    tuned = autotune.Retarget(record=record)(graph, dataclasses.replace(HOST, threads=2, tuning=no_time))
    (geom,) = tunable_convs(graph)
    with record.held() as known:
        assert known.choices == {geom: autotune.worth_timing(tuned, geom)[0]} and known.splits == {(geom, 2): True}
