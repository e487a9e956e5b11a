"""The edge device's Flower ClientApp: thin glue over :mod:`.device`.

``verify_bundle_mod`` runs before the evaluate handler: it checks the pushed (or held) bundle's
signature against the device's trusted keys and refuses the message otherwise, so no handler ever
sees an unverified model. Every message may run in a fresh process (deployment), so all state lives
in the device's state directory; the compile cache there is what makes a second round cheap.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod

from ..compiler.errors import BundleError, CuvilError
from ..edge_runtime.privacy.errors import PrivacyRefusal, RefusalCode
from . import fleet, messages
from .device import BundleMissing, DeviceState, EvalRequest, evaluate
from .messages import Code

_REFUSAL_CODES = {RefusalCode.BUDGET_EXHAUSTED: Code.BUDGET_EXHAUSTED,
                  RefusalCode.PARAMS_REJECTED: Code.PARAMS_REJECTED,
                  RefusalCode.LEDGER_UNAVAILABLE: Code.LEDGER_UNAVAILABLE}
_VERIFIED: dict[int, tuple[Any, bool]] = {}  # id(message) -> (verified Model, bundle was held): mod -> handler


def _device(context: Context, overrides: Mapping[str, Any]) -> DeviceState:
    return fleet.resolve_device(context.node_config, {**context.run_config, **overrides})


def make_verify_mod(overrides: Mapping[str, Any] | None = None):
    overrides = dict(overrides or {})

    def verify_bundle_mod(msg: Message, context: Context, call_next) -> Message:
        """Refuse any evaluate message whose bundle does not verify against this device's trusted keys."""
        try:
            state = _device(context, overrides)
            cfg = messages.request_config(msg)
            model, held = state.accept_bundle(messages.request_bundle(msg), str(cfg.get("bundle-hash", "")))
        except BundleMissing as e:
            return messages.error_reply(msg, Code.BUNDLE_MISSING, str(e))
        except (BundleError, ValueError) as e:
            return messages.error_reply(msg, Code.SIGNATURE_REJECTED, str(e))
        except CuvilError as e:
            return messages.error_reply(msg, Code.DEVICE_ERROR, str(e))
        _VERIFIED[id(msg)] = (model, held)
        try:
            return call_next(msg, context)
        finally:
            _VERIFIED.pop(id(msg), None)

    return verify_bundle_mod


def make_client_app(overrides: Mapping[str, Any] | None = None, mods: Sequence[Mod] = ()) -> ClientApp:
    """A ClientApp; ``overrides`` stand in for run config (simulation factories close over them); ``mods``
    wrap every handler (a benchmark's timing, for one)."""
    overrides = dict(overrides or {})
    app = ClientApp(mods=list(mods))

    @app.query("device_info")
    def device_info(msg: Message, context: Context) -> Message:
        try:
            return messages.info_reply(msg, _device(context, overrides).info())
        except CuvilError as e:
            return messages.error_reply(msg, Code.DEVICE_ERROR, str(e))

    @app.evaluate(mods=[make_verify_mod(overrides)])
    def evaluate_bundle(msg: Message, context: Context) -> Message:
        verified = _VERIFIED.get(id(msg))
        if verified is None:  # fail closed: this handler never runs a model the mod did not verify
            return messages.error_reply(msg, Code.SIGNATURE_REJECTED, "bundle was not verified")
        model, held = verified
        cfg = messages.request_config(msg)
        try:
            state = _device(context, overrides)
            req = EvalRequest(bundle_hash=str(cfg["bundle-hash"]), dataset=str(cfg["dataset"]),
                              release_id=str(cfg["release-id"]), sigma=float(cfg.get("dp-sigma", 0.0)),
                              epsilon=float(cfg.get("dp-epsilon", 0.0)),
                              latency_warmup=int(cfg.get("latency-warmup", 5)),
                              latency_runs=int(cfg.get("latency-runs", 50)))
            return messages.metrics_reply(msg, evaluate(state, model, req, bundle_was_cached=held).as_metrics())
        except PrivacyRefusal as e:
            return messages.error_reply(msg, _REFUSAL_CODES[e.code], str(e))
        except Exception as e:  # noqa: BLE001 - any device-side failure becomes a typed reply, never a crash
            return messages.error_reply(msg, Code.DEVICE_ERROR, f"{type(e).__name__}: {e}")

    return app


app = make_client_app()
