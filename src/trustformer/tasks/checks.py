"""Fail fast: check, before any training, that the translation metrics a run asks for can be computed.

Clients compute the scores only after the last round; without this check a missing WordNet would
surface as every client failing its final evaluation after all the training.
"""

from __future__ import annotations

from ..config import RunConfig


def check_metrics(cfg: RunConfig) -> None:
    """Raise WordNetUnavailableError / BERTScoreUnavailableError (naming what is missing) when METEOR
    or BERTScore is on and cannot run here. Cheap: finds files, loads no model. Translation only (the
    image tasks score with accuracy, Dice and IoU)."""
    if cfg.task != "translation":
        return
    if cfg.eval.meteor:
        from ..evaluation.meteor import wordnet_folder
        from .translation_workload import cache_dir

        wordnet_folder(cache_dir(cfg))
    if cfg.eval.bertscore:
        from ..evaluation.bertscore import resolve_model

        resolve_model(cfg.eval.bertscore_model, cfg.eval.bertscore_layers)


__all__ = ["check_metrics"]
