"""The coordinator's Flower ServerApp: thin glue from a Grid to :func:`.runs.drive_run`.

The run config (``[tool.flwr.app.config]`` plus ``flwr run --run-config``) is parsed into
:class:`.config.RunConfig`, the one table of keys and defaults. Progress goes through Flower's logger
(:class:`.progress.ProgressLog`), so ``flwr run --stream`` shows every stage of the run.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from functools import partial
from typing import Any

from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from . import messages
from .config import RunConfig
from .exchange import Reply, Request
from .progress import ProgressLog
from .rounds import Event
from .runs import drive_run


CONTENT = {  # request kind -> (message content from config, bundle and delta, Flower message type)
    "info": (lambda config, bundle, delta: messages.device_info_request(), messages.DEVICE_INFO),
    "evaluate": (messages.evaluate_request, messages.EVALUATE),
    "train": (messages.train_request, messages.TRAIN),
    "activate": (messages.evaluate_request, messages.ACTIVATE),
}


class GridTransport:
    """:class:`.exchange.Transport` over a Flower Grid; replies are matched by ``reply_to_message_id``.
    ``simulated``: the grid's nodes are simulated devices this process provisioned (names are trusted)."""

    def __init__(self, grid: Grid, simulated: bool = False):
        self.grid, self.simulated = grid, simulated

    def node_ids(self) -> list[int]:
        return list(self.grid.get_node_ids())

    def node_keys(self) -> dict[int, bytes] | None:
        if self.simulated:
            return None
        return {int(n.node_id): bytes(n.public_key) for n in self.grid.get_nodes()}

    def send(self, requests: Sequence[Request]) -> list[str | None]:
        msgs = []
        for r in requests:
            build, mtype = CONTENT[r.kind]
            msgs.append(Message(build(r.config, r.bundle, r.delta), r.node_id, mtype, ttl=r.ttl,
                                group_id=str(r.config.get("round", 0))))
        return [i or None for i in self.grid.push_messages(msgs)]

    def poll(self, handles: Collection[str]) -> list[Reply]:
        out = []
        for m in self.grid.pull_messages(list(handles)):
            handle = m.metadata.reply_to_message_id
            if m.has_error():
                out.append(Reply(handle, False, code=int(m.error.code), reason=m.error.reason or ""))
            else:
                out.append(Reply(handle, True, messages.reply_payload(m), update=partial(messages.reply_arrays, m)))
        return out


def run_coordinator(grid: Grid, run_config: Mapping[str, Any], on_event: Event | None = None) -> int:
    """Parse the run config and drive one run (or resume one) over ``grid``; return the run id."""
    cfg = RunConfig.from_mapping(run_config)
    return drive_run(GridTransport(grid, simulated=bool(cfg.sim_fleet_dir)), cfg, on_event or ProgressLog())


def make_server_app(overrides: Mapping[str, Any] | None = None, on_event: Event | None = None,
                    wrap: Callable[[Grid], Grid] | None = None) -> ServerApp:
    """A ServerApp whose run config is ``context.run_config`` with ``overrides`` on top (simulation factories);
    ``wrap``: what the coordinator sees of the grid (a simulation's, that Ctrl-C cuts off)."""
    overrides = dict(overrides or {})
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        run_coordinator(wrap(grid) if wrap else grid, {**context.run_config, **overrides}, on_event)

    return app


app = make_server_app()
