"""The results store: SQLite, one committed transaction per event, so a killed coordinator loses nothing.

Runs, rounds, devices, per-device reports and failures each have a table. A restarted coordinator
opens the same file and starts a new run beside the old ones.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..compiler.errors import CuvilError

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
"""
FAILURE_KINDS = ("failure", "timeout", "refused", "budget_exhausted")


class StoreError(CuvilError):
    """The results database cannot be opened or written."""


@dataclass(frozen=True)
class DeviceRecord:
    device_id: str
    profile: str
    cpu: str
    features: str
    runtime_version: str
    emulated: bool


class ResultsStore:
    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(SCHEMA)
        except sqlite3.Error as e:
            raise StoreError(f"cannot open results database {self.path}: {e}") from None

    def close(self) -> None:
        self._db.close()

    def _write(self, sql: str, args: Iterable[Any]) -> int:
        try:
            with self._db:
                return self._db.execute(sql, tuple(args)).lastrowid
        except sqlite3.Error as e:
            raise StoreError(f"cannot write results database {self.path}: {e}") from None

    # writes ---------------------------------------------------------------------------------------
    def start_run(self, config: Mapping[str, Any]) -> int:
        return self._write("INSERT INTO runs (started_at, status, config) VALUES (?, 'running', ?)",
                           (time.time(), json.dumps(config, sort_keys=True, default=str)))

    def finish_run(self, run_id: int, status: str = "finished") -> None:
        self._write("UPDATE runs SET finished_at = ?, status = ? WHERE id = ?", (time.time(), status, run_id))

    def start_round(self, run_id: int, number: int, kind: str, model: str, bundle_hash: str, dataset: str) -> int:
        return self._write(
            "INSERT INTO rounds (run_id, number, kind, model, bundle_hash, dataset, started_at) VALUES (?,?,?,?,?,?,?)",
            (run_id, number, kind, model, bundle_hash, dataset, time.time()))

    def finish_round(self, round_id: int, sampled: int, bundle_bytes_sent: int) -> None:
        self._write("UPDATE rounds SET finished_at = ?, sampled = ?, bundle_bytes_sent = ? WHERE id = ?",
                    (time.time(), sampled, bundle_bytes_sent, round_id))

    def upsert_device(self, dev: DeviceRecord) -> None:
        now = time.time()
        self._write(
            "INSERT INTO devices VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(device_id) DO UPDATE SET profile=excluded.profile,"
            " cpu=excluded.cpu, features=excluded.features, runtime_version=excluded.runtime_version,"
            " emulated=excluded.emulated, last_seen=excluded.last_seen",
            (dev.device_id, dev.profile, dev.cpu, dev.features, dev.runtime_version, int(dev.emulated), now, now))

    def add_report(self, round_id: int, device_id: str, profile: str, emulated: bool, metrics: Mapping[str, Any]) -> None:
        self._write("INSERT INTO reports (round_id, device_id, profile, emulated, metrics, received_at) VALUES (?,?,?,?,?,?)",
                    (round_id, device_id, profile, int(emulated), json.dumps(metrics, sort_keys=True), time.time()))

    def add_failure(self, round_id: int, device_id: str, kind: str, reason: str) -> None:
        if kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind must be one of {FAILURE_KINDS}")
        self._write("INSERT INTO failures (round_id, device_id, kind, reason, recorded_at) VALUES (?,?,?,?,?)",
                    (round_id, device_id, kind, reason[:2000], time.time()))

    # reads ----------------------------------------------------------------------------------------
    def _rows(self, sql: str, args: Iterable[Any] = ()) -> list[dict[str, Any]]:
        cur = self._db.execute(sql, tuple(args))
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, row)) for row in cur.fetchall()]

    def runs(self) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM runs ORDER BY id")

    def rounds(self, run_id: int) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM rounds WHERE run_id = ? ORDER BY number, id", (run_id,))

    def reports(self, round_id: int) -> list[dict[str, Any]]:
        rows = self._rows("SELECT * FROM reports WHERE round_id = ? ORDER BY id", (round_id,))
        for r in rows:
            r["metrics"] = json.loads(r["metrics"])
            r["emulated"] = bool(r["emulated"])
        return rows

    def failures(self, round_id: int) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM failures WHERE round_id = ? ORDER BY id", (round_id,))

    def devices(self) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM devices ORDER BY device_id")

    def exhausted_devices(self, dataset: str) -> set[str]:
        """Devices that answered "budget exhausted" for ``dataset`` in any run: never sampled again for it."""
        rows = self._db.execute(
            "SELECT DISTINCT f.device_id FROM failures f JOIN rounds r ON f.round_id = r.id"
            " WHERE f.kind = 'budget_exhausted' AND r.dataset = ?", (dataset,))
        return {r[0] for r in rows}
