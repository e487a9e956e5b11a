"""The run configuration: the one table of every key, its type, default, range and meaning.

Flower hands the ServerApp and every ClientApp ``context.run_config`` (``[tool.flwr.app.config]`` in
``pyproject.toml`` plus ``flwr run --run-config`` overrides; Flower drops override keys the table
does not declare). :meth:`RunConfig.from_mapping` turns that mapping into this typed record, refusing
unknown keys, wrong types and out-of-range values with one :class:`RunConfigError`. The repository's
``pyproject.toml`` table and the table in ``docs/fleet.md`` are generated from (and tested against)
this class: a default lives here and nowhere else.

Each field's ``scope`` says what a resumed run does with it: ``run`` keys define what a run measures
(they are taken from the run being resumed, so every device is asked exactly the same question
again), ``ops`` keys say how this coordinator process behaves (the new invocation's value wins),
``sim`` keys matter only in simulation.

Every record is checked whole when it is built (:meth:`RunConfig.__post_init__`): the DP-SGD
parameters, the rollout's rule and the keys that need each other are refused before a run is
recorded, never after its evaluation and training rounds have run.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..compiler.errors import CuvilError
from ..edge_runtime.training.config import DpSgdConfig
from ..edge_runtime.training.errors import TrainingError
from .rollout_rule import DecisionRule, RolloutError
from .schema import MAX_FLOOR_SIGMA

SCOPES = ("run", "ops", "sim")


class RunConfigError(CuvilError):
    """A run-config key is unknown, or its value has the wrong type or range."""


def _key(doc: str, scope: str = "ops", minimum: float | None = None, positive: bool = False) -> dict[str, Any]:
    return {"doc": doc, "scope": scope, "min": minimum, "positive": positive}


@dataclass(frozen=True)
class RunConfig:
    """Every run-config key (``db_path`` is the key ``db-path``); see the module docstring."""

    db_path: str = field(default="~/.cuvil/results.db", metadata=_key(
        "results database (SQLite) on the ServerApp's machine; `~` is expanded, a relative path is relative "
        "to the directory the SuperLink (or simulation) was started in"))
    bundle: str = field(default="", metadata=_key(
        "the `.cuvil` bundle to evaluate (a path on the ServerApp's machine; required)", "run"))
    bundle_b: str = field(default="", metadata=_key(
        "a second version: adds an A/B round after the evaluation rounds", "run"))
    num_rounds: int = field(default=1, metadata=_key("evaluation rounds", "run", minimum=1))
    dataset: str = field(default="digits-local", metadata=_key(
        "the evaluation's name in the results; a device that refused for budget is not sampled again under "
        "it (the device charges its *own* dataset's budget, so renaming resets nothing)", "run"))
    sample_per_class: int = field(default=0, metadata=_key("devices per class per round (0: all)", "run", minimum=0))
    seed: int = field(default=0, metadata=_key("seed of the per-class sampling", "run", minimum=0))
    dp_sigma: float = field(default=0.0, metadata=_key(
        f"noise asked of every device (0: each device's own floor, accepted up to {MAX_FLOOR_SIGMA:g} examples; "
        "a device refuses less than its floor, and a report declaring other noise than asked is refused)", "run",
        minimum=0))
    dp_epsilon: float = field(default=0.0, metadata=_key(
        "privacy budget asked of every device (0: each device's own; a device refuses more than its own)",
        "run", minimum=0))
    latency_runs: int = field(default=50, metadata=_key("timed inferences per device (synthetic inputs)", "run",
                                                        minimum=1))
    latency_warmup: int = field(default=5, metadata=_key("untimed warm-up inferences before them", "run", minimum=0))
    round_timeout: float = field(default=120.0, metadata=_key(
        "seconds a round waits for replies, at most: a dead device costs a round this much or less (Flower may "
        "declare it gone sooner); a first round includes each device's compile", positive=True))
    inventory_timeout: float = field(default=60.0, metadata=_key(
        "seconds the inventory waits, at most (a device's first message starts its ClientApp cold)", positive=True))
    min_nodes: int = field(default=1, metadata=_key("SuperNodes to wait for before the inventory", minimum=0))
    node_wait: float = field(default=30.0, metadata=_key("seconds to wait for `min-nodes`, at most", minimum=0))
    poll_interval: float = field(default=1.0, metadata=_key(
        "seconds between pulls of replies (simulation uses 0.05)", positive=True))
    max_in_flight: int = field(default=0, metadata=_key(
        "messages out at once, at most (0: no limit; the simulation sets it: Flower's in-memory message store "
        "slows down with every message in flight)", minimum=0))
    train_rounds: int = field(default=0, metadata=_key(
        "federated DP fine-tuning rounds after the evaluation rounds, on the devices whose inventory says they can "
        "train; the result is signed as the next version (needs `signing-key`)", "run", minimum=0))
    signing_key: str = field(default="", metadata=_key(
        "the coordinator's private key (a path on the ServerApp's machine) that signs fine-tuned versions; devices "
        "must trust its public key"))
    train_sample_rate: float = field(default=DpSgdConfig.sample_rate, metadata=_key(
        "DP-SGD: Poisson sampling rate of each local example per step", "run", positive=True))
    train_noise_multiplier: float = field(default=DpSgdConfig.noise_multiplier, metadata=_key(
        "DP-SGD: noise std over the per-example clip", "run", positive=True))
    train_steps: int = field(default=DpSgdConfig.steps, metadata=_key("DP-SGD: steps per round", "run", minimum=1))
    train_max_grad_norm: float = field(default=DpSgdConfig.max_grad_norm, metadata=_key(
        "DP-SGD: per-example gradient clip (L2)", "run", positive=True))
    train_learning_rate: float = field(default=DpSgdConfig.learning_rate, metadata=_key(
        "DP-SGD: learning rate (plain SGD)", "run", positive=True))
    train_batch_size: int = field(default=DpSgdConfig.batch_size, metadata=_key(
        "DP-SGD: the averaging batch size (public; about the sampling rate times a device's examples)", "run",
        minimum=1))
    train_update_clip: float = field(default=DpSgdConfig.update_clip, metadata=_key(
        "L2 bound on the update a device returns", "run", positive=True))
    train_layers: int = field(default=DpSgdConfig.train_layers, metadata=_key(
        "train only the last this-many weight layers (0: all)", "run", minimum=0))
    rollout: bool = field(default=False, metadata=_key(
        "canary rollout of the candidate (`bundle-b`, or the fine-tuned version) instead of a plain A/B round, "
        "then an evaluation of what each device runs", "run"))
    canary_fraction: float = field(default=0.25, metadata=_key(
        "share of each device class that gets the candidate first (at least one device per class)", "run",
        positive=True))
    rollout_alpha: float = field(default=0.05, metadata=_key(
        "chance of rolling back a candidate that is not worse (one-sided test on the DP noise)", "run",
        positive=True))
    rollout_margin: float = field(default=0.0, metadata=_key(
        "accuracy the candidate may lose against the active version and still be promoted", "run", minimum=0))
    resume_run: int = field(default=0, metadata=_key(
        "a run id in `db-path` to resume after a crash (0: start a new run)", minimum=0))
    sim_fleet_dir: str = field(default="", metadata=_key("where simulated devices keep their state", "sim"))
    sim_trusted_key: str = field(default="", metadata=_key(
        "public keys (comma-separated) simulated devices trust", "sim"))
    sim_classes: str = field(default="", metadata=_key(
        "device classes the simulated fleet rotates through (comma-separated; empty: host class + ARM)", "sim"))
    sim_shared_cache: bool = field(default=False, metadata=_key("one compile cache per class of simulated devices",
                                                                "sim"))
    sim_seed: int = field(default=0, metadata=_key("seed of the simulated devices' local data", "sim", minimum=0))

    def __post_init__(self) -> None:
        """Ranges that span keys, and keys that need each other (see the module docstring)."""
        try:
            _ = (self.dp_sgd, self.rule)  # each checks its values when built
        except (TrainingError, RolloutError) as e:
            raise RunConfigError(f"run config: {e}") from None
        if self.canary_fraction > 1:
            raise RunConfigError(f"run-config 'canary-fraction' must be in (0, 1], got {self.canary_fraction!r}")
        if self.train_rounds and not self.signing_key:
            raise RunConfigError("run config 'train-rounds' signs its result: set 'signing-key'")

    # reading ---------------------------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> RunConfig:
        """Parse ``context.run_config`` (or any mapping of kebab-case keys) over the defaults."""
        by_key = {key_of(f): f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(by_key))
        if unknown:
            raise RunConfigError(f"unknown run-config key(s) {', '.join(map(repr, unknown))}; "
                                 f"known: {', '.join(sorted(by_key))}")
        return cls(**{by_key[k].name: _coerce(by_key[k], k, v) for k, v in values.items()})

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)

    def resumed_from(self, stored: Mapping[str, Any]) -> RunConfig:
        """This config with every ``run``-scoped key taken from ``stored`` (the resumed run's config)."""
        old = RunConfig.from_mapping({k: v for k, v in stored.items() if k in KEYS})
        return self.replace(**{f.name: getattr(old, f.name) for f in dataclasses.fields(self)
                               if f.metadata["scope"] == "run"})

    def as_run_config(self) -> dict[str, Any]:
        """Kebab-case keys to values, as Flower's ``run_config`` holds them."""
        return {key_of(f): getattr(self, f.name) for f in dataclasses.fields(self)}

    @property
    def db_file(self) -> Path:
        return Path(os.path.expanduser(self.db_path))

    @property
    def trusted_keys(self) -> list[str]:
        return [k for k in self.sim_trusted_key.split(",") if k]

    @property
    def dp_sgd(self) -> DpSgdConfig:
        """The training rounds' DP-SGD parameters (DpSgdConfig checks their ranges)."""
        return DpSgdConfig(self.train_sample_rate, self.train_noise_multiplier, self.train_steps,
                           self.train_max_grad_norm, self.train_learning_rate, self.train_batch_size,
                           self.train_update_clip, DpSgdConfig.max_examples, self.train_layers)

    @property
    def rule(self) -> DecisionRule:
        """The canary rollout's decision rule (DecisionRule checks alpha and margin)."""
        return DecisionRule(float(self.rollout_alpha), float(self.rollout_margin))

    @property
    def classes(self) -> list[str]:
        return [c for c in self.sim_classes.split(",") if c]


def key_of(f: dataclasses.Field) -> str:
    return f.name.replace("_", "-")


KEYS = tuple(key_of(f) for f in dataclasses.fields(RunConfig))
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no", "")


def _coerce(f: dataclasses.Field, key: str, value: Any) -> Any:
    kind = {"str": str, "int": int, "float": float, "bool": bool}[str(f.type)]
    if kind is bool:
        text = str(value).lower()
        if isinstance(value, bool) or text in _TRUE + _FALSE:
            return value if isinstance(value, bool) else text in _TRUE
        raise RunConfigError(f"run-config {key!r} must be true or false, got {value!r}")
    if kind is str:
        if not isinstance(value, str):
            raise RunConfigError(f"run-config {key!r} must be a string, got {value!r}")
        return value
    if (isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
            or (kind is int and value != int(value))):
        raise RunConfigError(f"run-config {key!r} must be {'an integer' if kind is int else 'a number'}, "
                             f"got {value!r}")
    out = kind(value)
    if f.metadata["positive"] and not out > 0:
        raise RunConfigError(f"run-config {key!r} must be > 0, got {value!r}")
    if f.metadata["min"] is not None and not out >= f.metadata["min"]:
        raise RunConfigError(f"run-config {key!r} must be >= {f.metadata['min']}, got {value!r}")
    return out


def markdown_table() -> str:
    """The run-config table of ``docs/fleet.md`` (a test keeps the two identical)."""
    rows = ["| key | default | scope | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(RunConfig):
        default = f.default
        shown = '`""`' if default == "" else f"`{str(default).lower() if isinstance(default, bool) else default}`"
        rows.append(f"| `{key_of(f)}` | {shown} | {f.metadata['scope']} | {f.metadata['doc']} |")
    return "\n".join(rows)
