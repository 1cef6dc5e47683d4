"""`trustformer attack audit --level client`: does a client-level DP run (``dp-fedavg``, ``dp-fedsam``) keep the ε it
reports? An audit in one training run with canary clients.

Canary clients (Andrew et al. 2024, "One-shot empirical privacy estimation for federated learning", ICLR): canary i
sends the update a·u_i every round it is drawn, u_i a random unit direction and a = ``norm_factor`` × C above the
clip bound C, so that the clipping matters. Each canary is in the population with probability ½ (Steinke, Nasr &
Jagielski 2023, "Privacy auditing with one (1) training run", NeurIPS), and an included canary takes every step a
client's update takes, in the wrapper's own code (``protocols/wrappers/dp.py``, through its
:class:`~trustformer.protocols.wrappers.dp.ClientCanaryHook`):

- **sampling**: the canaries in are candidates of the same Poisson draw as the real clients, at the run's rate q
  (``DifferentialPrivacy.participants``, ``core/dp.py:poisson_sample``);
- **clipping**: a drawn canary's update is clipped by the wrapper's client-side clipping
  (``DifferentialPrivacy.clip_update``), then again by the server's, in ``noised_mean``, as every update is;
- **sum and noise**: it is summed with the real clients' clipped updates, and the one N(0, σ²C² I) of the round
  is added to the sum (``noised_mean``; client-level DP has its noise on the server only: distributed noise shares
  exist for record-level DP alone, ``config/sections.py``);
- **accounting**: the ε the run reports is its accountant's (``PrivacyLedger``), untouched by the audit.

The auditor sees what the server releases: the noisy aggregate of every round. A canary's score is the cosine of its
direction with the sum of the releases, which is the model's change over the run (Andrew et al.'s statistic). The
directions are random over disjoint blocks of coordinates, a block within one tensor, so that canaries are exactly
orthogonal (Andrew et al. rely on near-orthogonality in high dimension): one canary's update is invisible in another
one's score, and the real clients' clipped updates, spread over every coordinate, add little. Canaries are spread
evenly over the tensors, so noise missing from some of them shows in those tensors' canaries, which the bound also
guesses on alone (``groupings`` of :func:`~trustformer.attack.audit.one_run_epsilon_lower_bound`).
``attack/audit.py:one_run_epsilon_lower_bound`` turns scores and coins into ε_lb at 95% confidence. Beside it,
:func:`gaussian_epsilon` gives Andrew et al.'s estimate ε̂: the ε of the Gaussian pair fitted to the scores of the
canaries in and out. It is an estimate, not a bound, and helps read a bug the bound is too weak to show.

The directions and the coins derive from the run seed (an audit run is not private for its canaries); the noise and
the draw come from the operating system as in every run. A round in which no real client is drawn releases nothing
(the round loop skips it): canaries drawn then are not released, which only weakens the audit.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
import torch
from scipy import optimize, stats

from trustformer.config import RunConfig
from trustformer.core.shared import derive_seed
from trustformer.protocols import make_protocol
from trustformer.protocols.interface.base import Tensors
from trustformer.protocols.wrappers.base import ProtocolWrapper
from trustformer.protocols.wrappers.dp import INDICES, DifferentialPrivacy, client_canaries

from .audit import one_run_epsilon_lower_bound

FIRST_CANARY = 1 << 40  # the client id of canary 0 (real clients count from 0)
NORM_FACTOR = 10.0  # a canary's update norm, in clip bounds C
QUIET_RATIO, MIN_POOLED = 0.5, 16  # quiet_pool: a tensor whose scores spread < half the others'; of ≥ 16 canaries


# ------------------------------------------------------------------------------ placement and scores


def spread(total: int, capacity: Sequence[int]) -> list[int]:
    """``total`` canaries spread evenly over tensors of ``capacity`` coordinates, none holding more than its
    coordinates (a small tensor full, the rest shared evenly by the others)."""
    if total > sum(capacity):
        raise ValueError(f"{total} canaries need at least as many coordinates; the model has {sum(capacity)}")
    counts = [0] * len(capacity)
    left = total
    while left:
        open_ = [t for t, c in enumerate(capacity) if counts[t] < c]
        each = max(1, left // len(open_))
        for t in open_:
            take = min(each, capacity[t] - counts[t], left)
            counts[t] += take
            left -= take
            if not left:
                break
    return counts


@dataclass
class CanaryLayout:
    """Where canary i lives: ``tensor[i]``, on the coordinates ``blocks[name][j]`` (flat) of that tensor with unit
    direction ``directions[name][j]``, j = ``slot[i]``. Blocks never overlap, so the directions are orthonormal."""

    names: tuple[str, ...]  # every tensor of an update, in order
    shapes: dict[str, torch.Size]
    dtype: torch.dtype
    tensor: tuple[str, ...]  # per canary
    slot: tuple[int, ...]  # per canary: its row in its tensor's blocks
    blocks: dict[str, torch.Tensor]  # name -> (canaries there, s) flat coordinates
    directions: dict[str, torch.Tensor]  # name -> (canaries there, s) float64, rows of norm 1

    @classmethod
    def place(cls, like: Tensors, count: int, seed: int) -> CanaryLayout:
        """``count`` canaries over the tensors of ``like`` (one update), spread by :func:`spread`; the blocks are
        a seeded permutation of each tensor's coordinates cut in equal parts, the directions seeded Gaussians."""
        names = tuple(like)
        counts = spread(count, [like[n].numel() for n in names])
        generator = torch.Generator().manual_seed(seed)
        blocks, directions, tensor, slot = {}, {}, [], []
        for name, n in zip(names, counts, strict=True):
            if not n:
                continue
            size = like[name].numel() // n
            perm = torch.randperm(like[name].numel(), generator=generator)
            blocks[name] = perm[: n * size].reshape(n, size)
            raw = torch.randn(n, size, generator=generator, dtype=torch.float64)
            directions[name] = raw / raw.norm(dim=1, keepdim=True)
            tensor += [name] * n
            slot += list(range(n))
        shapes = {n: like[n].shape for n in names}
        return cls(names, shapes, like[names[0]].dtype, tuple(tensor), tuple(slot), blocks, directions)

    def update(self, i: int, norm: float, zeros: Tensors) -> Tensors:
        """Canary i's update, norm·u_i: zero (the shared ``zeros``) on every tensor but its own."""
        name, j = self.tensor[i], self.slot[i]
        own = torch.zeros(self.shapes[name].numel(), dtype=torch.float64)
        own[self.blocks[name][j]] = norm * self.directions[name][j]
        return {**zeros, name: own.reshape(self.shapes[name]).to(self.dtype)}

    def scores(self, total: Tensors) -> np.ndarray:
        """Every canary's cosine with ``total`` (the sum of the releases): ⟨total, u_i⟩ / ‖total‖ (Andrew et al.
        2024, their canary statistic)."""
        flat = {n: total[n].detach().double().reshape(-1) for n in self.names}
        norm = math.sqrt(sum(float(v.pow(2).sum()) for v in flat.values())) or 1.0
        per_tensor = {n: (flat[n][b] * self.directions[n]).sum(dim=1) for n, b in self.blocks.items()}
        return np.asarray([float(per_tensor[n][j]) / norm for n, j in zip(self.tensor, self.slot, strict=True)])

    def groupings(self) -> list[list[str]]:
        """The canaries' groups the bound also guesses on alone, fixed before the run: top-level module (embedding,
        encoder, decoder) and kind of tensor (weight, bias). Few and large on purpose: at the level a group gets
        among a hundred, the one-run bound's 2mδ term (Steinke et al. 2023, Thm. 5.2) caps what any group could show
        below the ε of a run (δ = 1e-5, ε = 1), so per-tensor groups would all be dropped; :func:`quiet_pool` finds
        the tensors instead."""
        return [[n.split(".")[0] for n in self.tensor], [n.rsplit(".", 1)[-1] for n in self.tensor]]


class CanaryPayloads(Sequence[Tensors]):
    """The real payloads, then each drawn canary's update made on demand and passed through the wrapper's ``clip``
    (one canary's tensors in memory at a time, whatever the number of canaries)."""

    def __init__(self, real: Sequence[Tensors], canaries: Sequence[int], make: Callable[[int], Tensors]) -> None:
        self.real, self.canaries, self.make = list(real), list(canaries), make

    def __len__(self) -> int:
        return len(self.real) + len(self.canaries)

    @overload
    def __getitem__(self, index: int) -> Tensors: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Tensors]: ...

    def __getitem__(self, index: int | slice) -> Tensors | Sequence[Tensors]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        if index < len(self.real):
            return self.real[index]
        return self.make(self.canaries[index - len(self.real)])


# ------------------------------------------------------------------------------ the canary clients


class ClientCanaries:
    """m canary clients, the :class:`~trustformer.protocols.wrappers.dp.ClientCanaryHook` of an audit run: canary i
    (client id ``FIRST_CANARY`` + i) is in the population with probability ½ (``included``, seeded), sends
    ``norm``·u_i whenever the wrapper's draw picks it, and the releases of the run are kept for the scores."""

    def __init__(self, count: int, seed: int, norm: float) -> None:
        if count < 2:
            raise ValueError(f"the audit needs at least 2 canaries; got {count}")
        coins = random.Random(derive_seed(seed, "client-canaries"))
        self.included = tuple(coins.random() < 0.5 for _ in range(count))
        self.placement_seed = derive_seed(seed, "client-canary-directions")
        self.norm = norm
        self.layout: CanaryLayout | None = None
        self.drawn: dict[int, list[int]] = {}  # round -> the canaries drawn
        self.releases: dict[int, Tensors] = {}  # round -> the release (float64)
        self._zeros: Tensors = {}

    def candidates(self, rnd: int, clients: Sequence[int]) -> list[int]:
        if any(c >= FIRST_CANARY for c in clients):
            raise ValueError(f"client ids from {FIRST_CANARY} are the audit's canaries")
        return [*clients, *(FIRST_CANARY + i for i, inside in enumerate(self.included) if inside)]

    def sampled(self, rnd: int, drawn: list[int]) -> list[int]:
        self.drawn[rnd] = [c - FIRST_CANARY for c in drawn if c >= FIRST_CANARY]
        return [c for c in drawn if c < FIRST_CANARY]

    def payloads(self, rnd: int, payloads: Sequence[Tensors], clip: Callable[[Tensors], Tensors]) -> Sequence[Tensors]:
        if not payloads or not self.drawn.get(rnd):
            return payloads
        first = payloads[0]
        if INDICES in first:
            raise ValueError("client canaries are dense updates: audit dp-fedavg or dp-fedsam, not a sparse update")
        if self.layout is None:
            self.layout = CanaryLayout.place(first, len(self.included), self.placement_seed)
            self._zeros = {n: torch.zeros_like(t) for n, t in first.items()}
        layout = self.layout
        return CanaryPayloads(payloads, self.drawn[rnd], lambda i: clip(layout.update(i, self.norm, self._zeros)))

    def released(self, rnd: int, release: Tensors) -> None:
        self.releases[rnd] = {n: t.detach().double().clone() for n, t in release.items()}

    def scores(self) -> np.ndarray:
        """Each canary's cosine with the sum of the releases (zeros before any release)."""
        if self.layout is None or not self.releases:
            return np.zeros(len(self.included))
        rounds = list(self.releases.values())
        total = {n: sum((r[n] for r in rounds[1:]), rounds[0][n]) for n in rounds[0]}
        return self.layout.scores(total)

    def draw_rate(self) -> float:
        """The share of (included canary, round) pairs drawn: the canaries' sampling rate as it ran."""
        inside = sum(self.included)
        return sum(len(d) for d in self.drawn.values()) / max(1, inside * len(self.drawn))


def quiet_pool(scores: np.ndarray, tensors: Sequence[str], ratio: float = QUIET_RATIO) -> np.ndarray:
    """The canaries of the tensors whose scores spread less than ``ratio`` × the 90th percentile of the tensors'
    spreads (1.4826 × median absolute deviation; tensors of at least ``MIN_POOLED`` canaries): where the noise on the
    release is smaller than on the rest of the model. Chosen from the scores alone, never the coins, so the bound may
    guess on it (``pools`` of :func:`~trustformer.attack.audit.one_run_epsilon_lower_bound`); in an honest run every
    tensor gets the same noise σC and the pool is empty or nearly so."""
    labels = np.asarray(tensors)
    spreads = {}
    for name in dict.fromkeys(labels.tolist()):
        own = scores[labels == name]
        if len(own) >= MIN_POOLED:
            spreads[name] = 1.4826 * float(np.median(np.abs(own - np.median(own))))
    if not spreads:
        return np.zeros(len(scores), dtype=bool)
    reference = float(np.percentile(list(spreads.values()), 90))
    quiet = [n for n, spread in spreads.items() if spread < ratio * reference]
    return np.isin(labels, quiet)


# ------------------------------------------------------------------------------ the estimate and the audit


def gaussian_epsilon(mu: float, delta: float) -> float:
    """The ε at ``delta`` of telling N(0, 1) from N(μ, 1) (the Gaussian mechanism of sensitivity μ; Balle & Wang
    2018, Thm. 8): the root of Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) = δ; 0 for μ ≤ 0. Andrew et al. (2024) turn the
    canaries' scores into an estimate of ε this way."""
    if mu <= 0 or not math.isfinite(mu):
        return 0.0 if mu <= 0 else math.inf

    def excess(eps: float) -> float:
        return float(stats.norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * stats.norm.cdf(-eps / mu - mu / 2)) - delta

    if excess(0.0) <= 0:
        return 0.0
    hi = 1.0
    while excess(hi) > 0:
        hi *= 2
        if hi > 1e4:
            return math.inf
    return float(optimize.brentq(excess, 0.0, hi))


def epsilon_estimate(scores: np.ndarray, included: np.ndarray, delta: float) -> float:
    """Andrew et al. (2024)'s one-shot estimate: μ̂ = (mean score in − mean score out) / pooled standard deviation,
    ε̂ = :func:`gaussian_epsilon` (μ̂, δ). Not a bound: the mechanism's scores are Gaussian only without sampling."""
    inside, outside = scores[included], scores[~included]
    if len(inside) < 2 or len(outside) < 2:
        return 0.0
    pooled = math.sqrt(
        (inside.var(ddof=1) * (len(inside) - 1) + outside.var(ddof=1) * (len(outside) - 1)) / (len(scores) - 2)
    )
    return gaussian_epsilon((inside.mean() - outside.mean()) / pooled if pooled > 0 else math.inf, delta)


def _check(cfg: RunConfig) -> None:
    """The run must be a client-level DP baseline (a :class:`DifferentialPrivacy` wrapper) in this process."""
    protocol: Any = make_protocol(cfg)
    while not isinstance(protocol, DifferentialPrivacy):
        if not isinstance(protocol, ProtocolWrapper):
            raise ValueError(
                f"the client-level audit needs a client-level DP baseline (dp-fedavg, dp-fedsam) with privacy.unit = "
                f"'client'; got federation.strategy = {cfg.federation.strategy!r}, privacy.unit = {cfg.privacy.unit!r}"
            )
        protocol = protocol.inner


def audit(cfg: RunConfig, canaries: int = 2000, *, norm_factor: float = NORM_FACTOR) -> dict[str, Any]:
    """Run ``cfg`` in this process with ``canaries`` canary clients and audit its client-level guarantee in that one
    run: ε_lb (Steinke et al. 2023, at 95%) beside the ε the run reports, and Andrew et al.'s estimate ε̂."""
    from trustformer.engine.inprocess import run_in_process

    _check(cfg)
    hook = ClientCanaries(canaries, cfg.seed, norm_factor * cfg.privacy.clip_norm)
    started = time.perf_counter()
    with client_canaries(hook):
        summary = run_in_process(cfg)
    wall_s = time.perf_counter() - started
    if hook.layout is None:
        raise RuntimeError("no canary was released: the audit needs the in-process engine and a drawn canary")
    scores, included = hook.scores(), np.asarray(hook.included, dtype=bool)
    privacy = summary.get("privacy") or {}
    reported = privacy.get("epsilon")
    target = float(reported) if reported is not None else cfg.privacy.epsilon
    groupings, pool = hook.layout.groupings(), quiet_pool(scores, hook.layout.tensor)
    bound = one_run_epsilon_lower_bound(
        scores, included, cfg.privacy.delta, groupings=groupings, target=target, pools=[pool]
    )
    return {
        "level": "client",
        "epsilon": reported,
        "mechanism": {k: privacy.get(k) for k in ("noise_multiplier", "sampling_rate", "rounds", "clip_norm")},
        "target_epsilon": cfg.privacy.epsilon,
        "delta": cfg.privacy.delta,
        "epsilon_lb": bound["epsilon_lb"],
        "epsilon_estimate": epsilon_estimate(scores, included, cfg.privacy.delta),
        "canaries": len(scores),
        "included": int(included.sum()),
        "canary_norm": hook.norm,
        "canary_draw_rate": hook.draw_rate(),
        "released_rounds": len(hook.releases),
        "guesses": bound.get("guesses"),
        "correct": bound.get("correct"),
        "k": bound.get("k"),
        "group": bound.get("group"),
        "tried": bound.get("tried"),
        "quiet_tensors": len(set(np.asarray(hook.layout.tensor)[pool].tolist())),
        "strategy": cfg.federation.strategy,
        "secure": cfg.secure.mode,
        "test_loss": summary.get("test_loss"),
        "wall_s": wall_s,
        "delta_slack": 2 * len(scores) * cfg.privacy.delta,
    }


__all__ = [
    "CanaryLayout",
    "CanaryPayloads",
    "ClientCanaries",
    "audit",
    "epsilon_estimate",
    "gaussian_epsilon",
    "spread",
]
