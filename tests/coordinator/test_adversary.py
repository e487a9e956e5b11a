"""A malicious coordinator against the real ClientApp: each attack of issue 14 is a case here.

Every request goes through the Flower ClientApp exactly as a coordinator would send it; what the
coordinator gets back is the reply. The ledger is read directly to see what was charged.
"""

from __future__ import annotations

import io
import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numpy.lib import format as npy

pytest.importorskip("flwr")

from flwr.app import Array, ArrayRecord, Context, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from cuvil.coordinator import messages  # noqa: E402
from cuvil.coordinator.client_app import make_client_app  # noqa: E402
from cuvil.coordinator.device import DeviceState  # noqa: E402
from cuvil.coordinator.fleet import device_data, host_class  # noqa: E402
from cuvil.coordinator.messages import Code  # noqa: E402
from cuvil.coordinator.rounds import BundleRef  # noqa: E402

from .adversary_helpers import export, linear  # noqa: E402
from .fleet_helpers import make_bundle, make_keys  # noqa: E402

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
BUDGET_RELEASES = 12  # releases the default floors allow (σ = 10, 3 families, ε = 3, δ = 1e-6)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("adversary")
    keys = make_keys(root)
    digits = BundleRef.from_file(make_bundle(root, keys))
    three = BundleRef.from_file(export(linear(3, softmax=True), root / "three.cuvil", keys))
    return root, keys, digits, three


class Device:
    """One provisioned device behind its ClientApp; ``ask`` sends an evaluate message."""

    def __init__(self, world, name: str):
        root, keys, self.bundle, _ = world
        self.state = DeviceState.provision(root / name, name, host_class(), [keys.public_path],
                                           data=device_data(0, 4))
        self.app = make_client_app()
        self.ctx = Context(run_id=1, node_id=7, node_config={"state-dir": str(self.state.root)},
                           state=RecordDict(), run_config={})

    def ask(self, release: object = "rel", bundle: BundleRef | None = None, **cfg) -> Message:
        ref = bundle or self.bundle
        config = {"bundle-hash": ref.content_hash, "dataset": "digits-local", "release-id": release, "round": 1,
                  "latency-runs": 3, "latency-warmup": 0, **{k.replace("_", "-"): v for k, v in cfg.items()}}
        config = {k: v for k, v in config.items() if v is not None}
        return self.app(Message(messages.evaluate_request(config, ref.data), 7, messages.EVALUATE), self.ctx)

    def releases(self) -> int:
        ledger = self.state.ledger()
        try:
            return ledger.releases(self.state.dataset_name)
        finally:
            ledger.close()

    def spent(self) -> float:
        ledger = self.state.ledger()
        try:
            return ledger.spent(self.state.dataset_name)
        finally:
            ledger.close()


_COUNT = iter(range(10**6))


@pytest.fixture
def device(world):
    return Device(world, f"dev-{next(_COUNT)}")


def refused(reply: Message, code: int, word: str) -> bool:
    """A typed refusal: no metrics, and a reason that is the code's name and one fixed word, nothing else."""
    return (reply.has_error() and not reply.has_content() and reply.error.code == code
            and reply.error.reason == f"{Code.NAMES[code]}: {word}")


def sums(reply: Message) -> tuple[int, int, int]:
    m = messages.reply_payload(reply)
    return m["dp_correct"], m["dp_loss"], m["dp_count"]


# 1. parameters that once switched the budget off or skipped the charge --------------------------------
HOSTILE = [
    ("dp_epsilon", math.nan, "not_finite"), ("dp_epsilon", "nan", "wrong_type"), ("dp_epsilon", "NaN", "wrong_type"),
    ("dp_epsilon", math.inf, "not_finite"), ("dp_epsilon", -1.0, "out_of_range"), ("dp_epsilon", 1e300, "out_of_range"),
    ("dp_epsilon", True, "wrong_type"), ("dp_epsilon", 10.0, "above_budget"),
    ("dp_sigma", math.inf, "not_finite"), ("dp_sigma", "1e400", "wrong_type"), ("dp_sigma", 1e152, "out_of_range"),
    ("dp_sigma", -10.0, "out_of_range"), ("dp_sigma", "10", "wrong_type"), ("dp_sigma", math.nan, "not_finite"),
    ("dp_sigma", 5.0, "below_floor"), ("dp_sigma", [10.0, 20.0], "wrong_type"), ("dp_sigma", b"10", "wrong_type"),
    ("latency_runs", -1, "out_of_range"), ("latency_runs", 0, "out_of_range"), ("latency_runs", 10**9, "out_of_range"),
    ("latency_runs", 1.5, "wrong_type"), ("latency_runs", "10", "wrong_type"), ("latency_warmup", -1, "out_of_range"),
    ("latency_warmup", math.nan, "wrong_type"), ("round", -1, "out_of_range"), ("round", "1", "wrong_type"),
    ("round", 2**40, "out_of_range"), ("round", 1.0, "wrong_type"), ("dataset", 7, "wrong_type"),
]


@pytest.mark.parametrize("field, value, word", HOSTILE, ids=[f"{f}={v!r}"[:40] for f, v, _ in HOSTILE])
def test_hostile_parameters_are_refused_with_a_typed_reason_and_charge_nothing(device, field, value, word):
    reply = device.ask(f"rel-{field}", **{field: value})
    assert refused(reply, Code.PARAMS_REJECTED, word), reply.error
    assert device.releases() == 0


@pytest.mark.parametrize("release", ["", "x" * 401, "rel\n", "r\x00l", "r\u202el", 5, b"rel", None, 1.5])
def test_hostile_release_ids_are_refused(device, release):
    """Bounded and printable (a device's name may be anything printable: "lab pc/2 é" is accepted)."""
    reply = device.ask(release)
    word = "missing" if release is None else "wrong_type" if not isinstance(release, str) else "bad_release_id"
    assert refused(reply, Code.PARAMS_REJECTED, word), reply.error
    assert device.releases() == 0


def test_a_release_id_with_any_printable_device_name_is_served(device):
    assert not device.ask("run-r1-eval-lab pc/2 é@0123456789abcdef").has_error()


# 2. retries after a failure, and changed parameters on a charged release-id ----------------------------
def test_a_retry_after_a_refusal_is_charged_once_and_repeats_come_from_the_stored_reply(device):
    for bad in (math.inf, "1e400", 1e152):
        assert refused(device.ask("same", dp_sigma=bad), Code.PARAMS_REJECTED,
                       "not_finite" if bad == math.inf else "wrong_type" if isinstance(bad, str) else "out_of_range")
    assert device.releases() == 0 and device.spent() == 0.0
    first = device.ask("same", dp_sigma=10.0)
    assert not first.has_error() and device.releases() == 1
    spent = device.spent()
    assert spent > 0.7
    for _ in range(20):  # the old attack: every retry drew fresh noise for free
        assert sums(device.ask("same", dp_sigma=10.0)) == sums(first)
    assert device.releases() == 1 and device.spent() == spent


@pytest.mark.parametrize("change", [{"dp_sigma": 20.0}, {"dp_epsilon": 2.0}, {"bundle": "three"}])
def test_a_charged_release_id_with_other_parameters_or_bundle_is_refused(world, device, change):
    assert not device.ask("bound").has_error()
    if "bundle" in change:
        change = {"bundle": world[3]}
    assert refused(device.ask("bound", **change), Code.PARAMS_REJECTED, "release_rebound")
    assert device.releases() == 1


def test_a_flood_of_requests_gets_at_most_the_budget(device):
    """Hostile values interleaved with valid requests: the budget still ends after 12 releases."""
    served = 0
    for i in range(BUDGET_RELEASES + 6):
        assert device.ask(f"nan-{i}", dp_epsilon=math.nan).has_error()
        reply = device.ask(f"ok-{i}")
        served += not reply.has_error()
        if reply.has_error():
            assert refused(reply, Code.BUDGET_EXHAUSTED, "budget_spent")
    assert served == BUDGET_RELEASES and device.releases() == BUDGET_RELEASES and device.spent() <= 3.0


# 3-4. error text, refusals and timing that depend on private data --------------------------------------
def test_a_bundle_with_fewer_classes_than_the_labels_is_evaluated_not_an_error(world, device):
    """The labels go up to 9; a 3-class model once raised IndexError naming a private label."""
    reply = device.ask("three", bundle=world[3])
    assert not reply.has_error(), reply.error
    m = messages.reply_payload(reply)
    assert abs(m["dp_count"] / 256 - len(device.state.dataset()[1])) < 100


def test_refusals_and_repeats_never_read_the_data(device):
    """Budget spent, rebound and repeated releases are answered before the data are read: with the
    data file destroyed the answers are unchanged (so neither they nor their timing depend on it)."""
    stored = device.ask("kept")
    for i in range(BUDGET_RELEASES - 1):
        assert not device.ask(f"spend-{i}").has_error()
    (device.state.root / "data.npz").write_bytes(b"gone")
    assert refused(device.ask("more"), Code.BUDGET_EXHAUSTED, "budget_spent")
    assert refused(device.ask("kept", dp_sigma=30.0), Code.PARAMS_REJECTED, "release_rebound")
    assert refused(device.ask("other", dp_epsilon=math.nan), Code.PARAMS_REJECTED, "not_finite")
    assert sums(device.ask("kept")) == sums(stored)


def test_device_errors_carry_a_code_and_a_word_never_exception_text(device):
    (device.state.root / "data.npz").write_bytes(b"not an npz")
    reply = device.ask("broken")
    assert refused(reply, Code.DEVICE_ERROR, "device_state"), reply.error
    assert device.releases() == 0


def test_the_emulated_latency_is_timed_on_synthetic_inputs(world):
    """It once was the wall time of the private-data run divided by n, which revealed n."""
    from cuvil.edge_runtime import runner as device_runner
    from cuvil.devices import resolve_profile
    from cuvil.edge_runtime.loader import load_bytes
    from cuvil.edge_runtime.trust import TrustStore

    root, _, ref, _ = world
    model = load_bytes(ref.data, TrustStore.from_dir(root / "keys"))
    runner = device_runner.prepare(model, resolve_profile("rpi5"), root / "emu-cache")
    assert runner.emulated
    synthetic = {runner.input_name: np.zeros(runner.input_shape, np.float32)}
    before = runner.latency(synthetic, 0, 3, 1.0)  # no private run has happened: still a real timing
    assert before.p50_ms > 0


# 5-6. a device with only its own dependencies ---------------------------------------------------------
def test_a_release_needs_no_dp_accounting(tmp_path):
    """dp-accounting is not a device dependency: a release works with it unimportable."""
    script = textwrap.dedent(f"""
        import sys
        sys.modules["dp_accounting"] = None  # import dp_accounting now raises ImportError
        from cuvil.edge_runtime.privacy import DEFAULT_PARAMS
        from cuvil.edge_runtime.privacy.ledger import PrivacyLedger
        from cuvil.edge_runtime.privacy.release import release_report
        led = PrivacyLedger.create({str(tmp_path / "l.db")!r})
        report, spent = release_report(led, "d", "r1", [True] * 10, [0.1] * 10, DEFAULT_PARAMS)
        print(round(spent, 3))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert 0.7 < float(proc.stdout) < 0.8


# 7. a local attacker who puts back an earlier ledger ---------------------------------------------------
def test_a_sealed_device_refuses_a_ledger_put_back_from_a_copy(world, tmp_path):
    import shutil

    root, keys, _, _ = world
    dev = Device.__new__(Device)
    dev.bundle, dev.app = world[2], make_client_app()
    dev.state = DeviceState.provision(root / "sealed", "sealed", host_class(), [keys.public_path],
                                      data=device_data(0, 4), seal_dir=tmp_path / "seal")
    dev.ctx = Context(run_id=1, node_id=7, node_config={"state-dir": str(dev.state.root)}, state=RecordDict(),
                      run_config={})
    shutil.copy(dev.state.root / "privacy.db", tmp_path / "copy.db")
    for i in range(3):
        assert not dev.ask(f"s{i}").has_error()
    shutil.copy(tmp_path / "copy.db", dev.state.root / "privacy.db")
    assert refused(dev.ask("s9"), Code.LEDGER_UNAVAILABLE, "ledger_broken")


# 8. a malformed bundle or delta array ------------------------------------------------------------------
def _npy_header(shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    npy.write_array_header_1_0(buf, {"descr": "|u1", "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _npz() -> bytes:
    buf = io.BytesIO()
    np.savez(buf, a=np.zeros(3))
    return buf.getvalue()


MALFORMED = {  # (dtype, shape, stype, data) of the pushed Array. The first four once raised out of the ClientApp
    # (Flower's code 2 with the exception's text); the last was answered as a bundle's refusal for a delta too.
    "torch stype": ("uint8", (8,), "torch.raw", b"\0" * 8),
    "empty data": ("uint8", (0,), "numpy.ndarray", b""),
    "an npz": ("uint8", (8,), "numpy.ndarray", _npz()),
    "a 1 TiB claim": ("uint8", (2**40,), "numpy.ndarray", _npy_header((2**40,)) + b"\0" * 16),
    "a header larger than its data": ("uint8", (64,), "numpy.ndarray", _npy_header((64,)) + b"\0" * 16),
}


@pytest.mark.parametrize("key, code, word", [("bundle", Code.SIGNATURE_REJECTED, "bundle_rejected"),
                                             ("delta", Code.DELTA_REJECTED, "delta_rejected")])
@pytest.mark.parametrize("case", MALFORMED)
def test_a_malformed_bundle_or_delta_array_is_a_typed_refusal(device, key, code, word, case):
    config = {"bundle-hash": device.bundle.content_hash, "dataset": "digits-local", "release-id": "arr",
              "round": 1, "latency-runs": 3, "latency-warmup": 0}
    content = messages.evaluate_request(config, None)
    content[key] = ArrayRecord({key: Array(*MALFORMED[case])})
    reply = device.app(Message(content, 7, messages.EVALUATE), device.ctx)
    assert refused(reply, code, word), reply.error
    assert device.releases() == 0


# 9. version state --------------------------------------------------------------------------------------
def _version(device, ref: BundleRef, model: str, action: str = "activate") -> Message:
    config = {"bundle-hash": ref.content_hash, "model": model, "action": action}
    return device.app(Message(messages.evaluate_request(config, ref.data), 7, messages.ACTIVATE), device.ctx)


def test_a_hostile_model_name_never_bricks_later_activations_and_rollbacks(world, device):
    """A 1 MiB name was once written, then every activate or revert failed to read versions.json."""
    _, _, digits, three = world
    assert not _version(device, digits, "m").has_error()
    assert not _version(device, three, "m").has_error()
    for name in ("x" * (1 << 20), "", "a\nb"):
        for action in ("activate", "revert"):
            assert refused(_version(device, digits, name, action), Code.DEVICE_ERROR, "device_state")
    reverted = messages.reply_payload(_version(device, digits, "m", "revert"))
    assert (reverted["active"], reverted["previous"]) == (digits.content_hash, three.content_hash)
    assert messages.reply_payload(_version(device, three, "m"))["active"] == three.content_hash
