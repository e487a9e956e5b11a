"""The results store against another process's lock, and the read-only viewer on any storage."""

from __future__ import annotations

import os
import sqlite3
import threading
import time

import pytest

from cuvil.coordinator.store import ResultsStore, StoreError


@pytest.fixture
def db(tmp_path):
    store = ResultsStore(tmp_path / "results.db")
    store.finish_run(store.start_run({"bundle": "a.cuvil"}, "k"))
    store.close()
    return tmp_path / "results.db"


def _hold_lock(path, seconds: float) -> threading.Event:
    """Another connection (a backup, an operator's sqlite3) holds the write lock for ``seconds``."""
    taken = threading.Event()

    def hold():
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN EXCLUSIVE")
        taken.set()
        time.sleep(seconds)
        other.execute("ROLLBACK")
        other.close()

    threading.Thread(target=hold, daemon=True).start()
    assert taken.wait(5)
    return taken


def test_a_write_waits_out_a_lock_that_outlasts_sqlites_own_wait(db):
    store = ResultsStore(db)
    store._db.execute("PRAGMA busy_timeout = 100")  # SQLite's own wait ends long before the lock does
    run = store.start_run({})
    _hold_lock(db, 1.0)
    store.finish_run(run, "finished")  # waits for the lock, tries again: not lost
    assert store.runs()[-1]["status"] == "finished"
    store.close()


def test_a_heartbeat_does_not_wait_for_a_lock(db):
    store = ResultsStore(db)
    run = store.start_run({})
    _hold_lock(db, 4.0)
    t0 = time.monotonic()
    with pytest.raises(StoreError, match="locked"):
        store.heartbeat(run)
    assert time.monotonic() - t0 < 3.0  # one short try: the next beat tries again
    store.close()


def _side_files(db) -> list[str]:
    return sorted(p.name for p in db.parent.iterdir() if p.name != db.name)


def test_the_read_only_viewer_leaves_no_side_file_behind(db):
    assert _side_files(db) == []
    viewer = ResultsStore.open_read_only(db)
    assert len(viewer.runs()) == 1
    viewer.close()
    assert _side_files(db) == []


def test_a_viewer_beside_a_running_coordinator_leaves_its_files_alone(db):
    writer = ResultsStore(db)
    run = writer.start_run({})
    viewer = ResultsStore.open_read_only(db)
    assert [r["status"] for r in viewer.runs()] == ["finished", "running"]
    viewer.close()
    writer.finish_run(run)  # the writer's -wal and -shm were left in place for it
    writer.close()
    viewer = ResultsStore.open_read_only(db)
    assert [r["status"] for r in viewer.runs()] == ["finished", "finished"]
    viewer.close()
    assert _side_files(db) == []


def test_a_database_whose_directory_cannot_be_written_is_read_as_immutable(db, monkeypatch):
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if mode == os.W_OK else real(p, mode, **kw))
    viewer = ResultsStore.open_read_only(db)  # read-only storage: mode=ro alone cannot make -wal and -shm
    assert len(viewer.runs()) == 1
    assert _side_files(db) == []  # none made, not even while it is open
    viewer.close()
    assert _side_files(db) == []
