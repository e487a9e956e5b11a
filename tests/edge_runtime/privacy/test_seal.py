"""A sealed ledger detects rollback and alteration, and fails closed."""

import shutil
import sqlite3

import pytest

from cuvil.edge_runtime.privacy import DEFAULT_PARAMS, PrivacyRefusal, RefusalCode
from cuvil.edge_runtime.privacy.ledger import PrivacyLedger
from cuvil.edge_runtime.privacy.release import release_report
from cuvil.edge_runtime.privacy.seal import LedgerSeal


@pytest.fixture
def sealed(tmp_path):
    seal = LedgerSeal(b"k" * 32, tmp_path / "elsewhere" / "ledger.counter")
    path = tmp_path / "ledger.db"
    led = PrivacyLedger.create(path, seal=seal)
    for i in range(2):
        release_report(led, "d", f"r{i}", [True] * 10, [0.1] * 10, DEFAULT_PARAMS)
    led.close()
    return path, seal


def refused(path, seal):
    with pytest.raises(PrivacyRefusal) as e:
        PrivacyLedger.open(path, seal)
    return e.value.code is RefusalCode.LEDGER_UNAVAILABLE


def test_an_earlier_copy_put_back_is_refused(sealed, tmp_path):
    path, seal = sealed
    shutil.copy(path, tmp_path / "backup.db")
    led = PrivacyLedger.open(path, seal)
    release_report(led, "d", "r2", [True] * 10, [0.1] * 10, DEFAULT_PARAMS)
    led.close()
    shutil.copy(tmp_path / "backup.db", path)
    assert PrivacyLedger.open(path).releases("d") == 2  # without the seal, the rollback goes unnoticed
    assert refused(path, seal)


def test_a_deleted_or_changed_charge_is_refused(sealed):
    path, seal = sealed
    conn = sqlite3.connect(path)
    conn.execute("UPDATE charges SET noise_multiplier = 1000 WHERE release_id = 'r0'")
    conn.commit()
    conn.close()
    assert refused(path, seal)


def test_a_ledger_that_lost_its_seal_or_a_bad_counter_is_refused(sealed):
    path, seal = sealed
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM meta WHERE key = 'mac'")
    conn.commit()
    conn.close()
    assert refused(path, seal)
    seal.counter_path.write_text("not a number")
    assert refused(path, seal)


def test_the_seal_passes_an_honest_ledger_and_counts_every_charge(sealed):
    path, seal = sealed
    led = PrivacyLedger.open(path, seal)
    assert led.releases("d") == 2 and seal.counter() == 2
    led.close()
