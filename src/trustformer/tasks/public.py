"""The public starting point (``train.init = "public"``): a translation model trained on public data only.

What it trains on: the corpus's ``public`` split (the pairs no client owns, which also train the tokenizer), or
the pairs of ``train.public_data`` (``--public-data FILE.tsv``). Either way, every pair whose source or target
sentence is also in a client's data (its training shard or its own held-out pairs) or in the shared test set is
dropped first (:func:`public_pairs`), so nothing of a client's data reaches it and its test loss is honest. Sentences
are compared by :func:`sentence_key` (case, punctuation and spacing ignored): "Create a new document." and "create
a new document" are the same sentence.

It is trained once with a recipe of its own (:func:`public_recipe`: the preset's ``train`` section, not the
run's, with ``train.public_lr`` and a cosine schedule over ``train.public_epochs`` passes), from the run seed's
initial model, and cached under ``<cache>/public-models/<key>/`` where the key hashes the encoded public pairs (so
the tokenizer too), the model's sizes, that recipe and the seed: every client, every protocol and training alone
then start from the same weights, a second run loads them, and a sweep of the federated run's ``train.*`` keeps
its starting point. Its own scores on the shared test set (loss, BLEU, chrF) are kept beside it and
recorded in every run's ``summary.json`` (``data.public_*``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass
from typing import Any

import torch

from ..config import RunConfig, TrainConfig, load_config
from ..core.shared import derive_seed
from ..data.batching import encode_pairs
from ..data.tsv import load_tsv
from ..data.ui_catalogs import load_ui_corpus
from . import translation_workload as wl
from .translation_scoring import translation_scores

log = logging.getLogger(__name__)

VERSION = "trustformer-public-model-v1"
WEIGHTS, REPORT = "model.pt", "report.json"


@dataclass(frozen=True)
class PublicModel:
    """The public model's weights (CPU, plain ``Seq2SeqTransformer`` names) and its report (key, pairs, scores)."""

    state: dict[str, torch.Tensor]
    report: dict[str, Any]


_loaded: dict[str, PublicModel] = {}  # this process's copy, by key


_NOT_A_WORD = re.compile(r"[\W_]+")


def sentence_key(sentence: str) -> str:
    """A sentence as deduplication compares it: lower case, every run of punctuation and spaces one space."""
    return _NOT_A_WORD.sub(" ", sentence.casefold()).strip()


def private_sentences(workload: wl.Workload) -> set[str]:
    """The :func:`sentence_key` of every source and target sentence of the clients' data (training shards, own
    held-out pairs) and of the shared test set."""
    splits = workload.splits
    pairs = [p for shard in splits.clients for p in shard] + list(splits.test)
    pairs += [p for tests in (splits.client_tests or []) for p in tests]
    return {sentence_key(side) for pair in pairs for side in pair}


def public_pairs(cfg: RunConfig, workload: wl.Workload) -> tuple[list[tuple[str, str]], int]:
    """(the pairs the public model trains on, how many were dropped because a client or the test set holds one
    of their sentences). From ``train.public_data`` when set, else the corpus's public split and, with
    ``train.public_source = "debian-ui"``, Debian's Russian UI catalogs (``data/ui_catalogs.py``); pairs from a
    file or the catalogs keep at most ``data.max_words`` words per side, like the corpus split."""
    limit = cfg.data.max_words

    def short(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        return [p for p in pairs if not limit or (len(p[0].split()) <= limit and len(p[1].split()) <= limit)]

    if cfg.train.public_data:
        try:
            pairs = short(load_tsv(cfg.train.public_data))
        except (OSError, ValueError) as exc:
            raise wl.DataError(f"train.public_data = {cfg.train.public_data!r}: {exc}") from exc
    else:
        pairs = list(workload.splits.public)
        if cfg.train.public_source == "debian-ui":
            catalogs = load_ui_corpus(wl.cache_dir(cfg), lambda text: log.info("public corpus: %s", text))
            pairs = list(dict.fromkeys(pairs + short(catalogs)))
    private = private_sentences(workload)
    kept = [p for p in pairs if sentence_key(p[0]) not in private and sentence_key(p[1]) not in private]
    if not kept:
        raise wl.DataError(
            "the public model has no pair to train on: every public pair shares a sentence with a "
            "client's data or the test set" + (f" ({cfg.train.public_data})" if cfg.train.public_data else "")
        )
    return kept, len(pairs) - len(kept)


def public_recipe(cfg: RunConfig) -> TrainConfig:
    """The public model's training recipe: the ``train`` section of ``cfg``'s preset (what every run of that preset
    starts from, whatever its own ``train.*`` says), with ``train.public_lr`` when set; one epoch per call."""
    preset = load_config(cfg.preset, None, {}).train
    lr = cfg.train.public_lr or preset.lr
    return dataclasses.replace(
        preset,
        lr=lr,
        local_epochs=1,
        decay_steps=0,
        init=cfg.train.init,
        public_data=cfg.train.public_data,
        public_source=cfg.train.public_source,
        public_epochs=cfg.train.public_epochs,
        public_lr=cfg.train.public_lr,
    )


def _pretrain_config(cfg: RunConfig) -> RunConfig:
    """The configuration pretraining runs under: :func:`public_recipe`, ``train.public_epochs`` calls of one epoch
    (the cosine schedule spans them all)."""
    return dataclasses.replace(
        cfg,
        train=public_recipe(cfg),
        federation=dataclasses.replace(cfg.federation, rounds=cfg.train.public_epochs),
    )


def cache_key(cfg: RunConfig, workload: wl.Workload, encoded: list[tuple[list[int], list[int]]]) -> str:
    """Hash of what determines the public model: its encoded pairs (data and tokenizer), the model's sizes, its
    recipe (:func:`public_recipe`) and the seed."""
    recipe = {
        k: v
        for k, v in dataclasses.asdict(public_recipe(cfg)).items()
        if k not in ("init", "public_data", "local_epochs", "public_lr")
    }
    head = json.dumps(
        {
            "version": VERSION,
            "seed": cfg.seed,
            "model": dataclasses.asdict(workload.model_config),
            "recipe": recipe,
            "tokenizer": workload.tokenizer.name,
        },
        sort_keys=True,
        default=list,
    )
    digest = hashlib.sha256(head.encode())
    for src, tgt in encoded:
        digest.update((",".join(map(str, src)) + "|" + ",".join(map(str, tgt)) + "\n").encode())
    return digest.hexdigest()[:16]


def public_model(cfg: RunConfig, workload: wl.Workload) -> PublicModel:
    """The public model of ``cfg`` (``train.init = "public"``): from this process, else from the cache, else
    trained now and cached."""
    pairs, dropped = public_pairs(cfg, workload)
    encoded = encode_pairs(pairs, workload.tokenizer, max_len=cfg.model.max_len)
    key = cache_key(cfg, workload, encoded)
    if key in _loaded:
        return _loaded[key]
    folder = wl.cache_dir(cfg) / "public-models" / key
    if (folder / REPORT).is_file() and (folder / WEIGHTS).is_file():
        report = json.loads((folder / REPORT).read_text(encoding="utf-8"))
        state = torch.load(folder / WEIGHTS, map_location="cpu", weights_only=True)
        report["cached"] = True
        log.info(
            "public model %s from the cache: test loss %.3f · BLEU %.2f (%d pairs, trained in %.0f s)",
            key,
            report["test_loss"],
            report["bleu"],
            report["pairs"],
            report["train_s"],
        )
    else:
        state, report = _train(cfg, workload, encoded, key, dropped)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{WEIGHTS}.{os.getpid()}.tmp"
        torch.save(state, tmp)
        tmp.replace(folder / WEIGHTS)
        tmp = folder / f".{REPORT}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        tmp.replace(folder / REPORT)  # last: a folder with a report holds its weights
        report = {**report, "cached": False}
    report["path"] = str(folder)
    _loaded[key] = PublicModel(state=state, report=report)
    return _loaded[key]


def cached_state(cfg: RunConfig, key: str) -> dict[str, torch.Tensor]:
    """The weights of the public model cached under ``key`` (a run's ``summary.json`` data ``public_model``):
    the very start a finished run began from, even where today's code would build another one."""
    path = wl.cache_dir(cfg) / "public-models" / key / WEIGHTS
    if not path.is_file():
        raise wl.DataError(f"the public model {key} is not in the cache ({path}): it was trained on another machine")
    return torch.load(path, map_location="cpu", weights_only=True)


def _train(
    cfg: RunConfig, workload: wl.Workload, encoded: list[tuple[list[int], list[int]]], key: str, dropped: int
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    pcfg = _pretrain_config(cfg)
    if cfg.runtime.threads and torch.get_num_threads() != cfg.runtime.threads:
        torch.set_num_threads(cfg.runtime.threads)  # runtime.threads, as for the run's own training
    model = wl.initial_model(cfg, workload)  # the run seed's initial model (the scratch start)
    optimizer = wl.new_optimizer(pcfg, model)
    log.info(
        "public model %s: training on %d public pairs (%d dropped: a client or the test set holds one of their "
        "sentences) for %d epochs",
        key,
        len(encoded),
        dropped,
        cfg.train.public_epochs,
    )
    started = time.perf_counter()
    result: dict[str, float] = {}
    for epoch in range(cfg.train.public_epochs):
        result = wl.train_local(pcfg, model, optimizer, encoded, seed=derive_seed(cfg.seed, "public-train", epoch))
        log.info(
            "public model · epoch %d/%d · %d steps in %.1f s · train loss %.3f",
            epoch + 1,
            cfg.train.public_epochs,
            result["steps"],
            result["train_s"],
            result["train_loss"],
        )
    train_s = time.perf_counter() - started
    test_loss = wl.test_loss(cfg, model, workload)
    scores, _ = translation_scores(cfg, model, workload, extra_metrics=False)
    report = {
        "key": key,
        "pairs": len(encoded),
        "dropped": dropped,
        "source": cfg.train.public_data
        or {"split": "public split", "debian-ui": "public split + Debian UI catalogs"}[cfg.train.public_source],
        "epochs": cfg.train.public_epochs,
        "train_s": train_s,
        "train_loss": result.get("train_loss"),
        "test_loss": test_loss,
        "bleu": float(scores["bleu"]),
        "chrf": float(scores["chrf"]),
        "bleu_size": cfg.eval.bleu_size,
        "beam_size": cfg.eval.beam_size,
    }
    log.info("public model %s trained in %.0f s: test loss %.3f · BLEU %.2f", key, train_s, test_loss, report["bleu"])
    state = {name: t.detach().to("cpu").clone() for name, t in model.state_dict().items()}
    return state, report


__all__ = [
    "PublicModel",
    "cache_key",
    "private_sentences",
    "sentence_key",
    "public_model",
    "public_pairs",
    "public_recipe",
]
