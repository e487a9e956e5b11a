"""The ledger fails closed: refusals, restarts, corruption, floors, repeats, and crash before send."""

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cuvil.edge_runtime.privacy import DEFAULT_PARAMS, PrivacyParams, PrivacyRefusal, RefusalCode
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
    with pytest.raises(PrivacyRefusal, match="never re-created"):
        PrivacyLedger.create(tmp_path / "ledger.db")


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
    led.close()
