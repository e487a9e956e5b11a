"""What fine-tuning and rollouts add to the results store: updates, versions with lineage, decisions.

Tables (created with the rest of the schema; columns only ever added)::

    updates      one training reply per (round, device): device_id, profile, dp_count (the noisy number
                 of examples, FedAvg's weight), epsilon_spent (the device's ε on its dataset after the
                 charge), metrics (JSON), arrays (the clipped update, an .npz), received_at
    versions     every model version a run made or used: content_hash, name, version, parent (content
                 hash, NULL for an imported one), run_id, rounds, devices, epsilon, delta, method, path
    rollouts     one decision per (run, device class): model_a, model_b, canaries (asked), reported
                 (that reported both), class_devices, diff (B - A), se, bound, alpha, margin,
                 decision ('promote' | 'rollback'), reason, applied (devices switched), recorded_at,
                 unknown (devices whose switch went unanswered: running A or B, nobody knows)
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from .device_text import cut_reason

TRAINING_SCHEMA = """
CREATE TABLE IF NOT EXISTS updates (
  id INTEGER PRIMARY KEY, round_id INTEGER NOT NULL REFERENCES rounds(id), device_id TEXT NOT NULL,
  profile TEXT NOT NULL, dp_count INTEGER NOT NULL, epsilon_spent REAL NOT NULL, metrics TEXT NOT NULL,
  arrays BLOB NOT NULL, received_at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS updates_by_round ON updates(round_id);
CREATE TABLE IF NOT EXISTS versions (
  content_hash TEXT PRIMARY KEY, name TEXT NOT NULL, version TEXT NOT NULL, parent TEXT, run_id INTEGER,
  rounds INTEGER NOT NULL DEFAULT 0, devices INTEGER NOT NULL DEFAULT 0, epsilon REAL, delta REAL,
  method TEXT NOT NULL DEFAULT '', path TEXT NOT NULL DEFAULT '', created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS rollouts (
  id INTEGER PRIMARY KEY, run_id INTEGER NOT NULL REFERENCES runs(id), device_class TEXT NOT NULL,
  model_a TEXT NOT NULL, model_b TEXT NOT NULL, canaries INTEGER NOT NULL, reported INTEGER NOT NULL,
  class_devices INTEGER NOT NULL, diff REAL, se REAL, bound REAL, alpha REAL NOT NULL, margin REAL NOT NULL,
  decision TEXT NOT NULL, reason TEXT NOT NULL, applied INTEGER NOT NULL DEFAULT 0, recorded_at REAL NOT NULL,
  unknown INTEGER NOT NULL DEFAULT 0, UNIQUE (run_id, device_class));
"""
TRAINING_ADDED_COLUMNS = {  # added after the first schema: ALTER TABLE'd into older files on open
    "rollouts": (("unknown", "INTEGER NOT NULL DEFAULT 0"),),
}


def arrays_blob(arrays: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


def blob_arrays(blob: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


class TrainingRecords:
    """Mixed into :class:`.store.ResultsStore`: it provides ``_write``, ``_rows`` and ``_transaction``."""

    def _has(self, table: str) -> bool:
        return bool(self._rows("SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)))

    # updates --------------------------------------------------------------------------------------
    def add_update(self, round_id: int, device_id: str, profile: str, dp_count: int, epsilon_spent: float,
                   metrics: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bool:
        """Record a device's update; False (and nothing written) if the round already holds one from it."""
        return self._write(
            "INSERT INTO updates (round_id, device_id, profile, dp_count, epsilon_spent, metrics, arrays, received_at)"
            " SELECT ?,?,?,?,?,?,?,? WHERE NOT EXISTS (SELECT 1 FROM updates WHERE round_id = ? AND device_id = ?)",
            (round_id, device_id, profile, int(dp_count), float(epsilon_spent), json.dumps(dict(metrics), sort_keys=True),
             arrays_blob(arrays), time.time(), round_id, device_id), rowcount=True) > 0

    def updates(self, round_id: int, with_arrays: bool = False) -> list[dict[str, Any]]:
        """A round's updates, oldest first (the arrays, decoded, only when asked for)."""
        if not self._has("updates"):
            return []
        cols = "*" if with_arrays else "id, round_id, device_id, profile, dp_count, epsilon_spent, metrics, received_at"
        rows = self._rows(f"SELECT {cols} FROM updates WHERE round_id = ? ORDER BY id", (round_id,))
        for r in rows:
            r["metrics"] = json.loads(r["metrics"])
            if with_arrays:
                r["arrays"] = blob_arrays(r["arrays"])
        return rows

    # versions -------------------------------------------------------------------------------------
    def add_version(self, content_hash: str, name: str, version: str, parent: str | None = None,
                    run_id: int | None = None, rounds: int = 0, devices: int = 0, epsilon: float | None = None,
                    delta: float | None = None, method: str = "", path: str = "") -> None:
        """Record a version (once per content hash: a version is what its content is)."""
        self._write("INSERT OR IGNORE INTO versions (content_hash, name, version, parent, run_id, rounds, devices,"
                    " epsilon, delta, method, path, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                    (content_hash, name, version, parent, run_id, rounds, devices, epsilon, delta, method, path,
                     time.time()))

    def versions(self) -> list[dict[str, Any]]:
        return self._rows("SELECT * FROM versions ORDER BY created_at, content_hash") if self._has("versions") else []

    # rollouts -------------------------------------------------------------------------------------
    def add_rollout(self, run_id: int, device_class: str, model_a: str, model_b: str, canaries: int, reported: int,
                    class_devices: int, diff: float | None, se: float | None, bound: float | None, alpha: float,
                    margin: float, decision: str, reason: str) -> None:
        """Record a class's decision (once per run and class: a resumed run keeps the first)."""
        self._write("INSERT OR IGNORE INTO rollouts (run_id, device_class, model_a, model_b, canaries, reported,"
                    " class_devices, diff, se, bound, alpha, margin, decision, reason, recorded_at)"
                    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                    (run_id, device_class, model_a, model_b, canaries, reported, class_devices, diff, se, bound,
                     alpha, margin, decision, cut_reason(reason), time.time()))

    def set_rollout_applied(self, run_id: int, device_class: str, applied: int, unknown: int = 0) -> None:
        self._write("UPDATE rollouts SET applied = ?, unknown = ? WHERE run_id = ? AND device_class = ?",
                    (applied, unknown, run_id, device_class))

    def rollouts(self, run_id: int) -> list[dict[str, Any]]:
        if not self._has("rollouts"):
            return []
        return self._rows("SELECT * FROM rollouts WHERE run_id = ? ORDER BY device_class", (run_id,))
