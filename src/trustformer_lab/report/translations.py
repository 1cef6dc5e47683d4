"""Translations people read: test sources decoded by the final model of finished runs, and by the public model they
started from (greedy decoding, as the backdoor's success is scored). Used by ``scripts/translations.py`` and
``scripts/backdoor_translations.py``."""

from __future__ import annotations

import json
from pathlib import Path

from trustformer.config import RunConfig
from trustformer.config.load import build_config
from trustformer.evaluation.translation import translate
from trustformer.export import load_translation_model
from trustformer.export.run_folders import find_models
from trustformer.models.transformer import Seq2SeqTransformer
from trustformer.tasks import translation_workload as wl
from trustformer.tasks.public import cached_state


def run_config(run: Path) -> RunConfig:
    """The configuration a finished run recorded (its ``summary.json``)."""
    return build_config(json.loads((run / "summary.json").read_text(encoding="utf-8"))["config"])


def final_model(run: Path) -> Seq2SeqTransformer:
    """The model a finished run exported (client 0's, where each client has its own)."""
    return load_translation_model(next(iter(find_models(run).values())))[0]


def public_start(run: Path, workload: wl.Workload) -> Seq2SeqTransformer:
    """The public model a run with ``train.init = "public"`` started from: the very weights it recorded (the cache
    key in its ``summary.json``), not one built again."""
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    key = next((d.get("public_model") for d in summary["data"]["clients"].values()), None)
    if key is None:
        raise ValueError(f"{run}: the run did not start from a public model (train.init = 'public')")
    model = Seq2SeqTransformer(workload.model_config)
    model.load_state_dict(cached_state(run_config(run), key))
    return model.eval()


def owner_fine_tuned(
    model: Seq2SeqTransformer, run: Path, client: int, *, epochs: int = 1, rate: float = 0.1
) -> Seq2SeqTransformer:
    """A copy of ``model`` after owner ``client``'s free fine-tuning on its own shard, as ``trustformer bench
    finetune RUN --epochs 1 --rate 0.1`` runs it (its seed included): of the public start, the control of
    ``scripts/dp_pays.py``. The fine-tuned model stays with its owner in a run; it is rebuilt here to be read."""
    import copy
    import dataclasses

    from trustformer.core.shared import derive_seed
    from trustformer.tasks.run import load_task

    cfg = run_config(run)
    cfg = dataclasses.replace(cfg, privacy=dataclasses.replace(cfg.privacy, finetune="free"))
    task = load_task(cfg)
    tuned = copy.deepcopy(model)
    seed = derive_seed(cfg.seed, "finetune", client, cfg.federation.rounds)
    task.finetune(tuned, task.shard(client), epochs=epochs, lr_scale=rate, seed=seed)
    return tuned.eval()


def decode(model: Seq2SeqTransformer, workload: wl.Workload, cfg: RunConfig, sources: list[str]) -> list[str]:
    """Greedy translations of ``sources``."""
    return translate(model, workload.tokenizer, sources, batch_size=64, max_len=cfg.model.max_len, beam_size=1)


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    """A Markdown table (a ``|`` inside a cell written as ``/``)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in rows]
    return "\n".join(lines)


__all__ = ["decode", "final_model", "markdown_table", "owner_fine_tuned", "public_start", "run_config"]
