"""benchmarks/fleet_scale.py's breakdown names functions the device really runs: a profiled evaluate
message through the ClientApp gives every stage time (renaming or moving one of them fails here)."""

from __future__ import annotations

import ast
import cProfile
import importlib.util
import inspect
import pstats
import sys
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from flwr.app import Context, Message, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from cuvil.coordinator import messages  # noqa: E402
from cuvil.coordinator.client_app import make_client_app  # noqa: E402
from cuvil.coordinator.device import DeviceState  # noqa: E402
from cuvil.coordinator.fleet import device_data, host_class  # noqa: E402
from cuvil.coordinator.rounds import BundleRef  # noqa: E402

from ..coordinator.fleet_helpers import make_bundle, make_keys  # noqa: E402

TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "fleet_scale.py"


@pytest.fixture(scope="module")
def fleet_scale():
    spec = importlib.util.spec_from_file_location("fleet_scale_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("fleet_scale_bench", None)


def _defines(where, name: str) -> bool:
    """``where`` (a module or class) holds a function ``name`` in its source, nested ones included."""
    tree = ast.parse(inspect.getsource(where))
    return any(isinstance(n, ast.FunctionDef) and n.name == name for n in ast.walk(tree))


def test_every_named_function_exists_where_the_benchmark_looks(fleet_scale):
    for where, name in [fleet_scale.MESSAGE, *(p for parts in fleet_scale.STAGES.values() for p in parts)]:
        assert _defines(where, name), f"{where.__name__} has no function {name}"


def test_a_profiled_evaluate_message_gives_every_stage_time(fleet_scale, tmp_path):
    keys = make_keys(tmp_path)
    ref = BundleRef.from_file(make_bundle(tmp_path, keys))
    state = DeviceState.provision(tmp_path / "dev", "dev-1", host_class(), [keys.public_path], data=device_data(0, 4))
    ctx = Context(run_id=1, node_id=7, node_config={"state-dir": str(state.root)}, state=RecordDict(), run_config={})
    cfg = {"bundle-hash": ref.content_hash, "dataset": "digits-local", "release-id": "rel-1", "round": 1,
           "latency-runs": 10, "latency-warmup": 2}
    app = make_client_app()
    profiler = cProfile.Profile()
    profiler.enable()
    reply = app(Message(messages.evaluate_request(cfg, ref.data), 7, messages.EVALUATE), ctx)
    profiler.disable()
    assert not reply.has_error()
    split = fleet_scale.stage_split(pstats.Stats(profiler).stats)
    assert set(split) == set(fleet_scale.STAGES)
    assert all(share > 0.0 for share in split.values()), split
    assert sum(split.values()) <= 1.0 + 1e-9
