"""Optional rollback detection for the privacy ledger: a MAC over its charges and a monotonic counter.

Someone who can write the device's files could put back an earlier copy of the ledger and so get
its budget back. A :class:`LedgerSeal` keeps a key and a counter *outside* the ledger (ideally on
storage the ledger's backups do not cover, or a hardware monotonic counter behind the same
interface): every charge advances the counter to the ledger's charge count and stores an HMAC over
all charges in the ledger; opening a sealed ledger whose MAC does not verify, or whose charge count
is below the counter, is a refusal (fail closed). It does not help against someone who rolls back
the counter and the ledger together, or who holds the key.

The MAC covers the ledger's floors and the dataset its budget is charged to as well as the charges
(``v2:``): a raised budget or a renamed dataset would otherwise pass with the charges untouched. A
ledger sealed before that (a MAC over the charges alone) is checked the old way once and resealed.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ...compiler.digest import equal, hmac_sha256


MAC_V2 = "v2:"  # a MAC over the charges and the ledger's context


class SealError(Exception):
    """The ledger does not match its seal: altered, rolled back, or the counter is unreadable."""


@dataclass(frozen=True)
class LedgerSeal:
    key: bytes  # 32 bytes, never stored in the ledger
    counter_path: Path  # only ever grows

    def mac(self, charges: Sequence[Sequence[object]], context: Mapping[str, object] | None = None) -> str:
        """The MAC over ``charges`` and the ledger's ``context`` (floors, dataset); None: the legacy form."""
        if context is None:
            text = json.dumps([list(c) for c in charges], separators=(",", ":"))
            return hmac_sha256(self.key, text.encode()).hex()
        text = json.dumps({"charges": [list(c) for c in charges], "context": context}, sort_keys=True,
                          separators=(",", ":"))
        return MAC_V2 + hmac_sha256(self.key, text.encode()).hex()

    def counter(self) -> int:
        try:
            value = int(Path(self.counter_path).read_text().strip() or "0")
        except FileNotFoundError:
            return 0
        except (OSError, ValueError) as e:
            raise SealError(f"ledger counter {self.counter_path} is unreadable ({e})") from None
        if value < 0:
            raise SealError("ledger counter is negative")
        return value

    def check(self, charges: Sequence[Sequence[object]], stored_mac: str | None, context: Mapping[str, object]) -> bool:
        """Refuse a ledger whose charges or context were altered or that is older than the counter says;
        True where its MAC is missing (never charged) or of the legacy form: the caller reseals it."""
        count = self.counter()
        if stored_mac is None:
            if count:
                raise SealError("the ledger has lost its seal")
            return True
        legacy = not stored_mac.startswith(MAC_V2)
        if not equal(stored_mac, self.mac(charges, None if legacy else context)):
            raise SealError("the ledger's charges or floors do not match their MAC")
        if len(charges) < count:
            raise SealError(f"the ledger holds {len(charges)} charges but {count} were made: rolled back")
        return legacy

    def advance(self, count: int) -> None:
        """Raise the counter to ``count`` (durably; never lowers it)."""
        if count <= self.counter():
            return
        path = Path(self.counter_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(str(count))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
