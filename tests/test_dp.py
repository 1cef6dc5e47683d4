"""The DP building blocks: clipping, Gaussian noise, sparsification, SAM, BLUR, the RDP accountant."""

import math

import numpy as np
import pytest
import torch
from helpers import begin_server

from trustformer.core.accounting import epsilon_after, solve_noise_multiplier
from trustformer.core.dp import (
    check_sparse,
    clip_by_global_norm,
    flatten,
    global_norm,
    keep_count,
    noise_generator,
    noised_mean,
    sparse_noised_mean,
    top_k_sparsify,
    unflatten,
)
from trustformer.core.local_rules import blur_penalty, sam_perturbation, sam_step


def _update(seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(40, 30, generator=g) * scale, "b": torch.randn(30, generator=g) * scale}


# ------------------------------------------------------------------------------------- clipping


@pytest.mark.parametrize("clip_norm", [0.5, 3.0, 100.0])
def test_clipping_bounds_the_update_norm_exactly(clip_norm):
    update = _update(1, scale=0.5)  # ‖Δ‖ ≈ 0.5·sqrt(1230) ≈ 17.5
    norm = global_norm(update)
    clipped, before = clip_by_global_norm(update, clip_norm)
    assert before == pytest.approx(norm)
    assert global_norm(clipped) == pytest.approx(min(norm, clip_norm), rel=1e-6)
    assert global_norm(clipped) <= clip_norm * (1 + 1e-6)
    if norm <= clip_norm:
        assert all(torch.equal(clipped[n], update[n]) for n in update)  # untouched below the bound
    else:  # same direction, scaled as a whole (not tensor by tensor)
        ratio = clipped["a"] / update["a"]
        assert torch.allclose(ratio, torch.full_like(ratio, clip_norm / norm), rtol=1e-5)
        assert torch.allclose(clipped["b"] / update["b"], torch.full_like(update["b"], clip_norm / norm), rtol=1e-5)


def test_server_clips_again_and_divides_by_the_fixed_denominator():
    big, small = _update(2, scale=10.0), _update(3, scale=1e-3)
    mean = noised_mean([big, small], clip_norm=1.0, noise_multiplier=0.0, denominator=4.0, generator=noise_generator(0))
    expected = {n: (big[n].double() / global_norm(big) + small[n].double()) / 4.0 for n in big}
    for n in big:
        assert torch.allclose(mean[n].double(), expected[n], atol=1e-7)


# ---------------------------------------------------------------------------------------- noise


def test_noise_has_the_configured_standard_deviation():
    """Server noise N(0, σ²C²) on the sum, divided by qN: the mean update of zero updates has
    std σC/(qN). 400k coordinates: the sample std is within 0.4% (3.5 standard errors) of it."""
    sigma, clip, n_clients = 1.7, 0.5, 3
    zeros = [{"w": torch.zeros(400, 1000)} for _ in range(n_clients)]
    mean = noised_mean(
        zeros, clip_norm=clip, noise_multiplier=sigma, denominator=float(n_clients), generator=noise_generator()
    )["w"].double()
    target = sigma * clip / n_clients
    n = mean.numel()
    assert float(mean.std()) == pytest.approx(target, rel=3.5 / math.sqrt(2 * n))
    assert abs(float(mean.mean())) < 4 * target / math.sqrt(n)
    # Gaussian shape: about 68.27% of the samples within one standard deviation
    assert float((mean.abs() < target).double().mean()) == pytest.approx(0.6827, abs=0.003)


def test_noise_comes_from_os_randomness_and_sparse_noise_stays_on_kept_coordinates():
    zeros = [{"w": torch.zeros(1000)}]
    a = noised_mean(zeros, clip_norm=1.0, noise_multiplier=1.0, denominator=1.0, generator=noise_generator())
    b = noised_mean(zeros, clip_norm=1.0, noise_multiplier=1.0, denominator=1.0, generator=noise_generator())
    assert not torch.equal(a["w"], b["w"])  # two generators from the OS's randomness: different noise
    # only an explicit seed (privacy.noise_source = "seeded-not-private") reproduces it
    c = noised_mean(zeros, clip_norm=1.0, noise_multiplier=1.0, denominator=1.0, generator=noise_generator(7))
    d = noised_mean(zeros, clip_norm=1.0, noise_multiplier=1.0, denominator=1.0, generator=noise_generator(7))
    assert torch.equal(c["w"], d["w"])

    dim, sigma, clip = 10_000, 2.0, 0.25
    updates = [(torch.arange(0, 4000, 2), torch.zeros(2000)), (torch.arange(1000, 5000, 4), torch.zeros(1000))]
    union, values = sparse_noised_mean(
        updates, dim, clip_norm=clip, noise_multiplier=sigma, denominator=2.0, generator=noise_generator()
    )
    expected_union = torch.unique(torch.cat([u for u, _ in updates]))
    assert torch.equal(union, expected_union)  # noise only where some client kept a coordinate
    assert float(values.double().std()) == pytest.approx(sigma * clip / 2.0, rel=0.05)
    none, dense = sparse_noised_mean(
        updates,
        dim,
        clip_norm=clip,
        noise_multiplier=sigma,
        denominator=2.0,
        generator=noise_generator(),
        noise_on="dense",
    )
    assert none is None and dense.shape == (dim,) and int((dense == 0).sum()) == 0


def _dp_run(tmp_path, name, **overrides):
    """A one-round dp-fedavg run on tiny (seed 0) through the Flower apps; returns its summary, the
    aggregate every client received and the clipped updates the clients sent."""
    from trustformer.app import client_app
    from trustformer.config import load_config
    from trustformer.engine.inprocess import run_in_process

    seen = {"aggregate": [], "updates": {}}

    def capture(message, context):
        reply = client_app(message, context)
        kind = message.metadata.message_type
        if kind == "train.apply":
            seen["aggregate"].append(
                {
                    k: torch.from_numpy(message.content["aggregate"][k].numpy().copy())
                    for k in message.content["aggregate"]
                }
            )
        elif kind == "train" and "payload" in reply.content:
            seen["updates"][context.node_config["partition-id"]] = {
                k: torch.from_numpy(reply.content["payload"][k].numpy().copy()) for k in reply.content["payload"]
            }
        return reply

    values = {
        "out": str(tmp_path / name),
        "runtime.progress": False,
        "federation.rounds": 1,
        "federation.strategy": "dp-fedavg",
        "eval.bleu_size": 2,
        "eval.meteor": False,
        "eval.bertscore": False,
    }
    values.update(overrides)
    summary = run_in_process(load_config("tiny", None, values), client_app=capture)
    return summary, seen


def test_two_runs_with_the_same_seed_draw_different_noise_that_no_client_can_recompute(tmp_path):
    """The run seed travels to every client: noise derived from it could be regenerated and removed,
    giving away the sum of the other clients' updates. By default it comes from the OS's randomness."""
    from trustformer.tasks.translation_workload import derive_seed

    first, seen1 = _dp_run(tmp_path, "a")
    second, seen2 = _dp_run(tmp_path, "b")
    assert first["seed"] == second["seed"] == 0
    assert first["privacy"]["noise_source"] == "os" and first["privacy"]["private"] is True
    name = next(iter(seen1["aggregate"][0]))
    # the clients' (clipped) updates are the same in both runs: only the noise differs
    assert all(torch.equal(seen1["updates"][c][name], seen2["updates"][c][name]) for c in range(3))
    assert not torch.equal(seen1["aggregate"][0][name], seen2["aggregate"][0][name])
    # a client that knows the seed regenerates "the noise" the old code drew: it is not the noise added
    sigma, clip, n = first["privacy"]["noise_multiplier"], first["privacy"]["clip_norm"], 3
    total = sum(seen1["updates"][c][name].double() for c in range(3))
    noise = seen1["aggregate"][0][name].double() * n - total  # what the server added, exactly
    guess = noised_mean(
        [{k: torch.zeros_like(v) for k, v in seen1["aggregate"][0].items()}],
        clip_norm=clip,
        noise_multiplier=sigma,
        denominator=1.0,
        generator=noise_generator(derive_seed(0, "dp-noise", 1)),
    )[name].double()
    assert float((noise - guess).norm()) > 0.5 * float(noise.norm())
    assert float(noise.std()) == pytest.approx(sigma * clip, rel=0.2)  # it is the configured noise


def test_seeded_not_private_noise_is_reproducible_and_says_so(tmp_path):
    options = {"privacy.noise_source": "seeded-not-private"}
    first, seen1 = _dp_run(tmp_path, "a", **options)
    second, seen2 = _dp_run(tmp_path, "b", **options)
    assert all(torch.equal(seen1["aggregate"][0][k], seen2["aggregate"][0][k]) for k in seen1["aggregate"][0])
    assert first["privacy"]["noise_source"] == "seeded-not-private" and first["privacy"]["private"] is False


def test_client_sampling_comes_from_os_randomness():
    """Poisson sampling with the same seed twice: different choices (40 rounds × 3 clients at q = 0.5:
    equal by chance with probability 2^-120); the seeded mode repeats them."""
    from trustformer.config import load_config
    from trustformer.protocols import get_protocol

    def choices(source):
        cfg = load_config(
            "tiny",
            None,
            {
                "federation.strategy": "dp-fedavg",
                "federation.rounds": 40,
                "privacy.sampling_rate": 0.5,
                "privacy.on_exceed": "continue",
                "privacy.noise_source": source,
            },
        )
        protocol = begin_server(get_protocol(cfg), {"w": torch.zeros(1)})
        return [tuple(protocol.participants(r, [0, 1, 2], True).clients) for r in range(1, 41)]

    assert choices("os") != choices("os")
    assert choices("seeded-not-private") == choices("seeded-not-private")


def test_seeded_noise_is_drawn_for_the_round_the_release_is_of(tmp_path):
    """With ``noise_source = "seeded-not-private"`` each round's noise comes from the run seed and the round handed
    to ``aggregate``: the same round again gives the same release, another round other noise (noise repeated across
    rounds would cancel in the difference of two releases)."""
    from trustformer.config import load_config
    from trustformer.protocols import get_protocol

    cfg = load_config(
        "tiny",
        None,
        {
            "out": str(tmp_path),
            "federation.strategy": "dp-fedavg",
            "privacy.noise_source": "seeded-not-private",
            "privacy.noise_multiplier": 1.0,
            "privacy.on_exceed": "continue",
        },
    )
    protocol = begin_server(get_protocol(cfg), {"w": torch.zeros(50)})
    zeros = [{"w": torch.zeros(50)} for _ in range(3)]
    release = {rnd: protocol.aggregate(rnd, zeros, [1, 1, 1]).tensors["w"] for rnd in (1, 2)}
    assert torch.equal(protocol.aggregate(1, zeros, [1, 1, 1]).tensors["w"], release[1])
    assert not torch.allclose(release[1], release[2])


# ------------------------------------------------------------------------------- sparsification


@pytest.mark.parametrize("dim, keep, expected", [(1000, 0.1, 100), (1001, 0.1, 101), (7, 0.01, 1), (50, 1.0, 50)])
def test_sparsification_keeps_exactly_the_configured_count(dim, keep, expected):
    assert keep_count(dim, keep) == expected
    flat = torch.randn(dim, generator=torch.Generator().manual_seed(dim))
    indices, values = top_k_sparsify(flat, keep_count(dim, keep))
    assert indices.numel() == values.numel() == expected
    assert torch.equal(indices, torch.unique(indices))  # sorted, no repeats
    largest = set(torch.argsort(flat.abs(), descending=True)[:expected].tolist())
    assert set(indices.tolist()) == largest
    assert torch.equal(values, flat[indices])
    check_sparse(indices.to(torch.int32), values, dim)


def test_sparsification_with_ties_still_keeps_the_count_and_encoding_is_checked():
    indices, _ = top_k_sparsify(torch.ones(100), 30)
    assert indices.numel() == 30
    with pytest.raises(ValueError, match="increasing"):
        check_sparse(torch.tensor([3, 1]), torch.zeros(2), 10)
    with pytest.raises(ValueError, match=r"\[0, 10\)"):
        check_sparse(torch.tensor([1, 10]), torch.zeros(2), 10)


def test_flatten_round_trip():
    update = _update(5)
    back = unflatten(flatten(update), update)
    assert all(torch.equal(back[n], update[n]) for n in update)


# ------------------------------------------------------------------------------------------ SAM


def test_sam_step_on_a_quadratic_matches_the_closed_form():
    """f(w) = ½ wᵀAw: g = Aw, ε̂ = ρ g/‖g‖, w' = w − η A(w + ε̂) (plain SGD as the base step)."""
    a = torch.tensor([[2.0, 0.5], [0.5, 1.0]], dtype=torch.float64)
    w0 = torch.tensor([1.0, -3.0], dtype=torch.float64)
    rho, lr = 0.3, 0.1
    w = torch.nn.Parameter(w0.clone())
    optimizer = torch.optim.SGD([w], lr=lr)
    loss = sam_step([w], lambda: 0.5 * w @ a @ w, optimizer, rho)

    g = a @ w0
    e = rho * g / torch.linalg.norm(g)
    expected = w0 - lr * (a @ (w0 + e))
    assert torch.allclose(w.detach(), expected, atol=1e-12)
    assert float(loss) == pytest.approx(float(0.5 * w0 @ a @ w0))  # the loss reported is at w, not w + ε̂
    # a plain gradient step would land elsewhere: the perturbation matters
    assert not torch.allclose(w.detach(), w0 - lr * g, atol=1e-3)


def test_sam_perturbation_has_norm_rho_over_all_tensors():
    grads = [torch.tensor([3.0, 0.0]), None, torch.tensor([[0.0, 4.0]])]
    e = sam_perturbation(grads, rho=2.0)
    assert e[1] is None
    assert math.sqrt(float(e[0].pow(2).sum() + e[2].pow(2).sum())) == pytest.approx(2.0)
    assert torch.allclose(e[0], torch.tensor([1.2, 0.0])) and torch.allclose(e[2], torch.tensor([[0.0, 1.6]]))


# ----------------------------------------------------------------------------------------- BLUR


def test_blur_penalty_is_zero_inside_the_bound_and_pulls_back_above_it():
    anchor = [torch.zeros(3)]
    inside = torch.tensor([0.1, 0.2, 0.2], requires_grad=True)  # norm 0.3
    r = blur_penalty([inside], anchor, bound=0.5, lam=2.0)
    r.backward()
    assert float(r.detach()) == 0.0 and torch.equal(inside.grad, torch.zeros(3))

    outside = torch.tensor([3.0, 0.0, 4.0], requires_grad=True)  # norm 5
    r = blur_penalty([outside], anchor, bound=1.0, lam=2.0)
    r.backward()
    assert float(r.detach()) == pytest.approx(0.5 * 2.0 * 4.0**2)
    # ∇R = λ (‖Δ‖ − B) Δ/‖Δ‖
    assert torch.allclose(outside.grad, 2.0 * 4.0 * torch.tensor([3.0, 0.0, 4.0]) / 5.0)


# ------------------------------------------------------------------------------------ accountant

# dp-accounting's RdpAccountant default orders (rdp_privacy_accountant.DEFAULT_RDP_ORDERS)
DEFAULT_ORDERS = [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]


def gaussian_epsilon_closed_form(sigma, releases, delta, orders):
    """Independent computation for q = 1: the Gaussian mechanism's RDP is α/(2σ²) per release
    (Mironov 2017, Cor. 3), composed additively; converted with ε = r + log(1 − 1/α) − log(δα)/(α − 1)
    (Balle et al. 2020, Prop. 12), minimised over the orders."""
    best = math.inf
    for a in orders:
        if a <= 1.01:
            continue
        r = releases * a / (2 * sigma**2)
        best = min(best, r + math.log1p(-1 / a) - math.log(delta * a) / (a - 1))
    return best


@pytest.mark.parametrize(
    "epsilon, delta, q, releases", [(1.0, 1e-3, 1.0, 6), (2.0, 1e-5, 1.0, 20), (1.0, 1e-3, 0.5, 6)]
)
def test_solved_sigma_gives_back_epsilon_through_the_accountant(epsilon, delta, q, releases):
    sigma = solve_noise_multiplier(epsilon, delta, q, releases)
    spent = epsilon_after(sigma, q, releases, delta)
    assert spent <= epsilon + 1e-9  # on the private side of the target...
    assert spent == pytest.approx(epsilon, abs=1e-3)  # ...and tight
    assert epsilon_after(sigma * 0.98, q, releases, delta) > epsilon  # a smaller sigma would overspend
    assert epsilon_after(sigma, q, releases + 1, delta) > spent  # epsilon grows with every round


def test_reported_epsilon_matches_an_independent_computation():
    sigma = solve_noise_multiplier(1.0, 1e-3, 1.0, 6)
    library = epsilon_after(sigma, 1.0, 6, 1e-3)
    assert gaussian_epsilon_closed_form(sigma, 6, 1e-3, DEFAULT_ORDERS) == pytest.approx(library, rel=1e-9)
    dense = np.concatenate([np.arange(1.02, 20, 0.001), np.arange(20, 2000, 0.5)])
    finer = gaussian_epsilon_closed_form(sigma, 6, 1e-3, dense)
    assert finer <= library + 1e-12 and library - finer < 0.01 * library
    # Poisson-sampled releases cost less than full participation with the same sigma
    assert epsilon_after(sigma, 0.5, 6, 1e-3) < library


def test_edge_cases_of_the_accountant():
    assert epsilon_after(0.0, 1.0, 3, 1e-3) == math.inf  # no noise: no privacy
    assert epsilon_after(1.0, 1.0, 0, 1e-3) == 0.0
    assert solve_noise_multiplier(1.0, 1e-3, 1.0, 0) == 0.0


# --------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "overrides, pattern",
    [
        ({"privacy.noise_multiplier": -0.5}, r"privacy\.noise_multiplier = -0\.5 must be >= 0, or -1"),
        ({"privacy.delta": 1.0}, r"privacy\.delta = 1\.0 must be in \(0\.0, 1\.0\)"),
        ({"privacy.clip_norm": 0.0}, r"privacy\.clip_norm = 0\.0 must be > 0"),
        ({"privacy.sampling_rate": 0.0}, r"privacy\.sampling_rate"),
        ({"privacy.on_exceed": "ignore"}, r"privacy\.on_exceed = 'ignore' is not one of: refuse, stop, continue"),
        ({"privacy.lus_keep": 1.5}, r"privacy\.lus_keep"),
    ],
)
def test_privacy_options_are_validated(overrides, pattern):
    from trustformer.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=pattern):
        load_config("tiny", None, overrides)
    defaults = load_config("tiny", None, {"federation.strategy": "dp-fedavg"}).privacy
    assert (defaults.epsilon, defaults.delta, defaults.clip_norm) == (1.0, 1e-3, 0.5)  # the paper's settings
