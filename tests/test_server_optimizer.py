"""Server optimizers (core/server_opt.py, protocols/wrappers/server_optimizer.py; Reddi et al. 2021): SGD at η = 1 is
FedAvg to the last bit, every optimizer's step is Flower's, the moments survive a resume, the optimizer steps with the
DP release and not before it, an owner's step under distributed noise stays linear in its noise share, and the
configuration refuses a protocol whose aggregate is neither a global model nor an update of it."""

from __future__ import annotations

import json
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import Crash, begin_server, crash_at, forget_process, tiny_config

from trustformer.config import ConfigError, load_config
from trustformer.config.sections import SERVER_OPTIMIZER_DEFAULTS
from trustformer.core import server_opt
from trustformer.core.dp import noise_generator, noised_mean
from trustformer.core.shared import derive_seed
from trustformer.engine.inprocess import run_in_process
from trustformer.protocols import make_protocol
from trustformer.protocols.fedavg_topk import FedAvgTopK
from trustformer.protocols.interface.session import ClientSession
from trustformer.protocols.interface.state import declared
from trustformer.protocols.wrappers import server_optimizer as wrapper
from trustformer.protocols.wrappers.server_optimizer import ServerOptimization, chain
from trustformer.registry import PROTOCOLS, protocol_spec
from trustformer.runtime.checkpoint import resume_config
from trustformer.tasks import record_dp

torch.set_num_threads(1)

QUIET = {
    "runtime.progress": False,
    "eval.meteor": False,
    "eval.bertscore": False,
    "eval.bleu_size": 4,
}


tiny = partial(tiny_config, defaults=QUIET)


def losses(cfg) -> list[float]:
    lines = [json.loads(x) for x in Path(cfg.out, "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return [x["test_loss"] for x in lines if "test_loss" in x]


# ------------------------------------------------------------------------------------- sgd at lr 1 is FedAvg


def test_sgd_at_lr_one_is_fedavg_to_the_last_bit_and_wraps_nothing(tmp_path, monkeypatch):
    """The default and an explicit ``sgd`` at η = 1 build no wrapper and run FedAvg's numbers; the wrapper itself at
    η = 1 (forced in) steps x_t + (mean − x_t) and lands on the same bits; η = 0.5 does not."""
    fedavg = tiny(tmp_path / "fedavg", **{"federation.rounds": 2})
    explicit = tiny(
        tmp_path / "sgd", **{"federation.rounds": 2, "federation.server_optimizer": "sgd", "federation.server_lr": 1.0}
    )
    for cfg in (fedavg, explicit):
        assert not any(isinstance(p, ServerOptimization) for p in chain(make_protocol(cfg)))
    reference = run_in_process(fedavg)
    assert run_in_process(explicit)["test_loss"] == reference["test_loss"]
    assert losses(explicit) == losses(fedavg)

    monkeypatch.setattr(server_opt.ServerOptimizer, "identity", property(lambda self: False))
    forced = tiny(
        tmp_path / "forced",
        **{"federation.rounds": 2, "federation.server_optimizer": "sgd", "federation.server_lr": 1.0},
    )
    assert isinstance(make_protocol(forced), ServerOptimization)
    run_in_process(forced)
    assert losses(forced) == losses(fedavg)
    half = tiny(tmp_path / "half", **{"federation.rounds": 2, "federation.server_lr": 0.5})
    run_in_process(half)
    assert losses(half) != losses(fedavg)


# ------------------------------------------------------------------------------------- Flower's strategies


def flower_strategy(name: str, initial: list[np.ndarray]):
    """Flower's strategy for ``name`` with its own defaults (FedAvgM: the momentum this project defaults to)."""
    from flwr.common import ndarrays_to_parameters
    from flwr.server.strategy import FedAdagrad, FedAdam, FedAvgM, FedYogi

    params = ndarrays_to_parameters(initial)
    if name == "momentum":
        return FedAvgM(initial_parameters=params, server_momentum=0.9)
    return {"adam": FedAdam, "yogi": FedYogi, "adagrad": FedAdagrad}[name](initial_parameters=params)


def fit_results(models: list[list[np.ndarray]], sizes: list[int]):
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters

    return [
        (None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(m), n, {}))  # the proxy is not read
        for m, n in zip(models, sizes, strict=True)
    ]


@pytest.mark.parametrize("name", ["adam", "yogi", "adagrad", "momentum"])
def test_each_optimizer_steps_as_flowers_strategy_over_three_rounds(tmp_path, name):
    """The same initial model and the same clients' models each round, float64: FedAdam, FedYogi, FedAdagrad and
    FedAvgM's ``aggregate_fit`` (real FitRes) and this wrapper's aggregate agree to float64 rounding of the mean."""
    from flwr.common import parameters_to_ndarrays

    cfg = tiny(tmp_path, **{"federation.server_optimizer": name, "robust.bound": "none"})
    protocol = make_protocol(cfg)
    assert [type(p).__name__ for p in chain(protocol)] == ["ServerOptimization", "FedAvg"]
    rng = np.random.default_rng(0)
    shapes = {"a": (3, 4), "b": (5,)}
    initial = {n: rng.normal(size=s) for n, s in shapes.items()}
    begin_server(protocol, {n: torch.from_numpy(v) for n, v in initial.items()})
    strategy = flower_strategy(name, list(initial.values()))
    sizes = [30, 10, 20]
    for rnd in (1, 2, 3):
        models = [{n: v + rng.normal(scale=0.1 * rnd, size=v.shape) for n, v in initial.items()} for _ in sizes]
        ours = protocol.aggregate(rnd, [{n: torch.from_numpy(v) for n, v in m.items()} for m in models], sizes).tensors
        theirs, _metrics = strategy.aggregate_fit(rnd, fit_results([list(m.values()) for m in models], sizes), [])
        assert theirs is not None
        for (n, mine), flower in zip(ours.items(), parameters_to_ndarrays(theirs), strict=True):
            np.testing.assert_allclose(mine.numpy(), flower, rtol=1e-12, atol=1e-14, err_msg=f"{name} round {rnd} {n}")
    assert protocol.steps == 3


def test_the_defaults_are_flowers():
    """FedAdam, FedYogi, FedAdagrad's own defaults (FedAvgM's momentum: 0.9, Flower's 0 being FedAvg)."""
    import inspect

    from flwr.server.strategy import FedAdagrad, FedAdam, FedYogi

    for name, cls in (("adam", FedAdam), ("yogi", FedYogi), ("adagrad", FedAdagrad)):
        theirs = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()}
        ours = SERVER_OPTIMIZER_DEFAULTS[name]
        assert ours["lr"] == theirs["eta"] and ours["tau"] == theirs["tau"], name
        if "beta1" in ours:
            assert (ours["beta1"], ours["beta2"]) == (theirs["beta_1"], theirs["beta_2"]), name
    assert tuple(SERVER_OPTIMIZER_DEFAULTS) == server_opt.SERVER_OPTIMIZERS


# ------------------------------------------------------------------------------------- the moments survive a resume

RESUMABLE = {
    **QUIET,
    "federation.rounds": 3,
    "runtime.store": "disk",
    "federation.server_optimizer": "adam",
    "federation.server_lr": 0.05,
}


crash_in_round_three = crash_at("train", 3)  # round 3's first train: the checkpoint is round 2's


def killed_after_round_two_and_resumed(out: Path) -> list[float]:
    stopped = load_config("tiny", None, {**RESUMABLE, "out": str(out)})
    with pytest.raises(Crash):
        run_in_process(stopped, client_app=crash_in_round_three)
    forget_process()  # what a restarted process no longer holds
    resumed = run_in_process(resume_config(stopped.out))
    assert resumed["resumed_after_rounds"] == [2]
    return losses(stopped)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> list[float]:
    cfg = load_config("tiny", None, {**RESUMABLE, "out": str(tmp_path_factory.mktemp("full"))})
    run_in_process(cfg)
    return losses(cfg)


@pytest.mark.parametrize(
    "dropped",
    [
        pytest.param((), id="checkpointed"),
        pytest.param(("first_moment",), id="m_t left out"),
        pytest.param(("second_moment",), id="v_t left out", marks=pytest.mark.slow),
        pytest.param(("steps",), id="t left out", marks=pytest.mark.slow),
        pytest.param(("model",), id="x_t left out", marks=pytest.mark.slow),
        pytest.param("all", id="state_attrs = ()", marks=pytest.mark.slow),
    ],
)
def test_the_moments_survive_a_resume_and_a_state_left_out_is_seen(tmp_path, monkeypatch, uninterrupted, dropped):
    """Killed in round 3 and resumed from round 2's checkpoint: the run FedAdam would have run. Planted bugs: a
    piece of the optimizer's state (or all of it, state_attrs = ()) left out of the checkpoint makes it differ."""
    if dropped:
        state = declared(ServerOptimization, "state_attrs")
        left_out = state if dropped == "all" else dropped
        monkeypatch.setattr(ServerOptimization, "state_attrs", tuple(a for a in state if a not in left_out))
        monkeypatch.setattr(ServerOptimization, "scratch_attrs", (*ServerOptimization.scratch_attrs, *left_out))
    resumed = killed_after_round_two_and_resumed(tmp_path / "stopped")
    assert len(resumed) == len(uninterrupted)
    if dropped:
        assert resumed != uninterrupted, f"{dropped} left out of the checkpoint, and the resume did not show it"
    else:
        assert resumed == uninterrupted


# ------------------------------------------------------------------------------------- DP: it steps with the release


def dp_config(out):
    return tiny(
        out,
        **{
            "federation.strategy": "dp-fedavg",
            "federation.server_optimizer": "adam",
            "privacy.noise_multiplier": 1.0,
            "privacy.noise_source": "seeded-not-private",
            "privacy.on_exceed": "continue",
        },
    )


def optimizer_input(protocol, payloads, monkeypatch) -> dict[str, torch.Tensor] | None:
    """What the server optimizer steps with in round 1 when ``protocol`` aggregates ``payloads`` (None: it never
    stepped)."""
    seen: list[dict[str, torch.Tensor]] = []
    real = wrapper.server_step

    def spy(delta, moments, opt):
        seen.append({n: t.detach().double().clone() for n, t in delta.items()})
        return real(delta, moments, opt)

    monkeypatch.setattr(wrapper, "server_step", spy)
    server = begin_server(protocol, {n: torch.zeros_like(t) for n, t in payloads[0].items()}).server()
    assert server.participants(1, [0, 1, 2], True).clients == [0, 1, 2]
    protocol.aggregate(1, payloads, [1, 1, 1])
    assert len(seen) <= 1
    return seen[0] if seen else None


def plant(monkeypatch, bug: str) -> None:
    """``inside``: the optimizer wrapped inside the DP layer (whose aggregate never calls its inner one, so the
    optimizer never steps). ``unnoised``: the optimizer steps with the mean of the clipped payloads it is given
    instead of the DP release its inner layer returns."""
    from trustformer import protocols
    from trustformer.core.aggregation import weighted_mean
    from trustformer.core.dp import clip_by_global_norm
    from trustformer.protocols import dp_fedavg
    from trustformer.protocols.wrappers.dp import DifferentialPrivacy

    if bug == "inside":
        monkeypatch.setattr(protocols, "with_server_optimizer", lambda protocol: protocol)
        monkeypatch.setattr(
            dp_fedavg,
            "DifferentialPrivacy",
            lambda inner, privacy, spec: DifferentialPrivacy(wrapper.with_server_optimizer(inner), privacy, spec=spec),
        )
        return

    def unnoised(self, rnd, payloads, num_examples):
        release = self.inner.aggregate(rnd, payloads, num_examples)
        clipped = [clip_by_global_norm(p, self.cfg.privacy.clip_norm)[0] for p in payloads]
        return replace(release, tensors=self._update_step(weighted_mean(clipped, [1.0] * len(clipped))))

    monkeypatch.setattr(ServerOptimization, "aggregate", unnoised)


@pytest.mark.parametrize(
    "bug", [None, "inside", "unnoised"], ids=["make_protocol", "planted: inside DP", "planted: unnoised mean"]
)
def test_under_dp_the_optimizer_steps_with_the_noisy_release(tmp_path, monkeypatch, bug):
    """dp-fedavg + adam, seeded noise: the optimizer's input is the DP release (Σ clip(Δ_k) + N(0, σ²C²)) / qN,
    drawn again here from the round's seed, not the mean of the clipped updates. The planted bugs (the optimizer
    inside the DP layer; the optimizer stepping with the unnoised mean) fail this check."""
    if bug:
        plant(monkeypatch, bug)
    cfg = dp_config(tmp_path)
    g = torch.Generator().manual_seed(0)
    payloads = [{"w": torch.randn(50, generator=g), "b": torch.randn(7, generator=g)} for _ in range(3)]
    protocol = make_protocol(cfg)
    seen = optimizer_input(protocol, payloads, monkeypatch)
    p = cfg.privacy
    release = noised_mean(
        payloads,
        clip_norm=p.clip_norm,
        noise_multiplier=p.noise_multiplier,
        denominator=3.0,
        generator=noise_generator(derive_seed(cfg.seed, "dp-noise", 1)),
    )
    clean = noised_mean(payloads, clip_norm=p.clip_norm, noise_multiplier=0.0, denominator=3.0, generator=g)
    assert not all(torch.allclose(release[n], clean[n]) for n in release)  # the noise is there to see
    steps_with_release = seen is not None and all(
        torch.allclose(seen[n], release[n].double(), atol=1e-6) for n in release
    )
    assert steps_with_release is (bug is None)
    if bug is None:
        assert "no ε charged" in protocol.server().server_summary()["server_optimizer"]["privacy"]


# ------------------------------------------------------------------------------------- distributed noise


def small_model():
    """A seq2seq model small enough for a DP-SGD step in milliseconds: the record-DP tests' tiny Transformer."""
    from test_record_dp import _model

    return _model()


def pairs(n: int = 24) -> list[tuple[list[int], list[int]]]:
    """Encoded (source, target) pairs as a translation shard holds them."""
    g = torch.Generator().manual_seed(1)
    return [
        (
            torch.randint(3, 40, (6,), generator=g).tolist() + [2],
            [1, *torch.randint(3, 40, (4,), generator=g).tolist(), 2],
        )
        for _ in range(n)
    ]


REAL_SHARE = record_dp.share


def payload_at(cfg, scale: float, monkeypatch) -> torch.Tensor:
    """An owner's payload (its model after the round's DP-SGD step, FedAvg's payload) with its noise share scaled by
    ``scale``, every random draw the same: the real ``record_dp.train`` of a distributed-noise round."""
    real = REAL_SHARE
    monkeypatch.setattr(
        record_dp, "share", lambda c, dp: replace(real(c, dp), noise_multiplier=scale * real(c, dp).noise_multiplier)
    )
    model = small_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the task's own: left alone by a distributed step
    data = pairs()
    record_dp.train(cfg, model, optimizer, data, seed=7, federation_sizes=(len(data),) * 3)
    monkeypatch.setattr(record_dp, "share", real)
    return torch.cat([p.detach().double().flatten() for p in model.parameters()])


@pytest.mark.parametrize("planted", [False, True], ids=["plain SGD", "planted: the owner steps with Adam"])
def test_under_distributed_noise_an_owners_payload_stays_linear_in_its_noise_share(tmp_path, monkeypatch, planted):
    """With a server optimizer configured, each owner still takes one plain SGD step, so its payload is affine in its
    share of the noise (p(2z) − p(z) = p(z) − p(0)) and the shares add up in the unmasked mean the server's Adam
    steps with. The planted bug, an owner stepping with Adam on its own noisy gradient, breaks that."""
    cfg = tiny(
        tmp_path,
        **{
            "federation.server_optimizer": "adam",
            "privacy.unit": "record",
            "privacy.noise": "distributed",
            "secure.mode": "secagg",
            "privacy.noise_source": "seeded-not-private",
            "privacy.noise_multiplier": 2.0,
            "privacy.on_exceed": "continue",
            "privacy.batch_size": 8,
            "privacy.distributed_lr": 0.5,
            "privacy.checks": False,  # the shares are scaled on purpose, which the every-run checks would stop
        },
    )
    if planted:
        adam = torch.optim.Adam
        monkeypatch.setattr(torch.optim, "SGD", lambda params, lr: adam(params, lr=lr * 0.01))
    p0, p1, p2 = (payload_at(cfg, s, monkeypatch) for s in (0.0, 1.0, 2.0))
    first, second = p1 - p0, p2 - p1
    assert first.norm() > 0
    departure = float((second - first).norm() / first.norm())  # 0 for an affine payload, up to float32 rounding
    assert (departure < 1e-4) is not planted, departure


# ------------------------------------------------------------------------------------- top-k: catch-up follows x_t


def test_a_sparse_update_under_client_sampling_catches_up_to_the_optimizers_model(tmp_path):
    """fedavg-topk + adam + 2 of 3: the steps are dense, and the model a client left out catches up to is the
    initial model plus every step as a client applies it (not top-k's own sum of mean updates)."""
    cfg = tiny(
        tmp_path,
        **{
            "federation.strategy": "fedavg-topk",
            "federation.server_optimizer": "adam",
            "federation.clients_per_round": 2,
            "robust.bound": "none",
        },
    )
    protocol = make_protocol(cfg)
    initial = {"w": torch.linspace(-1, 1, 20)}
    begin_server(protocol, initial)

    class Holder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(initial["w"].clone())

    session = ClientSession(cfg=cfg, client=0, round=1, model=Holder(), num_examples=1, initial_tensors=lambda: initial)
    client = FedAvgTopK(cfg)
    g = torch.Generator().manual_seed(0)
    for rnd in (1, 2):
        payloads = []
        for _ in range(2):
            indices = torch.sort(torch.randperm(20, generator=g)[:4]).values
            payloads.append({"indices": indices.to(torch.int32), "values": torch.randn(4, generator=g)})
        step = protocol.aggregate(rnd, payloads, [1, 1]).tensors
        assert set(step) == {"values"} and step["values"].numel() == 20  # Adam's step is dense
        client.client_apply(session, step)
        protocol.server().exchange_done(rnd, step)
    assert protocol.catching_up().catch_up(2) is None  # a client of round 2 holds x_2 already
    held = protocol.catching_up().catch_up(1)
    assert held is not None and torch.equal(held["w"], session.model.w.detach())


# ------------------------------------------------------------------------------------- refusals


def _task(strategy: str) -> dict:
    tasks = protocol_spec(strategy).tasks
    return {"task": tasks[0], "image.dataset": "digits"} if tasks and "translation" not in tasks else {}


NEITHER = [s for s in PROTOCOLS if protocol_spec(s).aggregate_kind is None]


@pytest.mark.parametrize("strategy", NEITHER)
def test_a_protocol_whose_aggregate_is_neither_a_model_nor_an_update_is_refused(tmp_path, strategy):
    assert {"trustformer", "local", "centralized"} <= set(NEITHER)
    values = {"federation.strategy": strategy, **_task(strategy)}
    tiny(tmp_path, **values)  # FedAvg's own step: accepted
    with pytest.raises(ConfigError, match=r"federation\.server_optimizer = 'adam'.*neither"):
        tiny(tmp_path, **values, **{"federation.server_optimizer": "adam"})
    with pytest.raises(ConfigError, match=r"federation\.server_optimizer = 'sgd' \(server_lr 0\.5\)"):
        tiny(tmp_path, **values, **{"federation.server_lr": 0.5})


@pytest.mark.parametrize(
    "values, says",
    [
        ({"federation.server_optimizer": "lamb"}, "federation.server_optimizer = 'lamb' is not one of"),
        (
            {"federation.server_optimizer": "adam", "federation.server_momentum": 0.5},
            "server_momentum = 0.5 is not read",
        ),
        ({"federation.server_optimizer": "adagrad", "federation.server_beta1": 0.5}, "server_beta1 = 0.5 is not read"),
        ({"federation.server_optimizer": "sgd", "federation.server_tau": 0.5}, "server_tau = 0.5 is not read"),
        ({"federation.server_optimizer": "yogi", "federation.server_beta2": 1.0}, r"server_beta2 = 1.0 must be in"),
        ({"federation.server_optimizer": "momentum", "federation.server_momentum": -0.1}, "server_momentum = -0.1"),
        ({"federation.server_lr": 0.0}, "server_lr = 0.0 must be > 0"),
        ({"federation.server_optimizer": "adam", "federation.server_tau": 0.0}, "server_tau = 0.0 must be > 0"),
    ],
)
def test_hyperparameters_are_checked_naming_the_option(tmp_path, values, says):
    with pytest.raises(ConfigError, match=says):
        tiny(tmp_path, **values)


def test_given_hyperparameters_replace_the_defaults_and_the_summary_names_them(tmp_path):
    cfg = tiny(tmp_path, **{"federation.server_optimizer": "yogi", "federation.server_lr": 0.03})
    assert cfg.federation.server_optimizer_settings() == {"lr": 0.03, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
    protocol = make_protocol(cfg)
    assert protocol.opt == server_opt.ServerOptimizer("yogi", lr=0.03, beta1=0.9, beta2=0.99, tau=1e-3)
    summary = protocol.server().server_summary()["server_optimizer"]
    assert summary["name"] == "yogi" and summary["lr"] == 0.03 and "privacy" not in summary
