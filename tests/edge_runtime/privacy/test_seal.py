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
    assert refused(path, seal)
    assert refused(path, None)  # nor may it be opened as if it had never been sealed


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


def _meta(path, sql, *args):
    conn = sqlite3.connect(path)
    conn.execute(sql, args)
    conn.commit()
    conn.close()


def test_raised_floors_in_a_sealed_ledger_are_refused(sealed):
    """The MAC covers the floors too: a budget of 1e6 written into the meta table passed before."""
    path, seal = sealed
    _meta(path, "UPDATE meta SET value = ? WHERE key = 'floors'",
          '{"delta": 1e-06, "epsilon": 1000000.0, "min_sigma": 10.0}')
    assert refused(path, seal)


def test_a_ledger_opens_for_its_own_dataset_only(tmp_path):
    """The dataset a device charges is bound in its ledger (and sealed): a device whose files name another
    dataset for the same data would get a fresh budget."""
    seal = LedgerSeal(b"k" * 32, tmp_path / "elsewhere" / "ledger.counter")
    path = tmp_path / "ledger.db"
    PrivacyLedger.create(path, seal=seal, dataset="local").close()
    PrivacyLedger.open(path, seal, "local").close()
    with pytest.raises(PrivacyRefusal) as e:
        PrivacyLedger.open(path, seal, "local-2")
    assert "charges dataset 'local', not 'local-2'" in e.value.detail
    _meta(path, "UPDATE meta SET value = 'local-2' WHERE key = 'dataset'")
    assert refused(path, seal)  # the binding is under the MAC


def test_a_ledger_sealed_the_old_way_is_checked_once_then_resealed(sealed):
    """A MAC over the charges alone (before floors and dataset were covered) still verifies, and the ledger
    is resealed with the new MAC, after which its floors are covered."""
    path, seal = sealed
    led = PrivacyLedger.open(path, seal)
    charges = led._all_charges()
    led.close()
    _meta(path, "UPDATE meta SET value = ? WHERE key = 'mac'", seal.mac(charges))
    PrivacyLedger.open(path, seal, "d").close()
    conn = sqlite3.connect(path)
    mac = dict(conn.execute("SELECT key, value FROM meta"))["mac"]
    conn.close()
    assert mac.startswith("v2:")
    _meta(path, "UPDATE meta SET value = ? WHERE key = 'floors'", '{"delta": 1e-06, "epsilon": 9.0, "min_sigma": 10.0}')
    assert refused(path, seal)
