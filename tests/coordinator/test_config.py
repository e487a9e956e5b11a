"""RunConfig is the one table of run-config defaults: pyproject.toml and docs/fleet.md agree with it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from cuvil.coordinator.config import KEYS, RunConfig, RunConfigError, markdown_table

REPO = Path(__file__).resolve().parents[2]


def test_pyproject_declares_exactly_the_runconfig_defaults():
    table = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert list(table) == list(KEYS)
    expected = RunConfig().as_run_config()
    for key, value in table.items():
        assert value == expected[key] and type(value) is type(expected[key]), key


def test_docs_table_is_the_runconfig_table():
    doc = (REPO / "docs" / "fleet.md").read_text()
    assert markdown_table() in doc
    # every key appears in the table once, nowhere else as a table row
    rows = [line for line in doc.splitlines() if line.startswith("| `")]
    assert sorted(r.split("`")[1] for r in rows if r.split("`")[1] in KEYS) == sorted(KEYS)


def test_run_config_parses_flower_values_and_refuses_bad_ones():
    cfg = RunConfig.from_mapping({"num-rounds": 3, "round-timeout": 5, "sim-shared-cache": "true", "bundle": "m.cuvil"})
    assert (cfg.num_rounds, cfg.round_timeout, cfg.sim_shared_cache, cfg.bundle) == (3, 5.0, True, "m.cuvil")
    assert isinstance(cfg.round_timeout, float)
    for bad, word in (({"num-round": 2}, "unknown"), ({"num-rounds": 0}, ">= 1"), ({"num-rounds": 1.5}, "integer"),
                      ({"round-timeout": 0}, "> 0"), ({"round-timeout": float("nan")}, "number"),
                      ({"bundle": 3}, "string"), ({"sim-shared-cache": "maybe"}, "true or false"),
                      ({"dp-sigma": True}, "number")):
        with pytest.raises(RunConfigError, match=word):
            RunConfig.from_mapping(bad)


def test_resume_keeps_what_the_run_measures_and_takes_new_operational_knobs():
    stored = RunConfig(bundle="a.cuvil", num_rounds=3, dp_sigma=12.0, round_timeout=60.0).as_run_config()
    now = RunConfig(bundle="other.cuvil", num_rounds=1, round_timeout=5.0, poll_interval=0.2)
    got = now.resumed_from(stored)
    assert (got.bundle, got.num_rounds, got.dp_sigma) == ("a.cuvil", 3, 12.0)
    assert (got.round_timeout, got.poll_interval) == (5.0, 0.2)


def test_the_whole_config_is_checked_when_built_not_when_a_stage_starts():
    for bad, word in (({"rollout-alpha": 0.7}, "alpha"), ({"rollout-margin": 1.0}, "margin"),
                      ({"train-sample-rate": 1.5}, "sample_rate"), ({"train-noise-multiplier": 0.1}, "noise_multiplier"),
                      ({"canary-fraction": 1.5}, "canary-fraction"), ({"train-rounds": 2}, "signing-key")):
        with pytest.raises(RunConfigError, match=word):
            RunConfig.from_mapping({"bundle": "m.cuvil", **bad})
    ok = RunConfig.from_mapping({"train-rounds": 2, "signing-key": "k.pem", "rollout-alpha": 0.1, "canary-fraction": 1})
    assert (ok.rule.alpha, ok.dp_sgd.steps) == (0.1, RunConfig.train_steps)
    with pytest.raises(RunConfigError, match="alpha"):
        ok.replace(rollout_alpha=0.5)
