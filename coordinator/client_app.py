"""The edge device's Flower ClientApp: thin glue over :mod:`.device`.

``verify_bundle_mod`` runs before the evaluate handler: it checks the pushed (or held) bundle's
signature against the device's trusted keys and refuses the message otherwise, so no handler ever
sees an unverified model. The verified model reaches the handler through a context variable the mod
sets for the duration of that one call (:class:`Verified`): nothing outlives the message. Every
message may run in a fresh process (deployment), so all state lives in the device's state
directory; the compile cache there is what makes a second round cheap.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp
from flwr.clientapp.typing import Mod

from ..compiler.errors import BundleError, CuvilError, DeltaError, DeltaParentError
from ..edge_runtime.loader import Model
from ..edge_runtime.privacy.errors import PrivacyRefusal, RefusalCode
from ..edge_runtime.training import TrainingError
from . import device_delta, device_train, device_versions, fleet, messages
from .device import BundleMissing, DeviceError, DeviceState, EvalRequest, evaluate
from .device_delta import DeltaParentMissing, DeltaReplayed
from .device_train import TrainRequest
from .messages import Code

_REFUSAL_CODES = {RefusalCode.BUDGET_EXHAUSTED: Code.BUDGET_EXHAUSTED,
                  RefusalCode.PARAMS_REJECTED: Code.PARAMS_REJECTED,
                  RefusalCode.LEDGER_UNAVAILABLE: Code.LEDGER_UNAVAILABLE}
_log = logging.getLogger("cuvil.device")


@dataclass(frozen=True)
class Verified:
    """What the verify mod hands a handler: the verified model, whether the device held it, and the
    device (resolved once per message)."""

    model: Model
    held: bool
    state: DeviceState


# Set by the verify mod for the duration of one handler call, reset after it. Reached only through the
# two functions below: a ClientApp is pickled into Ray's workers in simulation, and module-level functions
# travel by reference (a context variable cannot be pickled).
_VERIFIED: ContextVar[Verified | None] = ContextVar("cuvil_verified_bundle", default=None)


def _call_with(verified: Verified, call: Callable[[], Message]) -> Message:
    token = _VERIFIED.set(verified)
    try:
        return call()
    finally:
        _VERIFIED.reset(token)


def _verified() -> Verified | None:
    return _VERIFIED.get()


def _device(context: Context, overrides: Mapping[str, Any]) -> DeviceState:
    return fleet.resolve_device(context.node_config, {**context.run_config, **overrides})


# The word a reply carries for an error that is not a privacy refusal (first matching class wins).
_ERROR_WORDS: tuple[tuple[type[BaseException], str], ...] = (
    (DeltaParentMissing, "delta_parent_missing"), (DeltaReplayed, "delta_replayed"),
    (DeltaParentError, "delta_wrong_parent"), (DeltaError, "delta_rejected"), (BundleMissing, "bundle_missing"), (BundleError, "bundle_rejected"), (TrainingError, "cannot_train"),
    (DeviceError, "device_state"), (BaseException, "internal"))


def _refuse(msg: Message, code: int, error: BaseException) -> Message:
    """A typed error reply: the code and one fixed word (never exception text, which may carry data);
    the details go to the device's own log."""
    _log.info("replied %s: %s", Code.NAMES.get(code, code), getattr(error, "detail", "") or error)
    word = error.reason.value if isinstance(error, PrivacyRefusal) else \
        next(w for kind, w in _ERROR_WORDS if isinstance(error, kind))
    return messages.error_reply(msg, code, word)


def make_verify_mod(overrides: Mapping[str, Any] | None = None) -> Mod:
    """The mod that verifies a message's bundle and hands it to the handler it calls (:class:`Verified`)."""
    overrides = dict(overrides or {})

    def verify_bundle_mod(msg: Message, context: Context, call_next) -> Message:
        """Refuse any evaluate, train or activate message whose bundle (or delta) does not verify against
        this device's trusted keys."""
        try:
            state = _device(context, overrides)
            cfg = messages.request_config(msg)
            announced = str(cfg.get("bundle-hash", ""))
            limit = state.memory_budget()
            data = messages.request_bundle(msg, max_bytes=limit)
            delta = messages.request_bundle(msg, "delta", max_bytes=limit)
            if delta is not None:
                if data is not None:
                    raise DeltaError("a message carries a bundle or a delta, not both")
                data = device_delta.rebuild(state, delta, announced)
            model, held = state.accept_bundle(data, announced)
        except DeltaParentMissing as e:
            return _refuse(msg, Code.DELTA_PARENT_MISSING, e)
        except DeltaError as e:
            return _refuse(msg, Code.DELTA_REJECTED, e)
        except BundleMissing as e:
            return _refuse(msg, Code.BUNDLE_MISSING, e)
        except BundleError as e:
            return _refuse(msg, Code.SIGNATURE_REJECTED, e)
        except ValueError as e:  # bundle bytes the reader could not parse
            return _refuse(msg, Code.SIGNATURE_REJECTED, BundleError(str(e)))
        except CuvilError as e:
            return _refuse(msg, Code.DEVICE_ERROR, e)
        except Exception as e:  # noqa: BLE001 - any other failure is a typed reply too, never Flower's text
            _log.exception("verifying the bundle failed")
            return _refuse(msg, Code.DEVICE_ERROR, e)
        return _call_with(Verified(model, held, state), lambda: call_next(msg, context))

    return verify_bundle_mod


class _BuiltClientApp(ClientApp):
    """A ClientApp that pickles as the call that builds it: Flower's simulation engine pickles the app
    into Ray's workers with every message, and by value that was every handler's code (about 0.5 ms a
    message in the coordinator's process); by reference it is the overrides and the mods."""

    def __init__(self, overrides: dict[str, Any], mods: Sequence[Mod]):
        super().__init__(mods=list(mods))
        self._built_from = (overrides, tuple(mods))

    def __reduce__(self):
        return make_client_app, self._built_from


def make_client_app(overrides: Mapping[str, Any] | None = None, mods: Sequence[Mod] = ()) -> ClientApp:
    """A ClientApp; ``overrides`` stand in for run config (simulation factories close over them); ``mods``
    wrap every handler (a benchmark's timing, for one)."""
    overrides = dict(overrides or {})
    app = _BuiltClientApp(overrides, mods)

    @app.query("device_info")
    def device_info(msg: Message, context: Context) -> Message:
        try:
            return messages.info_reply(msg, _device(context, overrides).info())
        except CuvilError as e:
            return _refuse(msg, Code.DEVICE_ERROR, e)

    verify = make_verify_mod(overrides)

    def verified_handler(work: Callable[[Message, DeviceState, Any, bool, dict[str, Any]], Message]):
        """A handler that runs ``work`` on the model the mod verified; every failure becomes a typed reply."""
        def handler(msg: Message, context: Context) -> Message:
            bundle = _verified()
            if bundle is None:  # fail closed: no handler ever runs a model the mod did not verify
                return messages.error_reply(msg, Code.SIGNATURE_REJECTED, "not_verified")
            try:
                return work(msg, bundle.state, bundle.model, bundle.held, messages.request_config(msg))
            except PrivacyRefusal as e:
                return _refuse(msg, _REFUSAL_CODES[e.code], e)
            except TrainingError as e:
                return _refuse(msg, Code.CANNOT_TRAIN, e)
            except BundleError as e:  # a held bundle whose weights, read now, do not verify: dropped, sent again
                lost = bundle.state.damaged(bundle.model.content_hash) if bundle.held else None
                return _refuse(msg, Code.BUNDLE_MISSING, lost) if lost else _refuse(msg, Code.DEVICE_ERROR, e)
            except Exception as e:  # noqa: BLE001 - any device-side failure becomes a typed reply, never a crash
                _log.exception("handler failed")
                return _refuse(msg, Code.DEVICE_ERROR, e)
        return handler

    def evaluate_work(msg, state, model, held, cfg):
        req = EvalRequest.from_config(cfg)
        return messages.metrics_reply(msg, evaluate(state, model, req, bundle_was_cached=held).as_metrics())

    def train_work(msg, state, model, held, cfg):
        metrics, update = device_train.train(state, model, TrainRequest.from_config(cfg))
        return messages.update_reply(msg, {**metrics, "bundle_was_cached": int(held)}, update)

    def activate_work(msg, state, model, held, cfg):
        name, action = str(cfg.get("model", model.name)), str(cfg.get("action", "activate"))
        if action == "revert":
            v = device_versions.revert(state, name, model.content_hash)
        elif action == "activate":
            base = str(cfg.get("base-hash", "")) or None
            v = device_versions.activate(state, name, model.content_hash, base)
        else:
            raise DeviceError(f"unknown version action {action!r}")
        return messages.info_reply(msg, {"active": v.active or "", "previous": v.previous or "",
                                         "bundle_was_cached": int(held)})

    app.evaluate(mods=[verify])(verified_handler(evaluate_work))
    app.train(mods=[verify])(verified_handler(train_work))
    app.query("activate", mods=[verify])(verified_handler(activate_work))
    return app


app = make_client_app()
