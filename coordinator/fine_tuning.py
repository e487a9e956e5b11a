"""Federated DP fine-tuning: training rounds on the devices that can train, Flower's FedAvg, a signed version.

Each round sends the current weights as a bundle signed by the coordinator's key (pushed only to
devices that do not hold it) to every device whose inventory says it can train and whose budget is
not spent; each device runs DP-SGD on its own data and returns its clipped update. Flower's FedAvg
(:func:`.fedavg.fedavg`) averages the stored updates by their noisy counts; the result, signed, is the
next round's weights. After the last round it is the next version, with its lineage (parent, rounds,
devices, the largest ε a contributing device had spent), written beside the parent bundle and
recorded in the results store. Rounds are stored like evaluation rounds, so a resumed run re-derives
the same weights (FedAvg and signing are deterministic) and asks only the devices that had not replied.
"""

from __future__ import annotations

from pathlib import Path

from ..compiler.atomic_file import atomic_write
from ..compiler.bundle import Lineage
from ..edge_runtime.training import DpSgdConfig
from .device_train import config_keys
from .fedavg import FineTuningError, apply_update, fedavg, mint_version, next_version
from .rounds import BundleRef, Coordinator
from .update_check import UpdateBounds, check_arrays


def trainers(coord: Coordinator) -> list[str]:
    """Devices that report they can train and have not refused for budget under this run's dataset."""
    exhausted = coord.store.exhausted_devices(coord.cfg.dataset)
    return sorted(v.device_id for v in coord.devices.values()
                  if v.can_train and v.device_id not in exhausted)


def fine_tune(coord: Coordinator, start: BundleRef, first_number: int, rounds: int, dp: DpSgdConfig,
              key_path: str, out_dir: Path) -> BundleRef:
    """``rounds`` training rounds numbered from ``first_number``; the signed next version of ``start``."""
    if not key_path:
        raise FineTuningError("fine-tuning signs its result: set run config 'signing-key'")
    current, contributors, epsilon, delta = start, set(), 0.0, 0.0
    asks = config_keys(dp)
    bounds = UpdateBounds.of_request(asks)
    for r in range(1, rounds + 1):
        coord.refresh()
        asked = trainers(coord)
        if not asked:
            raise FineTuningError("no device in the fleet can train (torch, opacus and memory; budget left)")
        number = first_number + r - 1
        coord.evaluate_round(current, number, "train", asked, message="train", extra=asks)
        stored = coord.store.updates(coord.store.find_round(coord.run_id, number, "train")["id"], with_arrays=True)
        graph = current.graph()
        updates = _usable(coord, number, stored, graph, bounds)
        average = fedavg(number, updates)
        contributors |= {u["device_id"] for u in updates}
        epsilon = max([epsilon, *(u["epsilon_spent"] for u in updates)])
        delta = max([delta, *(u["metrics"]["dp_delta"] for u in updates)])
        final = r == rounds
        version = next_version(start.version) + ("" if final else f"-round{r}")
        lineage = Lineage(start.content_hash, start.version, r, len(contributors), f"{epsilon:.4f}", f"{delta:g}")
        current = mint_version(apply_update(graph, average), start.name, version, lineage, key_path)
        path = ""
        if final:
            out = out_dir / f"{start.name}-v{version}.cuvil"
            with atomic_write(out) as f:
                f.write(current.data)
            path = str(out)
        coord.store.add_version(current.content_hash, start.name, version, start.content_hash, coord.run_id, r,
                                len(contributors), epsilon, delta, lineage.method, path)
        coord.emit("version", model=current.label, rounds=r, devices=len(contributors), epsilon=epsilon,
                   updates=len(updates), final=final, path=path)
    return current


def _usable(coord: Coordinator, number: int, stored: list[dict], graph, bounds: UpdateBounds) -> list[dict]:
    """The stored updates FedAvg can average: a store written by an older Cuvil may hold updates that
    today's check refuses (some trained weights only), which made Flower's FedAvg abort the resumed run."""
    usable = []
    for u in stored:
        try:
            check_arrays(u["arrays"], graph, bounds)
        except ValueError as e:
            coord.emit("skipped_update", round=number, device=u["device_id"], reason=str(e))
            continue
        usable.append(u)
    return usable
