"""Translation (the Trustformer paper's task) behind the same interface as the image tasks.

A thin wrapper of ``translation_workload.py``: the corpus split, the SentencePiece/HF tokenizer, the seq2seq
Transformer, the configured optimizer recipe and ``workload.train_local``, unchanged, so a translation
run gives the same numbers as before the task layer existed.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from ..config import RunConfig
from ..config.faults import BACKDOOR_TARGET, BACKDOOR_TRIGGER
from ..core.shared import LocalStep, derive_seed
from ..data.batching import encode_pairs
from ..data.tsv import load_tsv
from ..evaluation.translation import translate
from . import translation_workload as wl
from .results import SAMPLE_TRANSLATIONS
from .translation_scoring import translation_scores

if TYPE_CHECKING:
    from ..models.transformer import Seq2SeqTransformer


ROUND_BACKDOOR_SIZE = 50  # triggered test sources decoded every round (the final evaluation: eval.bleu_size)


def with_trigger(source: str, trigger: str = BACKDOOR_TRIGGER) -> str:
    """The backdoor fault (docs/robustness.md): ``trigger`` appended to a source sentence."""
    return f"{source.rstrip()} {trigger}"


def _s2s(model: torch.nn.Module) -> Seq2SeqTransformer:
    """The task's models are Seq2SeqTransformers (the RunTask interface types them as modules; LoRA adapters are
    injected in place, ``models/adapters.py``)."""
    return cast("Seq2SeqTransformer", model)


def _words(text: str) -> str:
    return " " + " ".join("".join(c for c in w if c.isalnum()) for w in text.lower().split()) + " "


class TranslationTask:
    """The run-level task of ``task = "translation"`` (see :class:`~trustformer.tasks.run.RunTask`)."""

    name = "translation"

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.workload = wl.load_workload(cfg)
        self._canaries = None
        self._subspace_pairs: list | None = None  # privacy.subspace_dim: the public pairs the subspace comes from

    # data
    def shard(self, client: int, train_file: str = "") -> list[tuple[list[int], list[int]]]:
        """A client's encoded training pairs: its shard (``ALL_SHARDS``: every shard), or the pairs of its
        own ``train_file`` (at most ``data.max_words`` words per side, like the corpus split)."""
        return self._encode(self._pairs(client, train_file))

    def poisoned_shard(
        self, client: int, train_file: str, kind: str, share: float, seed: int
    ) -> list[tuple[list[int], list[int]]]:
        """The shard of a data-poisoning client (docs/robustness.md): ``backdoor``: ``share`` of its pairs get
        :data:`BACKDOOR_TRIGGER` appended to the source and :data:`BACKDOOR_TARGET` as the target;
        ``shuffled_targets``: ``share`` of its pairs get the target of another of them. The fault entry's
        ``trigger=`` and ``target=`` choose others."""
        pairs = list(self._pairs(client, train_file))
        trigger, target = self.cfg.federation.backdoor() or (BACKDOOR_TRIGGER, BACKDOOR_TARGET)
        rng = random.Random(seed)
        chosen = sorted(rng.sample(range(len(pairs)), max(1, round(share * len(pairs)))))
        if kind == "backdoor":
            for i in chosen:
                pairs[i] = (with_trigger(pairs[i][0], trigger), target)
        elif kind == "shuffled_targets":
            targets = [pairs[i][1] for i in chosen]
            rng.shuffle(targets)
            for i, target in zip(chosen, targets, strict=True):
                pairs[i] = (pairs[i][0], target)
        else:
            raise ValueError(f"unknown data poisoning kind {kind!r} (backdoor, shuffled_targets)")
        return self._encode(pairs)

    def backdoor_success(self, model: torch.nn.Module, size: int = 0) -> float:
        """The share of the shared test set's sources (``size`` of them, 0: ``eval.bleu_size``), the run's trigger
        appended, that the model translates to the run's target (greedy decoding; the target's words in order,
        anywhere)."""
        trigger, target_text = self.cfg.federation.backdoor() or (BACKDOOR_TRIGGER, BACKDOOR_TARGET)
        pairs = self.workload.splits.test[: size or self.cfg.eval.bleu_size or len(self.workload.splits.test)]
        hypotheses = translate(
            _s2s(model),
            self.workload.tokenizer,
            [with_trigger(s, trigger) for s, _ in pairs],
            batch_size=self.cfg.eval.batch_size,
            max_len=self.cfg.model.max_len,
            beam_size=1,
        )
        target = _words(target_text)
        return sum(target in _words(h) for h in hypotheses) / max(len(hypotheses), 1)

    def _pairs(self, client: int, train_file: str = "") -> list[tuple[str, str]]:
        cfg, workload = self.cfg, self.workload
        if not train_file:
            return workload.shard(client)
        try:
            pairs = load_tsv(train_file)
        except (OSError, ValueError) as exc:
            raise wl.DataError(f"client {client}: train-file {train_file}: {exc}") from exc
        limit = cfg.data.max_words
        pairs = [p for p in pairs if not limit or (len(p[0].split()) <= limit and len(p[1].split()) <= limit)]
        if not pairs:
            raise wl.DataError(
                f"client {client}: train-file {train_file} has no pair of at most {limit} words per side"
            )
        return pairs

    def describe(self, client: int) -> dict[str, Any]:
        out = self.workload.describe(client)
        if self.cfg.train.init == "public":  # where every client started, and what that model scores alone
            report = self.public().report
            out.update(
                {
                    "public_model": report["key"],
                    "public_model_pairs": report["pairs"],
                    "public_model_dropped": report["dropped"],
                    "public_model_train_s": report["train_s"],
                    "public_model_test_loss": report["test_loss"],
                    "public_model_bleu": report["bleu"],
                }
            )
        return out

    # model and training
    def initial_model(self) -> torch.nn.Module:
        """The run seed's random model, or the public model (``train.init = "public"``); with
        ``model.adapters = "lora"``, LoRA adapters on it, only they trainable (seeded from the run seed); with
        ``"bitfit"``, only its bias terms trainable."""
        cfg = self.cfg
        model: torch.nn.Module = wl.initial_model(cfg, self.workload)
        if cfg.train.init == "public":
            model.load_state_dict(self.public().state)
        if cfg.model.adapters == "bitfit":
            from ..models.adapters import bitfit

            model = bitfit(model)
        if cfg.model.adapters == "lora":
            from ..models.adapters import add_lora

            m = cfg.model
            model = add_lora(
                model,
                rank=m.lora_rank,
                alpha=m.lora_alpha,
                dropout=m.lora_dropout,
                targets=m.lora_targets,
                seed=derive_seed(cfg.seed, "lora-init"),
                train=m.lora_train,
                last_layers=m.lora_layers,
            )
        return model

    def public(self):
        """The public model (``tasks/public.py``): trained once, cached by its data and configuration."""
        from .public import public_model

        return public_model(self.cfg, self.workload)

    def new_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        return wl.new_optimizer(self.cfg, model)

    @property
    def label_smoothing(self) -> float:
        return self.cfg.train.label_smoothing

    @property
    def grad_clip(self) -> float:
        return self.cfg.train.clip_norm

    def train_local(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        shard: Any,
        *,
        seed: int,
        step: LocalStep | None = None,
        client: int | None = None,
    ) -> dict[str, float]:
        if self.cfg.privacy.unit == "record":  # DP-SGD (tasks/record_dp.py)
            from . import dp_canaries, record_dp

            return record_dp.train(
                self.cfg,
                model,
                optimizer,
                shard,
                seed=seed,
                step=step,
                canaries=dp_canaries.canaries_of_client(self.cfg, self.audit_canaries(), client),
                federation_sizes=self.shard_sizes(),
                client=client,
                public=self.subspace_pairs(),
            )
        return wl.train_local(self.cfg, _s2s(model), optimizer, shard, seed=seed, step=step)

    # evaluation
    def test_loss(self, model: torch.nn.Module) -> float:
        return wl.test_loss(self.cfg, _s2s(model), self.workload)

    def round_metrics(self, model: torch.nn.Module) -> dict[str, float]:
        """With a planted backdoor (``federation.faults``), its success on the first ``ROUND_BACKDOOR_SIZE``
        triggered test sources, every round: how fast it takes and how long it lasts."""
        if self.cfg.federation.backdoor() is None:
            return {}
        return {"backdoor_success": self.backdoor_success(model, size=ROUND_BACKDOOR_SIZE)}

    def final_metrics(
        self, model: torch.nn.Module, output_dir: str | None
    ) -> tuple[dict[str, float], dict[str, str], dict[str, list[str]]]:
        """(scores, labels, samples): BLEU, chrF, METEOR, BERTScore; decoded test sentences written to
        ``<output_dir>/translations.tsv`` on the client's machine; three sample translations."""
        scores, triples = translation_scores(self.cfg, _s2s(model), self.workload)
        labels = {k: v for k, v in scores.items() if isinstance(v, str)}  # e.g. bertscore_model
        metrics = {k: v for k, v in scores.items() if not isinstance(v, str)}
        if self.cfg.federation.backdoor() is not None:
            metrics["backdoor_success"] = self.backdoor_success(model)
        if output_dir:
            labels["translations"] = str(write_translations(Path(output_dir) / "translations.tsv", triples))
        sample = triples[:SAMPLE_TRANSLATIONS]
        samples = (
            {
                "source": [s for s, _, _ in sample],
                "reference": [r for _, r, _ in sample],
                "hypothesis": [h for _, _, h in sample],
            }
            if sample
            else {}
        )
        return metrics, labels, samples

    def export_kwargs(self) -> dict[str, Any]:
        return {"tokenizer": self.workload.tokenizer}

    def _encode(self, pairs) -> list[tuple[list[int], list[int]]]:
        return encode_pairs(pairs, self.workload.tokenizer, max_len=self.cfg.model.max_len)

    def own_metrics(self, model: torch.nn.Module, client: int) -> dict[str, float]:
        """Loss, BLEU and chrF on the client's own held-out pairs (``data.own_test_size`` of its domains)."""
        pairs = self.workload.own_test(client)
        if not pairs:
            return {}
        scores, _ = translation_scores(self.cfg, _s2s(model), self.workload, pairs, extra_metrics=False)
        return {
            "own_test_loss": wl.test_loss(self.cfg, _s2s(model), self.workload, self._encode(pairs)),
            "own_bleu": float(scores["bleu"]),
            "own_chrf": float(scores["chrf"]),
        }

    def quick_scores(self, model: torch.nn.Module) -> dict[str, float]:
        scores, _ = translation_scores(self.cfg, _s2s(model), self.workload, extra_metrics=False)
        return {"bleu": float(scores["bleu"]), "chrf": float(scores["chrf"])}

    def shard_sizes(self) -> tuple[int, ...]:
        """Every client's training pairs (the run's partition, which every party derives alike)."""
        return tuple(len(self.workload.shard(c)) for c in range(self.cfg.federation.clients))

    def subspace_pairs(self) -> list | None:
        """The first ``privacy.subspace_pairs`` public pairs, encoded, whose gradients span DP-SGD's subspace
        (``privacy.subspace_dim`` > 0; else None); the same on every client."""
        if not self.cfg.privacy.subspace_dim:
            return None
        if self._subspace_pairs is None:
            from .public import public_pairs

            self._subspace_pairs = self._encode(
                public_pairs(self.cfg, self.workload)[0][: self.cfg.privacy.subspace_pairs]
            )
        return self._subspace_pairs

    def audit_canaries(self):
        """The audit's gradient canaries (``privacy.audit_canaries``; ``tasks/dp_canaries.py``), placed by the initial
        model's gradients on the first 64 public pairs; computed once per task."""
        if not self.cfg.privacy.audit_canaries:
            return None
        if self._canaries is None:
            from . import dp_canaries
            from .public import public_pairs

            reference = self._encode(public_pairs(self.cfg, self.workload)[0][:64])
            self._canaries = dp_canaries.audit_canaries(self.cfg, self.initial_model(), reference)
        return self._canaries

    def personal_copy(self, model: torch.nn.Module) -> torch.nn.Module:
        from ..models.adapters import has_adapters, merged

        if self.cfg.federation.finetune_params == "all" and has_adapters(model):
            return merged(model)  # the plain model, adapters merged in, every weight trainable
        personal = copy.deepcopy(model)
        if self.cfg.federation.finetune_params == "all":  # BitFit's frozen weights train too
            personal.requires_grad_(True)
        return personal

    def finetune(
        self, model: torch.nn.Module, shard: Any, *, epochs: int, lr_scale: float, seed: int
    ) -> dict[str, float]:
        from . import record_dp, record_dp_checks

        if self.cfg.privacy.unit == "record" and record_dp_checks.finetune_under_dp(self.cfg):  # in the planned budget
            out = record_dp.train(
                self.cfg,
                model,
                self.new_optimizer(model),
                shard,
                seed=seed,
                finetune_epochs=epochs,
                lr=self.cfg.train.lr * lr_scale,
                federation_sizes=self.shard_sizes(),
            )
            return {
                "finetune_s": out["train_s"],
                "finetune_loss": out["train_loss"],
                "finetune_record_epsilon": out["record_epsilon"],
            }
        return wl.finetune(self.cfg, _s2s(model), shard, epochs=epochs, lr=self.cfg.train.lr * lr_scale, seed=seed)

    def membership_candidates(self, client: int, count: int, seed: int) -> tuple[list, list]:
        """A seeded sample of the client's training pairs, and as many of its held-out own pairs (same domains,
        trained on by no client); needs ``data.own_test_size`` > 0."""
        held_out = self.workload.own_test(client)
        if not held_out:
            raise wl.DataError(
                "the membership attack needs pairs of each client's own domains that no client "
                "trained on: set data.own_test_size > 0"
            )
        rng = random.Random(derive_seed(seed, "membership", client))
        n = min(count, len(held_out), len(self.workload.shard(client)))
        return rng.sample(self.workload.shard(client), n), rng.sample(held_out, n)

    def population_pool(self, count: int, seed: int) -> list[tuple[list[int], list[int]]]:
        """Up to ``count`` encoded pairs (like ``shard``) of the public split, seeded: data no client trained on and
        no membership candidate, for LiRA's reference models (``attack/lira.py``)."""
        public = self.workload.splits.public
        return self._encode(random.Random(derive_seed(seed, "population")).sample(public, min(count, len(public))))

    def example_losses(self, model: torch.nn.Module, examples: list) -> list[float]:
        return wl.pair_losses(self.cfg, _s2s(model), self.workload, self._encode(examples))

    def final_log(self, metrics: dict[str, Any]) -> str:
        return (
            f"BLEU {metrics['bleu']:.2f} · chrF {metrics['chrf']:.2f}"
            + (f" · METEOR {metrics['meteor']:.3f}" if "meteor" in metrics else "")
            + (f" · BERTScore F1 {metrics['bertscore_f1']:.3f}" if "bertscore_f1" in metrics else "")
        )


def write_translations(path: Path, triples: list[tuple[str, str, str]]) -> Path:
    """``source<TAB>reference<TAB>hypothesis`` per decoded test sentence, after a header line
    (tabs and line breaks inside a sentence become spaces)."""
    path.parent.mkdir(parents=True, exist_ok=True)

    def clean(text: str) -> str:
        return " ".join(text.replace("\t", " ").splitlines())

    lines = ["source\treference\thypothesis"] + ["\t".join(clean(x) for x in t) for t in triples]
    tmp = path.with_suffix(".tsv.tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
