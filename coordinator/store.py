"""The results store: SQLite, one committed transaction per event, so a killed coordinator loses nothing.

Schema (columns are only ever added, never renamed or given a new meaning; times are Unix seconds)::

    runs         one federated evaluation run
      id, started_at, finished_at (NULL while running), config (JSON, the RunConfig's keys),
      status       'running' | 'finished' | 'aborted'
      run_key      random hex; every release-id of the run starts with it
      owner        'host:pid' of the coordinator process driving it now
      heartbeat_at the owner's last sign of life (a running run whose owner is gone gets 'aborted')
      reason       why a run was aborted (the error, or "coordinator gone"); '' otherwise
      resumed      how many times a restarted coordinator took the run over
    rounds       one round of a run: number (1-based), kind ('eval', 'ab:A', 'ab:B'), model (name@version),
                 bundle_hash, dataset, started_at, finished_at (NULL while in flight),
                 sampled (devices asked, written before any message goes out), bundle_bytes_sent
    requests     one row per (round, device asked): device_id, node_id (Flower's, as text), release_id
                 (deterministic: the same device is asked the same release-id again after a crash),
                 asked_at (when the round chose it), asks (messages sent to it, retries and resumes included)
    devices      device_id, profile (the device's class: `host` resolved to the shipped profile naming
                 it), cpu (LLVM CPU name), features, runtime_version, emulated, isa (arch/vector width),
                 threads (CPUs the device may use), held_bundles (JSON list of the content hashes it said it
                 holds at its last inventory), first_seen, last_seen; device_id is the identity of
                 :mod:`.identity` (bound to the node's key in deployment), never the name alone
    reports      one per (round, device) at most: device_id, profile, emulated, metrics (JSON, the
                 report schema), received_at
    failures     round_id, device_id, kind ('failure' | 'timeout' | 'refused' | 'budget_exhausted'),
                 reason (one line from the device or the coordinator), recorded_at
    comparisons  an A/B round's verdict per device class ('all' overall): run_id, number, model_a,
                 model_b, device_class, devices (that reported both), a, b, diff (b - a), se, recorded_at

Fine-tuning and rollouts add ``updates``, ``versions`` and ``rollouts`` (:mod:`.training_store`); a
training round is a ``rounds`` row of kind 'train' whose replies are updates, not reports.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..compiler.digest import short_hex
from ..compiler.errors import CuvilError
from .device_text import cut_reason
from .run_owner import STALE_AFTER_S, owner_gone, this_process
from .store_sqlite import LOCK_TRY_S, WRITE_WAIT_S, begin_write, connect_read_only, tidy
from .training_store import TRAINING_ADDED_COLUMNS, TRAINING_SCHEMA, TrainingRecords

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  id INTEGER PRIMARY KEY, started_at REAL NOT NULL, finished_at REAL, status TEXT NOT NULL,
  config TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rounds (
  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), number INTEGER NOT NULL,
  kind TEXT NOT NULL, model TEXT NOT NULL, bundle_hash TEXT NOT NULL, dataset TEXT NOT NULL,
  started_at REAL NOT NULL, finished_at REAL, sampled INTEGER NOT NULL DEFAULT 0,
  bundle_bytes_sent INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS devices (
  device_id TEXT PRIMARY KEY, profile TEXT NOT NULL, cpu TEXT NOT NULL, features TEXT NOT NULL,
  runtime_version TEXT NOT NULL, emulated INTEGER NOT NULL, first_seen REAL NOT NULL, last_seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS reports (
  id INTEGER PRIMARY KEY, round_id INTEGER NOT NULL REFERENCES rounds(id), device_id TEXT NOT NULL,
  profile TEXT NOT NULL, emulated INTEGER NOT NULL, metrics TEXT NOT NULL, received_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS failures (
  id INTEGER PRIMARY KEY, round_id INTEGER NOT NULL REFERENCES rounds(id), device_id TEXT NOT NULL,
  kind TEXT NOT NULL, reason TEXT NOT NULL, recorded_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS requests (
  round_id INTEGER NOT NULL REFERENCES rounds(id), device_id TEXT NOT NULL, node_id TEXT NOT NULL,
  release_id TEXT NOT NULL, asked_at REAL NOT NULL, asks INTEGER NOT NULL DEFAULT 1,
  PRIMARY KEY (round_id, device_id));
CREATE TABLE IF NOT EXISTS comparisons (
  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), number INTEGER NOT NULL,
  model_a TEXT NOT NULL, model_b TEXT NOT NULL, device_class TEXT NOT NULL, devices INTEGER NOT NULL,
  a REAL NOT NULL, b REAL NOT NULL, diff REAL NOT NULL, se REAL NOT NULL, recorded_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS rounds_by_run ON rounds(run_id, number);
CREATE INDEX IF NOT EXISTS reports_by_round_device ON reports(round_id, device_id);
CREATE INDEX IF NOT EXISTS failures_by_round ON failures(round_id);
CREATE TABLE IF NOT EXISTS latency_predictions (
  bundle_hash TEXT NOT NULL, profile TEXT NOT NULL, model_version TEXT NOT NULL, predicted_ms REAL NOT NULL,
  basis TEXT NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (bundle_hash, profile, model_version));
"""
ADDED_COLUMNS = {  # columns added after the first schema: ALTER TABLE'd into older files on open
    "runs": (("run_key", "TEXT NOT NULL DEFAULT ''"), ("owner", "TEXT NOT NULL DEFAULT ''"),
             ("heartbeat_at", "REAL"), ("reason", "TEXT NOT NULL DEFAULT ''"),
             ("resumed", "INTEGER NOT NULL DEFAULT 0")),
    "devices": (("isa", "TEXT NOT NULL DEFAULT ''"), ("threads", "INTEGER NOT NULL DEFAULT 0"),
                ("held_bundles", "TEXT NOT NULL DEFAULT '[]'")),
}
RUN_COLUMNS = {"id", "started_at", "finished_at", "status", "config"}  # what tells a results database
RUN_STATUSES = ("running", "finished", "aborted")
FAILURE_KINDS = ("failure", "timeout", "refused", "budget_exhausted")


class StoreError(CuvilError):
    """The results database cannot be opened or written, or a run cannot be taken over."""


@dataclass(frozen=True)
class DeviceRecord:
    device_id: str
    profile: str
    cpu: str
    features: str
    runtime_version: str
    emulated: bool
    isa: str = ""  # architecture / vector width, e.g. x86_64/512-bit
    threads: int = 0
    held_bundles: tuple[str, ...] = ()  # content hashes


class ResultsStore(TrainingRecords):
    def __init__(self, path: str | os.PathLike, create: bool = True):
        """Open the results store for writing, making it first where ``create`` (the coordinator). A database
        that is not Cuvil's is refused before anything is written to it: without ``create`` an empty one too,
        so a maintenance command (``results --mark-aborted``) never adds Cuvil's tables to another file."""
        self.path = Path(path)
        self.write_s = 0.0  # seconds spent in write transactions so far
        self.read_only, self._tidy = False, False  # _tidy: remove the side files a read-only connection made
        if not create and not self.path.is_file():
            raise StoreError(f"no results database at {self.path}")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, timeout=LOCK_TRY_S)  # tried again: begin_write
        except (sqlite3.Error, OSError) as e:
            raise StoreError(f"cannot open results database {self.path}: {e}") from None
        try:
            self._check_ours(create)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA + TRAINING_SCHEMA)
            for table, columns in (ADDED_COLUMNS | TRAINING_ADDED_COLUMNS).items():
                have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
                for name, decl in columns:
                    if name not in have:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")
        except BaseException as e:
            self._db.close()
            if isinstance(e, (sqlite3.Error, OSError)):
                raise StoreError(f"cannot open results database {self.path}: {e}") from None
            raise

    def _check_ours(self, create: bool) -> None:
        """StoreError unless the open database is a results store (its ``runs`` table has the first schema's
        columns), or is empty and ``create``: another application's tables are never added to."""
        tables = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables and create:
            return
        columns = {r[1] for r in self._db.execute("PRAGMA table_info(runs)")} if "runs" in tables else set()
        if not RUN_COLUMNS <= columns:
            raise StoreError(f"{self.path} is not a Cuvil results database")

    @classmethod
    def open_read_only(cls, path: str | os.PathLike) -> ResultsStore:
        """Open an existing database for reading only (SQLite ``mode=ro``): a viewer can never write to it;
        on read-only storage too, and it leaves no side file where it can (:mod:`.store_sqlite`)."""
        store = cls.__new__(cls)
        store.path, store.read_only, store.write_s = Path(path), True, 0.0
        if not store.path.is_file():
            raise StoreError(f"no results database at {store.path}")
        try:
            store._db, store._tidy = connect_read_only(store.path, timeout=30)
            try:
                store._check_ours(create=False)
            except BaseException:
                store.close()
                raise
        except sqlite3.Error as e:
            raise StoreError(f"cannot read results database {store.path}: {e}") from None
        return store

    def close(self) -> None:
        self._db.close()
        if self._tidy:
            tidy(self.path)

    @contextmanager
    def _transaction(self, wait_s: float = WRITE_WAIT_S) -> Iterator[sqlite3.Connection]:
        """One committed transaction, locked first (:func:`.begin_write`); its time is added to ``write_s``."""
        start = time.perf_counter()
        try:
            begin_write(self._db, wait_s)
            with self._db:
                yield self._db
        except sqlite3.Error as e:
            raise StoreError(f"cannot write results database {self.path}: {e}") from None
        finally:
            self.write_s += time.perf_counter() - start

    def _write(self, sql: str, args: Iterable[Any], rowcount: bool = False, wait_s: float = WRITE_WAIT_S) -> int:
        """Run one statement in its own committed transaction; its lastrowid (or rowcount)."""
        with self._transaction(wait_s) as db:
            cur = db.execute(sql, tuple(args))
            return cur.rowcount if rowcount else cur.lastrowid

    # runs -----------------------------------------------------------------------------------------
    def start_run(self, config: Mapping[str, Any], run_key: str = "") -> int:
        now = time.time()
        return self._write(
            "INSERT INTO runs (started_at, status, config, run_key, owner, heartbeat_at) VALUES (?,'running',?,?,?,?)",
            (now, json.dumps(config, sort_keys=True, default=str), run_key, this_process(), now))

    def finish_run(self, run_id: int, status: str = "finished", reason: str = "") -> None:
        if status not in RUN_STATUSES:
            raise ValueError(f"run status must be one of {RUN_STATUSES}")
        self._write("UPDATE runs SET finished_at = ?, status = ?, reason = ? WHERE id = ?",
                    (time.time(), status, cut_reason(reason), run_id))

    def heartbeat(self, run_id: int) -> None:
        """A liveness hint, so it waits one lock try at most (StoreError then: the next beat writes it)."""
        self._write("UPDATE runs SET heartbeat_at = ? WHERE id = ?", (time.time(), run_id), wait_s=0.0)

    def take_over_run(self, run_id: int) -> dict[str, Any]:
        """Make this process the owner of an unfinished run (resume); refuse a finished or live one."""
        try:
            begin_write(self._db, WRITE_WAIT_S)  # no second coordinator can take it over at the same time
            row = self._row("SELECT * FROM runs WHERE id = ?", (run_id,))
            problem = None if row is not None else f"no run {run_id} in {self.path}"
            if row is not None and row["status"] == "finished":
                problem = f"run {run_id} is finished; there is nothing to resume"
            elif row is not None and row["status"] == "running" and not owner_gone(
                    row["owner"], row["heartbeat_at"], time.time()):
                problem = (f"run {run_id} is still driven by {row['owner'] or 'another coordinator'} "
                           f"(last heartbeat {time.time() - (row['heartbeat_at'] or 0):.0f} s ago)")
            if problem is None:
                self._db.execute("UPDATE runs SET status = 'running', finished_at = NULL, reason = '', owner = ?,"
                                 " heartbeat_at = ?, resumed = resumed + 1 WHERE id = ?",
                                 (this_process(), time.time(), run_id))
            self._db.execute("COMMIT" if problem is None else "ROLLBACK")
        except sqlite3.Error as e:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            raise StoreError(f"cannot write results database {self.path}: {e}") from None
        if problem is not None:
            raise StoreError(problem)
        return {**row, "config": json.loads(row["config"])}

    def mark_aborted(self, stale_after: float = STALE_AFTER_S) -> list[int]:
        """Mark every running run whose coordinator is gone as aborted; return their ids."""
        now, gone = time.time(), []
        for row in self._rows("SELECT id, owner, heartbeat_at FROM runs WHERE status = 'running'"):
            if owner_gone(row["owner"], row["heartbeat_at"], now, stale_after):
                self._write("UPDATE runs SET status = 'aborted', finished_at = ?, reason = ? WHERE id = ?"
                            " AND status = 'running'", (now, "coordinator gone (killed or crashed)", row["id"]))
                gone.append(row["id"])
        return gone

    # rounds ---------------------------------------------------------------------------------------
    def start_round(self, run_id: int, number: int, kind: str, model: str, bundle_hash: str, dataset: str,
                    asks: Sequence[tuple[str, int, str]] = ()) -> int:
        """Record a round and the (device_id, node_id, release_id) it will ask, in one transaction,
        before any message goes out: a resumed round knows exactly whom it asked."""
        now = time.time()
        with self._transaction() as db:
            round_id = db.execute(
                "INSERT INTO rounds (run_id, number, kind, model, bundle_hash, dataset, started_at, sampled)"
                " VALUES (?,?,?,?,?,?,?,?)", (run_id, number, kind, model, bundle_hash, dataset, now, len(asks))
            ).lastrowid
            db.executemany(
                "INSERT INTO requests (round_id, device_id, node_id, release_id, asked_at, asks) VALUES (?,?,?,?,?,0)",
                [(round_id, d, str(n), r, now) for d, n, r in asks])
        return round_id

    def finish_round(self, round_id: int, sampled: int, bundle_bytes_sent: int) -> None:
        self._write("UPDATE rounds SET finished_at = ?, sampled = ?, bundle_bytes_sent = ? WHERE id = ?",
                    (time.time(), sampled, bundle_bytes_sent, round_id))

    def add_bundle_bytes(self, round_id: int, sent: int) -> None:
        self._write("UPDATE rounds SET bundle_bytes_sent = bundle_bytes_sent + ? WHERE id = ?", (sent, round_id))

    def round(self, round_id: int) -> dict[str, Any]:
        row = self._row("SELECT * FROM rounds WHERE id = ?", (round_id,))
        if row is None:
            raise StoreError(f"no round {round_id} in {self.path}")
        return row

    def find_round(self, run_id: int, number: int, kind: str) -> dict[str, Any] | None:
        return self._row("SELECT * FROM rounds WHERE run_id = ? AND number = ? AND kind = ? ORDER BY id DESC",
                         (run_id, number, kind))

    def add_requests(self, round_id: int, asks: Iterable[tuple[str, int, str]]) -> None:
        """Count a message going out to each (device_id, node_id, release_id) of a started round."""
        with self._transaction() as db:
            db.executemany("UPDATE requests SET asks = asks + 1, node_id = ? WHERE round_id = ? AND device_id = ?"
                           " AND release_id = ?", [(str(n), round_id, d, r) for d, n, r in asks])

    def requests(self, round_id: int) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM requests WHERE round_id = ? ORDER BY device_id", (round_id,))

    # devices, reports, failures, comparisons ------------------------------------------------------
    def upsert_device(self, dev: DeviceRecord) -> None:
        now = time.time()
        self._write(
            "INSERT INTO devices (device_id, profile, cpu, features, runtime_version, emulated, first_seen, last_seen,"
            " isa, threads, held_bundles) VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(device_id) DO UPDATE SET"
            " profile=excluded.profile, cpu=excluded.cpu, features=excluded.features,"
            " runtime_version=excluded.runtime_version, emulated=excluded.emulated, last_seen=excluded.last_seen,"
            " isa=excluded.isa, threads=excluded.threads, held_bundles=excluded.held_bundles",
            (dev.device_id, dev.profile, dev.cpu, dev.features, dev.runtime_version, int(dev.emulated), now, now,
             dev.isa, int(dev.threads), json.dumps(list(dev.held_bundles))))

    def add_report(self, round_id: int, device_id: str, profile: str, emulated: bool, metrics: Mapping[str, Any]) -> bool:
        """Record a device's report; False (and nothing written) if the round already holds one from it."""
        return self._write(
            "INSERT INTO reports (round_id, device_id, profile, emulated, metrics, received_at) SELECT ?,?,?,?,?,?"
            " WHERE NOT EXISTS (SELECT 1 FROM reports WHERE round_id = ? AND device_id = ?)",
            (round_id, device_id, profile, int(emulated), json.dumps(metrics, sort_keys=True), time.time(),
             round_id, device_id), rowcount=True) > 0

    def add_failure(self, round_id: int, device_id: str, kind: str, reason: str) -> None:
        if kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind must be one of {FAILURE_KINDS}")
        self._write("INSERT INTO failures (round_id, device_id, kind, reason, recorded_at) VALUES (?,?,?,?,?)",
                    (round_id, device_id, kind, cut_reason(reason), time.time()))

    def add_comparison(self, run_id: int, number: int, model_a: str, model_b: str,
                       by_class: Mapping[str, Mapping[str, float]]) -> None:
        now = time.time()
        for cls, v in by_class.items():
            self._write("INSERT INTO comparisons (run_id, number, model_a, model_b, device_class, devices, a, b, diff,"
                        " se, recorded_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                        (run_id, number, model_a, model_b, cls, int(v["devices"]), float(v["a"]), float(v["b"]),
                         float(v["diff"]), float(v["se"]), now))

    def add_latency_prediction(self, bundle_hash: str, profile: str, model_version: str, predicted_ms: float,
                               basis: Mapping[str, Any]) -> None:
        self._write("INSERT OR REPLACE INTO latency_predictions VALUES (?,?,?,?,?,?)",
                    (bundle_hash, profile, model_version, predicted_ms, json.dumps(basis, sort_keys=True), time.time()))

    # reads ----------------------------------------------------------------------------------------
    def _rows(self, sql: str, args: Iterable[Any] = ()) -> list[dict[str, Any]]:
        try:
            cur = self._db.execute(sql, tuple(args))
        except sqlite3.Error as e:
            raise StoreError(f"cannot read results database {self.path}: {e}") from None
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, row)) for row in cur.fetchall()]

    def _row(self, sql: str, args: Iterable[Any] = ()) -> dict[str, Any] | None:
        rows = self._rows(sql, args)
        return rows[0] if rows else None

    def runs(self) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM runs ORDER BY id")

    def rounds(self, run_id: int) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM rounds WHERE run_id = ? ORDER BY number, id", (run_id,))

    def bundle_labels(self) -> dict[str, str]:
        """Content hash -> ``name@version`` of every bundle a round evaluated."""
        return {r["bundle_hash"]: r["model"] for r in self._rows("SELECT DISTINCT bundle_hash, model FROM rounds")}

    def reports(self, round_id: int) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM reports WHERE round_id = ? ORDER BY id", (round_id,))
        for r in rows:
            r["metrics"] = json.loads(r["metrics"])
            r["emulated"] = bool(r["emulated"])
        return rows

    def failures(self, round_id: int) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM failures WHERE round_id = ? ORDER BY id", (round_id,))

    def comparisons(self, run_id: int) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM comparisons WHERE run_id = ? ORDER BY number, id", (run_id,))

    def devices(self) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM devices ORDER BY device_id")
        for r in rows:
            r["held_bundles"] = json.loads(r["held_bundles"] or "[]")
        return rows

    def latency_predictions(self, bundle_hash: str) -> list[dict[str, Any]]:
        """Predicted (never measured) latency of one bundle per device profile; none in an older database."""
        if not self._rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'latency_predictions'"):
            return []
        rows = self._rows("SELECT * FROM latency_predictions WHERE bundle_hash = ? ORDER BY profile", (bundle_hash,))
        for r in rows:
            r["basis"] = json.loads(r["basis"])
        return rows

    def change_marker(self) -> str:
        """A short string that changes whenever a run, round, report, failure or device is written."""
        row = self._rows(
            "SELECT (SELECT count(*) || '.' || ifnull(max(id), 0) || group_concat(status || ifnull(finished_at, ''))"
            " FROM runs) AS runs, (SELECT count(*) || '.' || ifnull(max(id), 0) || '.' || count(finished_at)"
            " FROM rounds) AS rounds, (SELECT count(*) || '.' || ifnull(max(id), 0) FROM reports) AS reports,"
            " (SELECT count(*) || '.' || ifnull(max(id), 0) FROM failures) AS failures,"
            " (SELECT count(*) || '.' || ifnull(max(last_seen), 0) FROM devices) AS devices")[0]
        return short_hex(repr(sorted(row.items())), 16)

    def exhausted_devices(self, dataset: str) -> set[str]:
        """Devices that answered "budget exhausted" for ``dataset`` in any run: never sampled again for it."""
        rows = self._db.execute(
            "SELECT DISTINCT f.device_id FROM failures f JOIN rounds r ON f.round_id = r.id"
            " WHERE f.kind = 'budget_exhausted' AND r.dataset = ?", (dataset,))
        return {r[0] for r in rows}
