"""The task of a run, as the client runtime (``runtime/client.py``) uses it, chosen by the config's ``task``.

Every run task gives the round loop the same things: a client's training shard (``ALL_SHARDS``: the
union, for centralized training) and a description of it, the identical initial model on
``runtime.device``, the local optimizer, one round of local training (a protocol's own step, e.g.
SAM, replaces the plain one), the loss on the shared test set, and the final metrics. The protocols
never see a task: they only move the model's tensors.

- ``translation``: :class:`~trustformer.tasks.translation.TranslationTask` (``translation_workload.py``);
- ``image-classification`` / ``segmentation``: :class:`ImageRunTask` around the
  :class:`~trustformer.tasks.base.Task` of ``tasks/image.py`` / ``tasks/segmentation.py``.

Built once per process and configuration (the data are deterministic for a seed, so every client
process builds the same shards).
"""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch

from ..config import RunConfig
from ..core.shared import ALL_SHARDS, LocalStep, select_device, trainable_tensors
from .results import FINAL_METRICS

if TYPE_CHECKING:
    from .image import ImageClassificationTask
    from .segmentation import SegmentationTask

MASK_SAMPLES = 4  # segmentation: test slices a client draws beside the truth at the end


class RunTask(Protocol):
    """What the round loop asks of the task of a run (``TranslationTask``, ``ImageRunTask``).

    - ``shard(client, train_file="")``: the client's training examples (``ALL_SHARDS``: every shard);
      ``len()`` is the ``num_examples`` the client reports;
    - ``describe(client)``: JSON values recorded in ``summary.json["data"]``;
    - ``initial_model()``: the identical initial model (seeded from the run seed) on ``runtime.device``;
    - ``new_optimizer(model)``; ``label_smoothing``: of the task's loss, and ``grad_clip``: the L2 bound its own
      step clips gradients to (0: none), for a protocol's own step;
    - ``train_local(model, optimizer, shard, *, seed, step=None, client=None)``: one round of local training
      (``client``: whose shard it is), returning at least ``train_loss``, ``steps`` and ``train_s``; with
      ``privacy.unit = "record"`` it is DP-SGD (``tasks/record_dp.py``) and also returns ``record_epsilon``;
    - ``test_loss(model)``: on the shared held-out test set; ``round_metrics(model)``: what else a client
      measures every round (translation: a planted backdoor's success);
    - ``final_metrics(model, output_dir)``: (scores, string labels, samples) of the final evaluation,
      the scores including ``FINAL_METRICS[task]``; ``final_log(scores)``: their log line;
    - ``export_kwargs()``: what a saved model needs beside its weights (the tokenizer; an image model's input
      description), for ``export.export_model``.
    """

    name: str

    def shard(self, client: int, train_file: str = "") -> Any: ...

    def describe(self, client: int) -> dict[str, Any]: ...

    def initial_model(self) -> torch.nn.Module: ...

    def new_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer: ...

    @property
    def label_smoothing(self) -> float: ...

    @property
    def grad_clip(self) -> float: ...

    def train_local(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        shard: Any,
        *,
        seed: int,
        step: LocalStep | None = None,
        client: int | None = None,
    ) -> dict[str, float]: ...

    def test_loss(self, model: torch.nn.Module) -> float: ...

    def round_metrics(self, model: torch.nn.Module) -> dict[str, float]: ...

    def final_metrics(
        self, model: torch.nn.Module, output_dir: str | None
    ) -> tuple[dict[str, Any], dict[str, str], dict[str, list[str]]]: ...

    def final_log(self, metrics: dict[str, Any]) -> str: ...

    def export_kwargs(self) -> dict[str, Any]:
        """What ``export.export_model`` needs beside the model to write a folder a user can predict with."""
        ...

    def own_metrics(self, model: torch.nn.Module, client: int) -> dict[str, float]:
        """Scores on the client's own held-out data (``own_test_loss``, ``own_bleu``...; {} when it holds none)."""
        ...

    def quick_scores(self, model: torch.nn.Module) -> dict[str, float]:
        """The task's first scores on the shared test set, without writing anything (after fine-tuning)."""
        ...

    def personal_copy(self, model: torch.nn.Module) -> torch.nn.Module:
        """The copy of the final model an owner fine-tunes after the last round (``federation.finetune_params``:
        ``all`` = every weight trains, LoRA adapters merged in first; ``trainable`` = a copy as it is)."""
        ...

    def finetune(
        self, model: torch.nn.Module, shard: Any, *, epochs: int, lr_scale: float, seed: int
    ) -> dict[str, float]:
        """Fine-tune ``model`` on a client's own shard after the last round (``finetune_s`` and its loss)."""
        ...

    def membership_candidates(self, client: int, count: int, seed: int) -> tuple[Any, Any]:
        """(members, non-members) for the membership attack on ``client``: a seeded sample of its training
        examples, and as many examples of the same distribution no client trained on."""
        ...

    def example_losses(self, model: torch.nn.Module, examples: Any) -> list[float]:
        """Each example's loss under ``model``, in order."""
        ...

    def population_pool(self, count: int, seed: int) -> Any:
        """Up to ``count`` training examples (as ``shard`` gives them) from the task's population that no client
        trained on and no membership candidate is, seeded: LiRA's reference models' data (``attack/lira.py``)."""
        ...

    def poisoned_shard(self, client: int, train_file: str, kind: str, share: float, seed: int) -> Any:
        """The shard of a data-poisoning client (``federation.faults``: backdoor, shuffled_targets), seeded."""
        ...


@lru_cache(maxsize=4)
def initial_tensors(cfg: RunConfig) -> dict[str, torch.Tensor]:
    """The identical initial model's trainable tensors of a configuration (what every payload's shapes follow),
    cached per process and configuration (a frozen, hashable object: parsed once, never turned back into text)."""
    return trainable_tensors(load_task(cfg).initial_model())


def load_task(cfg: RunConfig) -> RunTask:
    """The run task of ``cfg.task`` (cached per process and configuration; the image data sets are
    cached by the task modules, the translation workload by ``translation_workload.py``)."""
    return _load_task(cfg)


@lru_cache(maxsize=4)
def _load_task(cfg: RunConfig):
    if cfg.task == "translation":
        from .translation import TranslationTask

        return TranslationTask(cfg)
    return ImageRunTask(cfg)


class ImageRunTask:
    """Image classification or segmentation as a run task: the task module's data, model and training
    with the run's seed, clients, ``data.partition`` / ``data.alpha``, ``train.local_epochs`` and
    ``runtime.device``."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg
        self.name = cfg.task
        device = select_device(cfg.runtime.device)
        self.task: ImageClassificationTask | SegmentationTask
        if cfg.task == "image-classification":
            from .image import ImageClassificationTask

            self.task = ImageClassificationTask(cfg.image, seed=cfg.seed, device=device)
        elif cfg.task == "segmentation":
            from .segmentation import SegmentationTask

            self.task = SegmentationTask(cfg.segmentation, seed=cfg.seed, device=device)
        else:  # pragma: no cover - RunConfig.validate rejects other tasks
            raise ValueError(f"task = {cfg.task!r} is not an image task")
        self.shards = self.task.client_shards(
            cfg.federation.clients, cfg.data.partition, cfg.seed, alpha=cfg.data.alpha
        )

    # data
    def shard(self, client: int, train_file: str = ""):
        if train_file:
            raise ValueError(f"node config 'train-file' applies to task = 'translation' only, not {self.name!r}")
        if client == ALL_SHARDS:
            return self._union()
        if not 0 <= client < len(self.shards):
            raise ValueError(f"partition {client} out of range 0..{len(self.shards) - 1}")
        return self.shards[client]

    def poisoned_shard(self, client: int, train_file: str, kind: str, share: float, seed: int):
        """``shuffled_targets``: ``share`` of the client's examples get the label of another of them (config
        validation refuses ``backdoor`` for the image tasks). Segmentation masks are shuffled between slices."""
        if kind != "shuffled_targets":
            raise ValueError(f"task = {self.name!r} takes the data poisoning kind shuffled_targets, not {kind!r}")
        shard = self.shard(client, train_file)
        rng = np.random.default_rng(seed)
        chosen = np.sort(rng.choice(len(shard), size=max(1, round(share * len(shard))), replace=False))
        if self.name == "image-classification":
            labels = shard.labels.clone()
            labels[torch.from_numpy(chosen)] = labels[torch.from_numpy(rng.permutation(chosen))]
            return type(shard)(shard.images, labels, shard.classes)
        masks = shard.masks.clone()
        masks[torch.from_numpy(chosen)] = masks[torch.from_numpy(rng.permutation(chosen))]
        return type(shard)(shard.images, masks, shard.units, shard.unit_names)

    def _union(self):
        if self.name == "segmentation":
            units = np.sort(np.concatenate([s.unit_ids() for s in self.shards]))
            return self.task.train.select_units(units)
        idx = self.task.partition_indices(
            self.cfg.federation.clients, self.cfg.data.partition, self.cfg.seed, alpha=self.cfg.data.alpha
        )
        return self.task.train.subset(np.sort(np.concatenate(idx)))

    def describe(self, client: int) -> dict[str, Any]:
        """What a run records about the data: the task's description (flattened to JSON scalars and
        lists) and, for classification, this client's examples per class (``class_counts``)."""
        out: dict[str, Any] = {}
        for key, value in self.task.describe().items():
            if key == "config":
                continue
            out[key] = value
        shard = self.shard(client)
        out["train_examples"] = len(shard)
        if self.name == "image-classification":
            out["class_counts"] = [
                int(x) for x in np.bincount(shard.labels.numpy(), minlength=self.task.train.num_classes)
            ]
        else:
            out["train_units"] = int(len(shard.unit_ids()))
        return out

    # model and training
    def initial_model(self) -> torch.nn.Module:
        return self.task.build_model(self.cfg.seed)

    def new_optimizer(self, model: torch.nn.Module) -> torch.optim.Optimizer:
        return self.task.build_optimizer(model)

    @property
    def label_smoothing(self) -> float:
        return float(self.task.config.label_smoothing)

    @property
    def grad_clip(self) -> float:
        return 0.0  # the image tasks' steps do not clip

    def train_local(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        shard: Any,
        *,
        seed: int,
        step: LocalStep | None = None,
        client: int | None = None,
        epochs: int | None = None,
        batch_size: int | None = None,
    ) -> dict[str, float]:
        """``epochs`` (default ``train.local_epochs``) passes with batches of ``batch_size`` (default: the task
        section's); a protocol's ``train_options`` may set both (FedPC's private choices)."""
        return self.task.train_local(
            model,
            optimizer,
            shard,
            seed=seed,
            epochs=epochs or self.cfg.train.local_epochs,
            batch_size=batch_size,
            step=step,
        )

    # evaluation
    def test_loss(self, model: torch.nn.Module) -> float:
        return self.task.test_loss(model)

    def round_metrics(self, model: torch.nn.Module) -> dict[str, float]:
        """Nothing beside the test loss (the image tasks take no backdoor)."""
        return {}

    def final_metrics(
        self, model: torch.nn.Module, output_dir: str | None
    ) -> tuple[dict[str, Any], dict[str, str], dict[str, list[str]]]:
        """(scores, labels, samples). Classification: ``accuracy`` and ``per_class_accuracy`` (a list in
        the order of the data description's ``classes``). Segmentation: ``dice``, ``iou``,
        ``pixel_accuracy`` and the per-image means; with an ``output_dir``, the client also draws a few
        test slices with their true and predicted masks to ``<output_dir>/masks.png`` itself."""
        scores = self.task.final_metrics(model)
        labels: dict[str, str] = {}
        metrics: dict[str, Any] = {}
        for key, value in scores.items():
            if key == "per_class_accuracy":
                metrics[key] = [float(v) for v in value.values()]
            else:
                metrics[key] = float(value)
        if self.name == "segmentation" and output_dir:
            from .figures import mask_figure

            path = Path(output_dir) / "masks.png"
            path.parent.mkdir(parents=True, exist_ok=True)
            mask_figure(
                cast("SegmentationTask", self.task).sample_predictions(model, MASK_SAMPLES),  # name: segmentation
                path,
                title=f"{self.task.config.dataset}: predicted masks beside the truth",
            )
            labels["masks"] = str(path)
        return metrics, labels, {}

    def export_kwargs(self) -> dict[str, Any]:
        return {"input_spec": self.task.input_spec()}

    def own_metrics(self, model: torch.nn.Module, client: int) -> dict[str, float]:
        return {}  # image clients hold no own test split; their shards share the test set's distribution per class

    def quick_scores(self, model: torch.nn.Module) -> dict[str, float]:
        first = FINAL_METRICS[self.name][0]
        return {first: float(self.task.final_metrics(model)[first])}

    def personal_copy(self, model: torch.nn.Module) -> torch.nn.Module:
        return copy.deepcopy(model)  # image models carry no adapters: every weight already trains

    def finetune(
        self, model: torch.nn.Module, shard: Any, *, epochs: int, lr_scale: float, seed: int
    ) -> dict[str, float]:
        optimizer = self.new_optimizer(model)
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * lr_scale
        result = self.train_local(model, optimizer, shard, seed=seed, epochs=epochs)
        return {"finetune_s": result["train_s"], "finetune_loss": result["train_loss"]}

    def membership_candidates(self, client: int, count: int, seed: int) -> tuple[Any, Any]:
        shard = self.shard(client)
        rng = np.random.default_rng([seed, client, 5])
        members = shard.subset(np.sort(rng.choice(len(shard), size=min(count, len(shard)), replace=False)))
        return members, self.task.non_members_like(members, seed)

    def example_losses(self, model: torch.nn.Module, examples: Any) -> list[float]:
        return self.task.example_losses(model, examples)

    def population_pool(self, count: int, seed: int) -> Any:
        raise NotImplementedError(
            f"task = {self.name!r} holds no population apart from the clients' data and the "
            "test set the membership candidates come from: LiRA runs on translation only"
        )

    def final_log(self, metrics: dict[str, Any]) -> str:
        if self.name == "image-classification":
            return f"accuracy {metrics['accuracy']:.4f}"
        return f"Dice {metrics['dice']:.4f} · IoU {metrics['iou']:.4f} · pixel accuracy {metrics['pixel_accuracy']:.4f}"


__all__ = ["ALL_SHARDS", "FINAL_METRICS", "RunTask", "ImageRunTask", "initial_tensors", "load_task"]
