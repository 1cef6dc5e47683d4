"""Scoring a translation model: decode test sources and score them against their references (BLEU, chrF, and
optionally METEOR and BERTScore)."""

from __future__ import annotations

import time

from ..config import RunConfig
from ..data.corpus import Pair
from ..evaluation.translation import corpus_bleu, corpus_chrf, translate
from ..models.transformer import Seq2SeqTransformer
from .translation_workload import Workload, cache_dir


def translation_scores(
    cfg: RunConfig,
    model: Seq2SeqTransformer,
    workload: Workload,
    pairs: list[Pair] | None = None,
    *,
    extra_metrics: bool = True,
) -> tuple[dict[str, float | str], list[tuple[str, str, str]]]:
    """Decode the first ``eval.bleu_size`` test sources (or ``pairs``) and score them against their references.

    Scores: sacreBLEU corpus ``bleu`` and ``chrf`` (0-100); ``meteor`` (mean sentence METEOR with
    WordNet synonyms, 0-1) unless ``eval.meteor`` is off; ``bertscore_f1`` (mean F1, 0-1) and
    ``bertscore_model`` (the model used, a string) unless ``eval.bertscore`` is off (both only with
    ``extra_metrics``); ``decode_s`` and ``score_s`` (seconds). Also returns the (source, reference,
    hypothesis) triples.
    """
    if pairs is None:
        pairs = workload.splits.test[: cfg.eval.bleu_size or len(workload.splits.test)]
    sources = [src for src, _ in pairs]
    references = [tgt for _, tgt in pairs]
    started = time.perf_counter()
    hypotheses = translate(
        model,
        workload.tokenizer,
        sources,
        batch_size=cfg.eval.batch_size,
        max_len=cfg.model.max_len,
        beam_size=cfg.eval.beam_size,
    )
    decoded = time.perf_counter()
    scores: dict[str, float | str] = {
        "bleu": corpus_bleu(hypotheses, references),
        "chrf": corpus_chrf(hypotheses, references),
    }
    if cfg.eval.meteor and extra_metrics:
        from ..evaluation.meteor import corpus_meteor

        scores["meteor"] = corpus_meteor(hypotheses, references, cache_dir=cache_dir(cfg))
    if cfg.eval.bertscore and extra_metrics:
        from ..evaluation.bertscore import corpus_bertscore

        f1, label = corpus_bertscore(
            hypotheses,
            references,
            model=cfg.eval.bertscore_model,
            layers=cfg.eval.bertscore_layers,
            batch_size=cfg.eval.batch_size,
        )
        scores["bertscore_f1"], scores["bertscore_model"] = f1, label
    scores["decode_s"] = decoded - started
    scores["score_s"] = time.perf_counter() - decoded
    return scores, list(zip(sources, references, hypotheses, strict=True))
