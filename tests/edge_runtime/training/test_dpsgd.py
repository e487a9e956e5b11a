"""A device's DP-SGD round against Opacus' own ``make_private`` for the same seeds, and its update clip."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cuvil.edge_runtime.training import DpSgdConfig, TrainingError
from cuvil.edge_runtime.training.dpsgd import clip_update, dp_sgd_rdp, fine_tune

from .helpers import cnn_graph, digits_like, reference_model


def _opacus_reference(graph, x, y, cfg: DpSgdConfig, seeds: tuple[int, int]) -> dict[str, np.ndarray]:
    """What PrivacyEngine.make_private does with a loader whose batch size gives the same sampling rate."""
    import torch
    from opacus import PrivacyEngine

    model = reference_model(graph).train()
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y)),
                                         batch_size=cfg.batch_size)
    assert 1 / len(loader) == pytest.approx(cfg.sample_rate) and len(x) * cfg.sample_rate == cfg.batch_size
    model, optimizer, loader = PrivacyEngine(accountant="rdp").make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=cfg.learning_rate), data_loader=loader,
        noise_multiplier=cfg.noise_multiplier, max_grad_norm=cfg.max_grad_norm,
        noise_generator=torch.Generator().manual_seed(seeds[1]))
    torch.manual_seed(seeds[0])  # make_private's Poisson sampler draws from torch's default generator
    steps = 0
    while steps < cfg.steps:
        for xb, yb in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            optimizer.step()
            steps += 1
            if steps == cfg.steps:
                break
    return {k.removeprefix("_module."): (p.detach() - before[k.removeprefix("_module.")]).numpy()
            for k, p in model.named_parameters()}


def test_a_round_matches_opacus_make_private_for_the_same_seeds():
    import torch

    graph = cnn_graph(seed=3)
    x, y = digits_like(200, seed=4)
    cfg = DpSgdConfig(sample_rate=0.1, noise_multiplier=1.1, steps=6, max_grad_norm=0.7, learning_rate=0.3,
                      batch_size=20, update_clip=1e6, max_examples=len(x))  # no padding rows: the same draws
    mine = fine_tune(graph, x, y, cfg, (torch.Generator().manual_seed(11), torch.Generator().manual_seed(12)))
    ref = _opacus_reference(graph, x, y, cfg, (11, 12))
    assert sorted(mine.update) == sorted(ref)
    for name, value in ref.items():
        assert np.abs(value).max() > 1e-4  # the step moved every weight (noise alone would)
        np.testing.assert_allclose(mine.update[name], value, rtol=1e-4, atol=1e-6, err_msg=name)
    other = fine_tune(graph, x, y, cfg, (torch.Generator().manual_seed(11), torch.Generator().manual_seed(13)))
    assert not np.allclose(other.update["fc.weight"], ref["fc.weight"], atol=1e-4)  # the noise is really there


def _seeded(a: int, b: int) -> tuple:
    import torch

    return torch.Generator().manual_seed(a), torch.Generator().manual_seed(b)


def test_an_example_whose_gradient_is_not_finite_counts_as_a_padding_row():
    """One record that overflows the model must not turn the round into an error reply (a bit about that
    record outside the noise): its gradient is zeroed as a padding row's, so the update is the same bits
    as the round without it, whose row is padding then."""
    graph = cnn_graph(seed=3)
    x, y = digits_like(10, seed=4)
    cfg = DpSgdConfig(sample_rate=0.5, steps=4, batch_size=8, max_examples=16, update_clip=1e6)
    poison = np.concatenate([x, np.full((1, *x.shape[1:]), np.inf, np.float32)])
    with_it = fine_tune(graph, poison, np.concatenate([y, y[:1]]), cfg, _seeded(5, 6))
    without = fine_tune(graph, x, y, cfg, _seeded(5, 6))
    assert with_it.examples == 11 and without.examples == 10
    for name, value in without.update.items():
        assert np.isfinite(value).all() and np.abs(value).max() > 0
        np.testing.assert_array_equal(with_it.update[name], value, err_msg=name)


def test_a_device_with_no_examples_releases_noise_not_an_error():
    graph = cnn_graph(seed=3)
    x, y = digits_like(4, seed=4)
    out = fine_tune(graph, x[:0], y[:0], DpSgdConfig(sample_rate=0.5, steps=3, batch_size=4, max_examples=8))
    assert out.examples == 0 and all(np.isfinite(v).all() and np.abs(v).max() > 0 for v in out.update.values())


def test_records_of_another_shape_are_refused_whatever_their_number():
    """The check reads the records' shape, never their number: an empty dataset of the wrong shape is refused
    as a full one is (before, reshaping zero records always worked, so the reply told n = 0 from n >= 1)."""
    from cuvil.edge_runtime.training.dpsgd import prepare

    graph = cnn_graph(seed=3)
    for n in (0, 3):
        with pytest.raises(TrainingError, match="does not match the model's input"):
            prepare(graph, np.zeros((n, 5), np.float32).shape[1:])


def test_without_seeds_two_rounds_draw_different_noise():
    graph = cnn_graph(seed=3)
    x, y = digits_like(60, seed=4)
    cfg = DpSgdConfig(sample_rate=0.2, steps=2, batch_size=12, train_layers=1)
    a, b = fine_tune(graph, x, y, cfg), fine_tune(graph, x, y, cfg)
    assert sorted(a.update) == ["fc.bias", "fc.weight"]  # train_layers=1: only the last layer moves
    assert not np.array_equal(a.update["fc.weight"], b.update["fc.weight"])


def test_the_update_is_clipped_to_its_bound_and_a_non_finite_one_refused():
    big = {"w": np.full((3, 4), 2.0, np.float32), "b": np.full(5, -2.0, np.float32)}
    out = clip_update(big, 1.5, 7)
    total = math.sqrt(sum(float(np.sum(v.astype(np.float64) ** 2)) for v in out.update.values()))
    assert total == pytest.approx(1.5, rel=1e-6) and out.norm == pytest.approx(math.sqrt(17 * 4))
    small = clip_update({"w": np.full(2, 0.1, np.float32)}, 1.5, 7)
    np.testing.assert_array_equal(small.update["w"], np.full(2, 0.1, np.float32))
    with pytest.raises(TrainingError, match="not finite"):
        clip_update({"w": np.array([np.nan], np.float32)}, 1.0, 1)


def test_the_round_rdp_is_the_subsampled_gaussian_that_dp_accounting_composes():
    dp = pytest.importorskip("dp_accounting")
    orders = (1.25, 1.5, 2.0, 3.0, 4.0, 8.0, 16.0, 32.0, 64.0, 256.0)
    cfg = DpSgdConfig(sample_rate=0.05, noise_multiplier=1.5, steps=30)
    acc = dp.rdp.RdpAccountant(list(orders))
    acc.compose(dp.SelfComposedDpEvent(dp.PoissonSampledDpEvent(0.05, dp.GaussianDpEvent(1.5)), 30))
    mine, theirs = np.array(dp_sgd_rdp(cfg, orders)), np.array(acc._rdp)
    integer = np.array([float(a).is_integer() for a in orders])
    np.testing.assert_allclose(mine[integer], theirs[integer], rtol=1e-9)
    # fractional orders: Opacus sums the signed series of Mironov et al. (2019, sec. 3.3) exactly,
    # dp-accounting adds every term's magnitude: an upper bound, so never below ours
    assert np.all(mine[~integer] <= theirs[~integer] * (1 + 1e-9)) and np.all(mine[~integer] > 0.5 * theirs[~integer])
    assert dp_sgd_rdp(DpSgdConfig(sample_rate=0.05, steps=60), orders)[5] == pytest.approx(2 * mine[5])


@pytest.mark.parametrize("field,value", [("sample_rate", 0.0), ("sample_rate", 1e-300), ("sample_rate", 1.5),
                                         ("noise_multiplier", 0.1),
                                         ("steps", 0), ("steps", 2.5), ("steps", 10**400),
                                         ("learning_rate", float("nan")),
                                         ("batch_size", True), ("update_clip", float("inf")), ("max_examples", "5")])
def test_a_config_out_of_range_is_refused(field, value):
    with pytest.raises(TrainingError, match=field):
        DpSgdConfig(**{field: value})


def test_a_round_runs_on_one_torch_thread_and_leaves_the_process_setting_alone():
    import torch

    from cuvil.edge_runtime.training.dpsgd import one_thread, warm_up

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
        warm_up()  # a toy DP-SGD step: imports and lazy set-up, and the setting is restored
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
