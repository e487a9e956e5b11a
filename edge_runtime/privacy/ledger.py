"""The on-device privacy ledger: SQLite, charged and made durable BEFORE any noise is drawn.

The ledger is provisioned once (:meth:`PrivacyLedger.create`) with the device's floors and a fresh
device secret. Opening a missing, unreadable or corrupt ledger is a refusal, never a reset. A
charge that would push a dataset's ε past the budget is refused and not recorded.
"""

from __future__ import annotations

import json
import os
import sqlite3
from dataclasses import dataclass
from pathlib import Path

from collections.abc import Sequence

from .accounting import ChargeEvent, epsilon_spent
from .errors import PrivacyRefusal, RefusalCode

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE charges (release_id TEXT PRIMARY KEY, dataset TEXT NOT NULL,
                      noise_multiplier REAL NOT NULL, charged_at INTEGER NOT NULL, events TEXT);
CREATE TABLE replies (release_id TEXT PRIMARY KEY REFERENCES charges(release_id), payload TEXT NOT NULL);
"""


@dataclass(frozen=True)
class PrivacyFloors:
    """Device-side limits the coordinator may tighten but never loosen."""

    min_sigma: float = 10.0
    epsilon: float = 3.0
    delta: float = 1e-6


class PrivacyLedger:
    def __init__(self, conn: sqlite3.Connection, path: Path, floors: PrivacyFloors, secret: bytes):
        self._conn = conn
        self.path = path
        self.floors = floors
        self.device_secret = secret

    @classmethod
    def create(cls, path: str | os.PathLike, floors: PrivacyFloors = PrivacyFloors()) -> PrivacyLedger:
        path = Path(path)
        if path.exists():
            raise PrivacyRefusal(RefusalCode.LEDGER_UNAVAILABLE, f"{path} exists; a ledger is never re-created")
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript("BEGIN;" + _SCHEMA + "COMMIT;")
        meta = {"schema": str(SCHEMA_VERSION), "floors": json.dumps(floors.__dict__, sort_keys=True),
                "secret": os.urandom(32).hex()}
        with conn:
            conn.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
        os.chmod(path, 0o600)
        conn.close()
        return cls.open(path)

    @classmethod
    def open(cls, path: str | os.PathLike) -> PrivacyLedger:
        path = Path(path)
        if not path.is_file():
            raise PrivacyRefusal(RefusalCode.LEDGER_UNAVAILABLE, f"no privacy ledger at {path}")
        try:
            conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, isolation_level=None)
            conn.execute("PRAGMA synchronous=FULL")
            if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("quick_check failed")
            meta = dict(conn.execute("SELECT key, value FROM meta"))
            if meta.get("schema") != str(SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"schema {meta.get('schema')!r}")
            if "events" not in {r[1] for r in conn.execute("PRAGMA table_info(charges)")}:
                conn.execute("ALTER TABLE charges ADD COLUMN events TEXT")  # a ledger from before training
            floors = PrivacyFloors(**json.loads(meta["floors"]))
            secret = bytes.fromhex(meta["secret"])
            if len(secret) != 32:
                raise ValueError("bad device secret")
        except (sqlite3.Error, KeyError, ValueError, TypeError) as e:
            raise PrivacyRefusal(RefusalCode.LEDGER_UNAVAILABLE, f"privacy ledger {path} is unreadable ({e})") from None
        return cls(conn, path, floors, secret)

    def close(self) -> None:
        self._conn.close()

    def _charges(self, dataset: str) -> list[list[ChargeEvent]]:
        """Every charge on ``dataset``, oldest first (a row without ``events`` is one plain Gaussian)."""
        rows = self._conn.execute("SELECT noise_multiplier, events FROM charges WHERE dataset = ? ORDER BY rowid",
                                  (dataset,))
        return [[ChargeEvent(*e) for e in json.loads(ev)] if ev else [ChargeEvent(z)] for z, ev in rows]

    def _events(self, dataset: str) -> list[ChargeEvent]:
        return [e for charge in self._charges(dataset) for e in charge]

    def spent(self, dataset: str, delta: float | None = None) -> float:
        return epsilon_spent(self._events(dataset), delta or self.floors.delta)

    def releases(self, dataset: str) -> int:
        return len(self._charges(dataset))

    def is_charged(self, release_id: str) -> bool:
        return self._conn.execute("SELECT 1 FROM charges WHERE release_id = ?", (release_id,)).fetchone() is not None

    def charge(self, dataset: str, release_id: str, noise_multiplier: float, epsilon: float, delta: float,
               events: Sequence[ChargeEvent] = ()) -> float:
        """Record a release durably, or refuse it if it would exceed ``epsilon``; return ε after it.

        ``events``: what the release runs, when it is more than one Gaussian of ``noise_multiplier``
        (a training round's DP-SGD steps and its noisy count).
        """
        events = list(events) or [ChargeEvent(noise_multiplier)]
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            if self.is_charged(release_id):
                self._conn.execute("COMMIT")
                return self.spent(dataset, delta)
            after = epsilon_spent([*self._events(dataset), *events], delta)
            if after > epsilon:
                self._conn.execute("ROLLBACK")
                raise PrivacyRefusal(RefusalCode.BUDGET_EXHAUSTED,
                                     f"dataset {dataset!r}: this release would spend ε={after:.3f} > {epsilon}")
            self._conn.execute("INSERT INTO charges VALUES (?, ?, ?, strftime('%s','now'), ?)",
                               (release_id, dataset, noise_multiplier,
                                json.dumps([[e.noise_multiplier, e.sample_rate, e.steps] for e in events])))
            self._conn.execute("COMMIT")
            return after
        except sqlite3.Error as e:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise PrivacyRefusal(RefusalCode.LEDGER_UNAVAILABLE, f"could not write the privacy ledger ({e})") from None

    def cached_reply(self, release_id: str) -> dict | None:
        row = self._conn.execute("SELECT payload FROM replies WHERE release_id = ?", (release_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def store_reply(self, release_id: str, payload: dict) -> None:
        with self._conn:
            self._conn.execute("INSERT OR REPLACE INTO replies VALUES (?, ?)", (release_id, json.dumps(payload, sort_keys=True)))
