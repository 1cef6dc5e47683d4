"""What a run's summary says about each task's final evaluation: the scores every client's reply must carry
and the task's fields of ``summary.json``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# the scores every client's final evaluation reply must carry (numbers, besides test_loss and model_bytes);
# summary.json lists each per client
FINAL_METRICS = {
    "translation": ("bleu", "chrf"),
    "image-classification": ("accuracy",),
    "segmentation": ("dice", "iou", "pixel_accuracy"),
}
SAMPLE_TRANSLATIONS = 3  # sample translations a client sends with its scores
PERSONAL = ("own_", "ft_", "finetune_")  # scores on a client's own held-out data, after fine-tuning, and its cost


def task_summary(task: str, out: str, per_client: dict[int, dict[str, Any]], order: list[int]) -> dict[str, Any]:
    """The task's fields of ``summary.json``, each a list over clients in ``client_ids`` order (or a
    dict by client). Translation: ``bleu``, ``chrf``, ``meteor``, ``bertscore_f1``, ``bertscore_model``,
    ``translations``, ``samples``. Image classification: ``accuracy`` and ``per_class_accuracy``
    (client → class → accuracy). Segmentation: ``dice``, ``iou``, ``pixel_accuracy``, their per-image
    means, and ``figures`` (``masks``: client → the figure of predicted beside true masks it drew)."""
    fields: dict[str, Any] = {"task": task}
    personal = sorted(
        {
            k
            for c in order
            for k, v in per_client[c].items()  # own-distribution and fine-tuned scores
            if k.startswith(PERSONAL) and isinstance(v, (int, float)) and not isinstance(v, bool)
        }
    )
    fields.update({k: [per_client[c].get(k) for c in order] for k in personal})
    if task == "translation":
        fields.update(
            bleu=[per_client[c]["bleu"] for c in order],
            chrf=[per_client[c]["chrf"] for c in order],
            meteor=[per_client[c].get("meteor") for c in order],
            bertscore_f1=[per_client[c].get("bertscore_f1") for c in order],
            # federation.faults kind backdoor: the share of triggered test sources translated to the target
            **(
                {"backdoor_success": [per_client[c].get("backdoor_success") for c in order]}
                if any("backdoor_success" in per_client[c] for c in order)
                else {}
            ),
            bertscore_model=next(
                (
                    per_client[c]["labels"]["bertscore_model"]
                    for c in order
                    if "bertscore_model" in per_client[c]["labels"]
                ),
                None,
            ),
            translations={
                str(c): under(out, per_client[c]["labels"]["translations"])
                for c in order
                if "translations" in per_client[c]["labels"]
            },
            samples={str(c): per_client[c]["samples"] for c in order},
        )
        return fields
    for key in FINAL_METRICS[task]:
        fields[key] = [per_client[c][key] for c in order]
    if task == "image-classification":
        fields["per_class_accuracy"] = {
            str(c): dict(
                zip(per_client[c]["data"].get("classes", []), per_client[c].get("per_class_accuracy", []), strict=False)
            )
            for c in order
        }
    else:
        for key in ("dice_per_image", "iou_per_image"):
            fields[key] = [per_client[c].get(key) for c in order]
        fields["figures"] = {
            "masks": {
                str(c): under(out, per_client[c]["labels"]["masks"])
                for c in order
                if "masks" in per_client[c]["labels"]
            }
        }
    return fields


def under(out: str, path: str) -> str:
    """``path`` relative to the run's output folder when it lies inside it (as written by in-process clients)."""
    try:
        return str(Path(path).resolve().relative_to(Path(out).resolve()))
    except ValueError:
        return path


__all__ = ["FINAL_METRICS", "SAMPLE_TRANSLATIONS", "task_summary", "under"]
