"""The on-device privacy ledger: SQLite, charged and made durable BEFORE any noise is drawn.

The ledger is provisioned once (:meth:`PrivacyLedger.create`) with the device's floors. Opening a
missing, unreadable or corrupt ledger is a refusal, never a reset. A charge that would push a
dataset's ε past the budget is refused and not recorded. Each charge records its *binding* (a hash
of the exact parameters and bundle it was made for), so a charged release-id can never be re-used
for a different release. Every transaction is closed on every path, whatever is raised inside it.

The ledger holds no secret: noise comes from fresh OS randomness per release, so a copy of this
file recomputes nothing (schema 1 kept a noise key here; opening one migrates it and deletes it).
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .accounting import AccountingError, ChargeEvent, epsilon_spent
from .errors import PrivacyRefusal, Reason, RefusalCode
from .seal import LedgerSeal, SealError

SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE charges (release_id TEXT PRIMARY KEY, dataset TEXT NOT NULL,
                      noise_multiplier REAL NOT NULL, charged_at INTEGER NOT NULL, events TEXT,
                      binding TEXT NOT NULL DEFAULT '');
CREATE TABLE replies (release_id TEXT PRIMARY KEY REFERENCES charges(release_id), payload TEXT NOT NULL);
"""
_MIGRATE_1 = ("ALTER TABLE charges ADD COLUMN binding TEXT NOT NULL DEFAULT ''",
              "DELETE FROM meta WHERE key = 'secret'", "UPDATE meta SET value = '2' WHERE key = 'schema'")
_EVENTS_COLUMN = "ALTER TABLE charges ADD COLUMN events TEXT"  # a schema-1 ledger from before training


@dataclass(frozen=True)
class PrivacyFloors:
    """Device-side limits the coordinator may tighten but never loosen."""

    min_sigma: float = 10.0
    epsilon: float = 3.0
    delta: float = 1e-6


def _broken(detail: str) -> PrivacyRefusal:
    return PrivacyRefusal(RefusalCode.LEDGER_UNAVAILABLE, Reason.LEDGER_BROKEN, detail)


class PrivacyLedger:
    def __init__(self, conn: sqlite3.Connection, path: Path, floors: PrivacyFloors, seal: LedgerSeal | None = None):
        self._conn = conn
        self.path = path
        self.floors = floors
        self.seal = seal

    @classmethod
    def create(cls, path: str | os.PathLike, floors: PrivacyFloors = PrivacyFloors(),
               seal: LedgerSeal | None = None, dataset: str | None = None) -> PrivacyLedger:
        """``dataset``: the one dataset name this device charges (bound here; see :meth:`open`)."""
        path = Path(path)
        if path.exists():
            raise _broken(f"{path} exists; a ledger is never re-created")
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("PRAGMA synchronous=FULL")
        conn.executescript("BEGIN;" + _SCHEMA + "COMMIT;")
        meta = {"schema": str(SCHEMA_VERSION), "floors": json.dumps(floors.__dict__, sort_keys=True)}
        if dataset is not None:
            meta["dataset"] = dataset
        with conn:
            conn.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
        os.chmod(path, 0o600)
        conn.close()
        return cls.open(path, seal, dataset)

    @classmethod
    def open(cls, path: str | os.PathLike, seal: LedgerSeal | None = None, dataset: str | None = None) -> PrivacyLedger:
        """Open the ledger; with ``seal``, refuse one that was altered or rolled back (:mod:`.seal`).

        A ledger that was sealed is refused without its seal: the seal's folder is named in the device's
        own files, and naming none must not turn the seal off. ``dataset``: the name the device charges
        to, refused where the ledger was made for another (renaming the dataset gave the same data a
        fresh budget); a ledger made before datasets were bound takes the first name it is opened for.
        """
        path = Path(path)
        if not path.is_file():
            raise _broken(f"no privacy ledger at {path}")
        conn = None
        try:
            conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, isolation_level=None)
            conn.execute("PRAGMA synchronous=FULL")
            if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("quick_check failed")
            meta = dict(conn.execute("SELECT key, value FROM meta"))
            if meta.get("schema") == "1":
                with _transaction(conn):
                    if "events" not in {r[1] for r in conn.execute("PRAGMA table_info(charges)")}:
                        conn.execute(_EVENTS_COLUMN)
                    for sql in _MIGRATE_1:
                        conn.execute(sql)
            elif meta.get("schema") != str(SCHEMA_VERSION):
                raise sqlite3.DatabaseError(f"schema {meta.get('schema')!r}")
            floors = PrivacyFloors(**json.loads(meta["floors"]))
            if not all(isinstance(v, float | int) and math.isfinite(v) and v > 0 for v in floors.__dict__.values()):
                raise ValueError("floors must be finite and positive")
            ledger = cls(conn, path, floors, seal)
            if seal is None and "mac" in meta:
                raise SealError("the ledger is sealed, and no seal was given to open it")
            bound = meta.get("dataset")
            if dataset is not None and bound is not None and bound != dataset:
                raise SealError(f"the ledger charges dataset {bound!r}, not {dataset!r}")
            reseal = seal is not None and seal.check(ledger._all_charges(), meta.get("mac"), ledger._context())
            if dataset is not None and bound is None:
                with _transaction(conn):
                    conn.execute("INSERT INTO meta VALUES ('dataset', ?)", (dataset,))
                reseal = seal is not None
            if reseal:
                with _transaction(conn):
                    ledger._reseal()
            if seal is not None:
                seal.advance(len(ledger._all_charges()))
        except (sqlite3.Error, KeyError, ValueError, TypeError, OSError, SealError) as e:
            if conn is not None:
                conn.close()
            raise _broken(f"privacy ledger {path} is unusable ({e})") from None
        return ledger

    def close(self) -> None:
        self._conn.close()

    def _all_charges(self) -> list[tuple]:
        return self._conn.execute("SELECT release_id, dataset, noise_multiplier, events, binding FROM charges "
                                  "ORDER BY rowid").fetchall()

    def _context(self) -> dict[str, str | None]:
        """What the MAC covers beside the charges: the floors and the dataset, as the meta table stores them."""
        meta = dict(self._conn.execute("SELECT key, value FROM meta WHERE key IN ('floors', 'dataset')"))
        return {"floors": meta.get("floors"), "dataset": meta.get("dataset")}

    def _reseal(self) -> None:
        """Store the MAC over every charge and the context (inside the caller's transaction)."""
        self._conn.execute("INSERT OR REPLACE INTO meta VALUES ('mac', ?)",
                           (self.seal.mac(self._all_charges(), self._context()),))

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
        return self.binding(release_id) is not None

    def binding(self, release_id: str) -> str | None:
        """What a charged release-id was charged for ('' for one charged before bindings); None if never."""
        row = self._conn.execute("SELECT binding FROM charges WHERE release_id = ?", (release_id,)).fetchone()
        return None if row is None else row[0]

    def epsilon_after(self, dataset: str, events: Sequence[ChargeEvent], epsilon: float, delta: float) -> float:
        """ε after a release of ``events``; refuse (BUDGET_EXHAUSTED) if it would exceed ``epsilon``."""
        try:
            after = epsilon_spent([*self._events(dataset), *events], delta)
        except AccountingError as e:
            raise PrivacyRefusal(RefusalCode.PARAMS_REJECTED, Reason.OUT_OF_RANGE, str(e)) from None
        if not after <= epsilon:
            raise PrivacyRefusal(RefusalCode.BUDGET_EXHAUSTED, Reason.BUDGET_SPENT,
                                 f"dataset {dataset!r}: this release would spend ε={after:.3f} > {epsilon}")
        return after

    def charge(self, dataset: str, release_id: str, noise_multiplier: float, epsilon: float, delta: float,
               events: Sequence[ChargeEvent] = (), *, binding: str = "") -> float:
        """Record a release durably, or refuse it if it would exceed ``epsilon``; return ε after it.

        ``events``: what the release runs, when it is more than one Gaussian of ``noise_multiplier``
        (a training round's DP-SGD steps and its noisy count). A release-id is charged once: charging
        it again is refused (a repeat is answered from the stored reply, never re-noised).
        """
        events = list(events) or [ChargeEvent(noise_multiplier)]

        def work() -> float:
            if self.is_charged(release_id):
                raise PrivacyRefusal(RefusalCode.PARAMS_REJECTED, Reason.RELEASE_REBOUND,
                                     f"release {release_id!r} is already charged")
            after = self.epsilon_after(dataset, events, epsilon, delta)
            self._conn.execute("INSERT INTO charges (release_id, dataset, noise_multiplier, charged_at, events, binding)"
                               " VALUES (?, ?, ?, strftime('%s','now'), ?, ?)",
                               (release_id, dataset, noise_multiplier,
                                json.dumps([[e.noise_multiplier, e.sample_rate, e.steps] for e in events]), binding))
            if self.seal is not None:
                self._reseal()
            return after

        after = _in_transaction(self._conn, work)
        if self.seal is not None:
            try:
                self.seal.advance(len(self._all_charges()))
            except (OSError, SealError) as e:  # the charge stands (budget spent); nothing is released
                raise _broken(f"could not advance the ledger counter ({e})") from None
        return after

    def cached_reply(self, release_id: str) -> dict | None:
        row = self._conn.execute("SELECT payload FROM replies WHERE release_id = ?", (release_id,)).fetchone()
        return json.loads(row[0]) if row else None

    def store_reply(self, release_id: str, payload: dict) -> None:
        text = json.dumps(payload, sort_keys=True)
        _in_transaction(self._conn, lambda: self._conn.execute("INSERT OR REPLACE INTO replies VALUES (?, ?)",
                                                               (release_id, text)))


def _in_transaction(conn: sqlite3.Connection, work):
    """Run ``work`` in BEGIN IMMEDIATE ... COMMIT; roll back on anything raised (not only SQLite's)."""
    try:
        with _transaction(conn):
            return work()
    except sqlite3.Error as e:
        raise _broken(f"could not write the privacy ledger ({e})") from None


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
