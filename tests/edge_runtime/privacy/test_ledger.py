"""The ledger fails closed: refusals, restarts, corruption, floors, repeats, and crash before send."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cuvil.edge_runtime.privacy import DEFAULT_PARAMS, PrivacyParams, PrivacyRefusal, RefusalCode
from cuvil.edge_runtime.privacy.errors import Reason
from cuvil.edge_runtime.privacy.ledger import PrivacyFloors, PrivacyLedger
from cuvil.edge_runtime.privacy.release import release_report

CORRECT = np.arange(100) % 3 != 0
LOSSES = np.linspace(0, 4, 100)


@pytest.fixture
def ledger(tmp_path):
    led = PrivacyLedger.create(tmp_path / "ledger.db")
    yield led
    led.close()


def release(led, rid, dataset="digits", params=DEFAULT_PARAMS):
    return release_report(led, dataset, rid, CORRECT, LOSSES, params)


def test_twelve_reports_then_refusals_without_metrics(ledger):
    for i in range(12):
        report, spent = release(ledger, f"r{i}")
        assert set(report.sums) == {"correct", "loss", "count"} and spent <= 3.0
    for i in range(12, 15):
        with pytest.raises(PrivacyRefusal) as e:
            release(ledger, f"r{i}")
        assert e.value.code is RefusalCode.BUDGET_EXHAUSTED
    assert ledger.releases("digits") == 12
    assert ledger.cached_reply("r12") is None
    release(ledger, "other-0", dataset="other")  # budgets are per dataset


def test_budget_survives_a_restart(tmp_path, ledger):
    for i in range(12):
        release(ledger, f"r{i}")
    ledger.close()
    reopened = PrivacyLedger.open(tmp_path / "ledger.db")
    with pytest.raises(PrivacyRefusal, match="DP_BUDGET_EXHAUSTED"):
        release(reopened, "again")
    reopened.close()


def test_repeated_request_is_answered_from_the_cache_at_no_cost(ledger):
    first, spent1 = release(ledger, "same")
    second, spent2 = release(ledger, "same")
    assert first == second and spent1 == spent2 and ledger.releases("digits") == 1


@pytest.mark.parametrize("damage", ["missing", "garbage", "truncated"])
def test_missing_or_corrupt_ledger_is_a_refusal_never_a_reset(tmp_path, ledger, damage):
    path = tmp_path / "ledger.db"
    release(ledger, "r0")
    ledger.close()
    if damage == "missing":
        path.unlink()
    elif damage == "garbage":
        path.write_bytes(os.urandom(4096))
    else:
        path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(PrivacyRefusal) as e:
        PrivacyLedger.open(path)
    assert e.value.code is RefusalCode.LEDGER_UNAVAILABLE


def test_ledger_is_never_recreated_over_an_existing_file(tmp_path, ledger):
    with pytest.raises(PrivacyRefusal) as e:
        PrivacyLedger.create(tmp_path / "ledger.db")
    assert e.value.code is RefusalCode.LEDGER_UNAVAILABLE and "never re-created" in e.value.detail


def test_floors_can_be_raised_but_not_lowered(tmp_path):
    led = PrivacyLedger.create(tmp_path / "l.db", PrivacyFloors(min_sigma=12.0, epsilon=2.0))
    for params in (PrivacyParams(sigma=10.0, epsilon=2.0), PrivacyParams(sigma=12.0, epsilon=3.0)):
        with pytest.raises(PrivacyRefusal) as e:
            release(led, "x", params=params)
        assert e.value.code is RefusalCode.PARAMS_REJECTED
    assert led.releases("digits") == 0
    report, _ = release(led, "ok", params=PrivacyParams(sigma=20.0, epsilon=1.5))
    assert report.params.sigma == 20.0
    led.close()


def test_crash_between_charge_and_send_leaves_the_budget_charged(tmp_path):
    path = tmp_path / "ledger.db"
    PrivacyLedger.create(path).close()
    script = textwrap.dedent(f"""
        import os, numpy as np
        from cuvil.edge_runtime.privacy import release as rel, DEFAULT_PARAMS
        from cuvil.edge_runtime.privacy.ledger import PrivacyLedger
        def crash(*a, **k):
            os._exit(17)   # the process dies after the charge, before any noise or reply
        rel.add_noise = crash
        rel.release_report(PrivacyLedger.open({str(path)!r}), "digits", "r0", [True] * 10, [0.1] * 10, DEFAULT_PARAMS)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 17, proc.stderr
    led = PrivacyLedger.open(path)
    assert led.releases("digits") == 1 and led.spent("digits") > 0.7
    assert led.cached_reply("r0") is None
    with pytest.raises(PrivacyRefusal) as e:  # its noise is never drawn again: the reply is lost, not redone
        rel_again(led)
    assert e.value.reason is Reason.RELEASE_LOST and led.releases("digits") == 1
    led.close()


def rel_again(led):
    return release_report(led, "digits", "r0", [True] * 10, [0.1] * 10, DEFAULT_PARAMS)


def test_a_charged_release_id_is_bound_to_its_parameters_and_bundle(ledger):
    first, _ = release_report(ledger, "digits", "b1", CORRECT, LOSSES, DEFAULT_PARAMS, bundle_hash="a" * 64)
    for params, bundle in ((PrivacyParams(sigma=20.0), "a" * 64), (DEFAULT_PARAMS, "b" * 64),
                           (PrivacyParams(epsilon=2.0), "a" * 64)):
        with pytest.raises(PrivacyRefusal) as e:
            release_report(ledger, "digits", "b1", CORRECT, LOSSES, params, bundle_hash=bundle)
        assert e.value.code is RefusalCode.PARAMS_REJECTED and e.value.reason is Reason.RELEASE_REBOUND
    with pytest.raises(PrivacyRefusal) as e:  # other data under the same id: still the stored reply
        release_report(ledger, "digits", "b1", CORRECT, LOSSES, PrivacyParams(loss_clip=2.0), bundle_hash="a" * 64)
    assert e.value.reason is Reason.RELEASE_REBOUND
    again, _ = release_report(ledger, "digits", "b1", ~CORRECT, LOSSES[::-1], DEFAULT_PARAMS, bundle_hash="a" * 64)
    assert again == first and ledger.releases("digits") == 1


def test_noise_is_fresh_per_release_not_derived_from_anything_stored(tmp_path):
    """Two ledgers with identical files and the same release give different noise (and hold no key)."""
    a = PrivacyLedger.create(tmp_path / "a.db")
    (tmp_path / "b.db").write_bytes((tmp_path / "a.db").read_bytes())
    b = PrivacyLedger.open(tmp_path / "b.db")
    ra, _ = release(a, "same")
    rb, _ = release(b, "same")
    assert ra.sums != rb.sums
    assert "secret" not in dict(a._conn.execute("SELECT key, value FROM meta"))
    a.close()
    b.close()


def test_any_error_inside_a_charge_closes_its_transaction(ledger, monkeypatch):
    import cuvil.edge_runtime.privacy.ledger as mod

    def boom(*a, **k):
        raise RuntimeError("accountant failed")

    monkeypatch.setattr(mod, "epsilon_spent", boom)
    with pytest.raises(RuntimeError):
        ledger.charge("digits", "t1", 5.0, 3.0, 1e-6)
    assert not ledger._conn.in_transaction
    monkeypatch.undo()
    assert ledger.charge("digits", "t1", 5.0, 3.0, 1e-6) > 0  # the ledger is usable, nothing was recorded


def test_a_schema_1_ledger_is_migrated_and_its_noise_key_deleted(tmp_path):
    import sqlite3

    path = tmp_path / "v1.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE charges (release_id TEXT PRIMARY KEY, dataset TEXT NOT NULL,
                              noise_multiplier REAL NOT NULL, charged_at INTEGER NOT NULL);
        CREATE TABLE replies (release_id TEXT PRIMARY KEY, payload TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema', '1'), ('secret', '00'), ('floors', '{"delta": 1e-06, "epsilon": 3.0, "min_sigma": 10.0}');
        INSERT INTO charges VALUES ('old', 'digits', 5.77, 0);
    """)
    conn.close()
    led = PrivacyLedger.open(path)
    assert led.releases("digits") == 1 and led.binding("old") == ""
    assert "secret" not in dict(led._conn.execute("SELECT key, value FROM meta"))
    led.close()


def test_a_ledger_from_before_the_events_column_opens_and_composes_training_after_its_old_charges(tmp_path):
    """Its old rows are plain Gaussians; a DP-SGD charge after them composes in the same accountant."""
    import sqlite3

    import dp_accounting

    from cuvil.edge_runtime.privacy.accounting import ChargeEvent

    path = tmp_path / "pre-training.db"
    conn = sqlite3.connect(path)
    conn.executescript("""
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE charges (release_id TEXT PRIMARY KEY, dataset TEXT NOT NULL,
                              noise_multiplier REAL NOT NULL, charged_at INTEGER NOT NULL);
        CREATE TABLE replies (release_id TEXT PRIMARY KEY, payload TEXT NOT NULL);
        INSERT INTO meta VALUES ('schema', '1'), ('floors', '{"delta": 1e-06, "epsilon": 30.0, "min_sigma": 10.0}');
        INSERT INTO charges VALUES ('e1', 'digits', 5.0, 0), ('e2', 'digits', 8.0, 0);
    """)
    conn.close()

    def reference(events):
        acc = dp_accounting.rdp.RdpAccountant()
        for e in events:
            acc.compose(e)
        return acc.get_epsilon(1e-6)

    gauss = [dp_accounting.GaussianDpEvent(5.0), dp_accounting.GaussianDpEvent(8.0)]
    led = PrivacyLedger.open(path)
    assert "events" in {r[1] for r in led._conn.execute("PRAGMA table_info(charges)")}
    assert led.spent("digits") == pytest.approx(reference(gauss), rel=1e-9)
    after = led.charge("digits", "t1", 2.0, 30.0, 1e-6, [ChargeEvent(2.0, 0.1, 20), ChargeEvent(10.0)])
    sgd = dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(2.0)), 20)
    assert after == pytest.approx(reference([*gauss, sgd, dp_accounting.GaussianDpEvent(10.0)]), rel=1e-9)
    led.close()
    reopened = PrivacyLedger.open(path)  # migrated once: opens as the current schema
    assert reopened.releases("digits") == 3 and reopened.spent("digits") == pytest.approx(after, rel=1e-12)
    reopened.close()
