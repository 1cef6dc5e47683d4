"""The ``[privacy]`` section of a run configuration: differential privacy of whole clients or of each record, its
options, defaults and the checks it makes of its own values (re-exported by ``config/sections.py``)."""

from __future__ import annotations

from dataclasses import dataclass

from .checks import ConfigError, check_at_least, check_choice, check_in_range, check_positive

PRIVACY_UNITS = ("client", "record")


@dataclass(frozen=True)
class PrivacyConfig:
    """Differential privacy (docs/privacy.md "Differential privacy"): of whole clients (``unit = "client"``, the DP
    baselines dp-fedavg, dp-fedsam, dp-blur-lus: each client's update clipped, noise on the server's sum) or of
    each training record (``unit = "record"``: DP-SGD in every client's local training, any exchanging protocol).

    Defaults are the Trustformer paper's settings (Sec. 7: epsilon = 1, delta = 1e-3, C = 0.5).
    """

    # client: the DP baselines' user-level DP (privacy.* applies to them only) | record: DP-SGD of every record,
    # for every protocol (privacy.epsilon/delta/clip_norm/noise_multiplier then describe the per-record mechanism)
    unit: str = "client"
    epsilon: float = 1.0  # target epsilon of the whole run (at delta)
    delta: float = 1e-3  # the delta of (epsilon, delta)-DP
    clip_norm: float = 0.5  # C: every client update (unit = client) or every record's gradient (record) clipped to it
    noise_multiplier: float = -1.0  # sigma (noise std = sigma * C); -1 = solve from (epsilon, delta)
    # unit = record: expected Poisson batch (sentence pairs), at most the owner's records; 0 = train.batch_size.
    # 1024 with lr_scale 4, the default, was the best of the recipe sweep at epsilon = 8 (docs/privacy.md "The
    # recipe, measured"); the recipe before it was 256 with lr_scale 1
    batch_size: int = 1024
    # unit = record, audit runs only: gradient canaries planted in client 0's training (attack/audit.py); they and
    # their coin flips derive from the run seed so the auditor can score them
    audit_canaries: int = 0
    sampling_rate: float = 1.0  # q: each client takes part in a round with probability q (Poisson)
    on_exceed: str = "refuse"  # planned rounds exceed epsilon: refuse (to start) | stop (early) | continue
    sam_rho: float = 0.5  # dp-fedsam: SAM perturbation radius rho
    blur_lambda: float = 1.0  # dp-blur-lus: weight of the bounded-local-update regulariser
    blur_bound: float = 0.0  # dp-blur-lus: update norm above which the regulariser acts; 0 = clip_norm
    lus_keep: float = 0.1  # dp-blur-lus: fraction of the update's coordinates kept (largest magnitude)
    lus_noise: str = "kept"  # dp-blur-lus: noise on the kept coordinates only | dense (every coordinate)
    # where the noise and the client sampling come from: "os" = the operating system's randomness (the only
    # private choice); "seeded-not-private" = derived from the run seed, which every client knows (debugging only)
    noise_source: str = "os"
    # unit = client: the bound C of every update: fixed (privacy.clip_norm every round) | adaptive (Andrew et al.
    # 2021, server side: C starts at privacy.clip_norm and follows the target_quantile of the update norms)
    clipping: str = "fixed"
    target_quantile: float = 0.5  # adaptive: gamma, the share of the updates meant to stay unclipped
    clip_lr: float = 0.2  # adaptive: eta_C of the geometric update C <- C * exp(-eta_C * (b - gamma))
    clip_count_stddev: float = -1.0  # adaptive: sigma_b, noise on the unclipped count; -1 = expected participants / 20
    # unit = record: who adds the noise. local: every owner adds N(0, sigma^2 C^2) to each of its own DP-SGD steps |
    # distributed: one DP-SGD step per round on the union of the owners' Poisson batches, each owner adding a share
    # N(0, sigma^2 C^2 / (m - dropout_tolerance)) that secure aggregation sums (needs secure.mode secagg or tee+secagg;
    # docs/privacy.md "Distributed noise")
    noise: str = "local"
    # noise = distributed: participants per round whose loss the shares still cover; the clients refuse to unmask a
    # round with fewer survivors
    dropout_tolerance: int = 0
    # noise = distributed: the learning rate of the round's SGD step on the pooled mean (16: best of 1, 4, 16, 64 for
    # the public start with LoRA r16 on `small`, docs/privacy.md; a model trained from scratch needs about 1)
    distributed_lr: float = 16.0
    # noise = distributed: the noise of each round is correlated with the last noise_bands - 1 rounds' (DP-FTRL with
    # the banded square-root factorization, Kalinin & Lampert 2024; each owner runs it on its own share) and each
    # record is drawn at most once in any noise_bands consecutive rounds (b-min-sep sampling), which makes the run
    # as private as ceil(rounds / noise_bands) DP-SGD steps at sigma / column norm (Choquette-Choo et al. 2023,
    # Thm. 4; core/banded_noise.py). 1 = fresh noise every round
    noise_bands: int = 1
    # unit = record, federation.finetune_epochs > 0: how the owner's fine-tuning after the last exchange runs. free:
    # plain training that spends nothing (the fine-tuned model never leaves the owner's machine, so the statement
    # "everything that left my machine is (epsilon, delta)-DP" holds) | dp: DP-SGD charged to epsilon, for an owner
    # who will publish its fine-tuned model
    finetune: str = "free"
    # unit = record, train.optimizer = adamw: take DP-SGD's noise variance Phi = (sigma C / B)^2 out of Adam's second
    # moment (DP-AdamBC, Tang et al. 2024); without it DP-Adam acts as a slow DP-SGD
    adam_correction: bool = False
    adam_floor: float = 0.1  # adam_correction: the corrected second moment's floor, as a share of Phi
    # unit = record, noise = local: the DP-SGD steps' peak learning rate is train.lr x lr_scale (a large noisy
    # batch takes a larger step; fine-tuning keeps train.lr x federation.finetune_lr_scale; see batch_size)
    lr_scale: float = 4.0
    # unit = record: check every DP-SGD run where its epsilon is spent (core/dp_checks.py): the steps charged are the
    # steps taken, the batches drawn fit rate q, no clipped record exceeds C, the noise has std sigma C on every
    # tensor and never repeats, and a second accountant (PLD) agrees with the reported epsilon; a failed check stops
    # the run. Results per client in summary.json (privacy.clients.*.checks). false: off (debugging only)
    checks: bool = True
    # unit = record, noise = local: DP-SGD in a k-dimensional subspace of the trained weights, estimated every round
    # from the gradients of public pairs at the model the owner holds (Zhou et al. 2021, "Bypassing the ambient
    # dimension"; the projection of GEP, Yu et al. 2021): each record's gradient is projected onto it before
    # clipping, and the noisy sum after the noise (post-processing: the same sigma and epsilon), so the noise that
    # reaches the model has k dimensions instead of every trained weight's. 0 = off (core/subspace.py)
    subspace_dim: int = 0
    subspace_pairs: int = 256  # subspace_dim > 0: the public pairs whose per-pair gradients span the subspace

    def validate(self) -> None:
        check_choice("privacy.unit", self.unit, PRIVACY_UNITS)
        self._validate_clipping()
        check_at_least("privacy.batch_size", self.batch_size, 0)
        check_at_least("privacy.audit_canaries", self.audit_canaries, 0)
        if self.audit_canaries and self.unit != "record":
            raise ConfigError("privacy.audit_canaries applies to privacy.unit = 'record' (gradient canaries in DP-SGD)")
        check_positive("privacy.epsilon", self.epsilon)
        check_in_range("privacy.delta", self.delta, 0.0, 1.0, lo_open=True, hi_open=True)
        check_positive("privacy.clip_norm", self.clip_norm)
        if self.noise_multiplier != -1.0 and self.noise_multiplier < 0:
            raise ConfigError(
                f"privacy.noise_multiplier = {self.noise_multiplier!r} must be >= 0, or -1 to solve it "
                "from (privacy.epsilon, privacy.delta)"
            )
        check_in_range("privacy.sampling_rate", self.sampling_rate, 0.0, 1.0, lo_open=True)
        check_choice("privacy.on_exceed", self.on_exceed, ("refuse", "stop", "continue"))
        check_at_least("privacy.sam_rho", self.sam_rho, 0.0)
        check_at_least("privacy.blur_lambda", self.blur_lambda, 0.0)
        check_at_least("privacy.blur_bound", self.blur_bound, 0.0)
        check_in_range("privacy.lus_keep", self.lus_keep, 0.0, 1.0, lo_open=True)
        check_choice("privacy.lus_noise", self.lus_noise, ("kept", "dense"))
        check_choice("privacy.noise_source", self.noise_source, ("os", "seeded-not-private"))
        check_choice("privacy.finetune", self.finetune, ("free", "dp"))
        check_positive("privacy.adam_floor", self.adam_floor)
        check_positive("privacy.lr_scale", self.lr_scale)
        if self.adam_correction and self.unit != "record":
            raise ConfigError("privacy.adam_correction applies to privacy.unit = 'record' (DP-SGD's noisy gradients)")
        if self.finetune == "dp" and self.unit != "record":
            raise ConfigError("privacy.finetune = 'dp' applies to privacy.unit = 'record' (DP-SGD fine-tuning)")
        self._validate_distributed()
        self._validate_subspace()

    def _validate_subspace(self) -> None:
        """The public subspace: record-level DP-SGD with local noise, fewer directions than public pairs."""
        check_at_least("privacy.subspace_dim", self.subspace_dim, 0)
        check_at_least("privacy.subspace_pairs", self.subspace_pairs, 1)
        if not self.subspace_dim:
            return
        if self.unit != "record" or self.noise != "local":
            raise ConfigError(
                f"privacy.subspace_dim = {self.subspace_dim} projects DP-SGD's per-record gradients: it needs "
                "privacy.unit = 'record' and privacy.noise = 'local' (or privacy.subspace_dim = 0)"
            )
        if self.subspace_dim > self.subspace_pairs:
            raise ConfigError(
                f"privacy.subspace_dim = {self.subspace_dim} directions cannot come from privacy.subspace_pairs = "
                f"{self.subspace_pairs} public gradients: raise privacy.subspace_pairs or lower privacy.subspace_dim"
            )
        if self.audit_canaries:
            raise ConfigError(
                "privacy.audit_canaries with privacy.subspace_dim > 0: the gradient canaries are planted outside the "
                "public subspace, which would project them away; audit with privacy.subspace_dim = 0"
            )

    def _validate_distributed(self) -> None:
        """Distributed noise: DP-SGD's record level only (client-level distributed noise is not built)."""
        check_choice("privacy.noise", self.noise, ("local", "distributed"))
        check_at_least("privacy.dropout_tolerance", self.dropout_tolerance, 0)
        check_positive("privacy.distributed_lr", self.distributed_lr)
        check_at_least("privacy.noise_bands", self.noise_bands, 1)
        if self.noise_bands > 1 and self.noise != "distributed":
            raise ConfigError(
                f"privacy.noise_bands = {self.noise_bands} correlates the noise of distributed DP-SGD's one step per "
                "round; set privacy.noise = 'distributed' (with secure.mode = 'secagg'), or privacy.noise_bands = 1"
            )
        if self.noise_bands > 1 and self.finetune == "dp":
            raise ConfigError(
                "privacy.noise_bands > 1 with privacy.finetune = 'dp': the accounting of banded noise covers the "
                "rounds only; use privacy.finetune = 'free' (the fine-tuned model stays with its owner)"
            )
        if self.noise == "distributed" and self.unit != "record":
            raise ConfigError(
                "privacy.noise = 'distributed' applies to privacy.unit = 'record' (shares of DP-SGD's noise "
                "summed by secure aggregation); the client-level baselines add their noise on the server"
            )

    def _validate_clipping(self) -> None:
        """Adaptive clipping (Andrew et al. 2021): its options, and the client-level DP it applies to."""
        check_choice("privacy.clipping", self.clipping, ("fixed", "adaptive"))
        check_in_range("privacy.target_quantile", self.target_quantile, 0.0, 1.0)
        check_positive("privacy.clip_lr", self.clip_lr)
        if self.clip_count_stddev != -1.0 and self.clip_count_stddev < 0:
            raise ConfigError(
                f"privacy.clip_count_stddev = {self.clip_count_stddev!r} must be >= 0, or -1 for the "
                "expected participants per round / 20 (Andrew et al. 2021)"
            )
        if self.clipping == "adaptive" and self.unit != "client":
            raise ConfigError(
                "privacy.clipping = 'adaptive' applies to privacy.unit = 'client' (the server adapts "
                "the bound of whole clients' updates); DP-SGD clips every record to privacy.clip_norm"
            )

    def check_secure(self, mode: str) -> None:
        """Adaptive clipping counts the updates under the bound: the server must see each one."""
        if self.clipping == "adaptive" and mode in ("secagg", "tee+secagg"):
            raise ConfigError(
                f"privacy.clipping = 'adaptive' cannot run under secure.mode = {mode!r}: the server "
                "counts the updates whose norm is under the current bound and clips each one, and "
                "secure aggregation shows it only their sum; set privacy.clipping = 'fixed' or "
                "secure.mode = 'none' or 'tee'"
            )
        if self.noise == "distributed" and mode not in ("secagg", "tee+secagg"):
            raise ConfigError(
                f"privacy.noise = 'distributed' needs secure.mode = 'secagg' or 'tee+secagg', got {mode!r}: "
                "each owner adds only a share of the noise, so the server must see nothing but the sum of the "
                "shares; set secure.mode = 'secagg' (or privacy.noise = 'local')"
            )


__all__ = ["PRIVACY_UNITS", "PrivacyConfig"]
