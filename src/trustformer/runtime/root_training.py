"""FLTrust's server update (``robust.aggregator = "fltrust"``, docs/robustness.md) and the clean fine-tuning pass
(``robust.root_finetune``): the task trains a copy of the global model on root data, on the server.

The root data are ``robust.root_size`` pairs of the corpus's public split (``RunTask.population_pool``: the
split that trains the tokenizer and belongs to no client, drawn before the client pool, so its pairs are no
client's), seeded from the run seed. The protocols import no task, so the runtime hands the defence this
callable (:func:`~trustformer.protocols.wrappers.robust.provide_root_training`, called when
``runtime/client.py`` is imported, as it is in every process the apps run in).
"""

from __future__ import annotations

from typing import Any

from ..config import RunConfig
from ..core.shared import Tensors, assign_tensors, derive_seed, trainable_tensors
from ..errors import UncheckedConfigError
from ..protocols.wrappers.robust import RootTraining
from ..tasks.run import load_task


def root_training(cfg: RunConfig) -> RootTraining:
    """The server's training on root data: (global model, optimizer state or None, seed) -> (the trained model's
    tensors on the CPU, the optimizer's state). One model is built once and overwritten each round; the
    optimizer's state (its step count drives the learning-rate schedule) travels in the defence's checkpointed
    state, so the root training follows the task's recipe as a client with ``robust.root_size`` pairs would."""
    task = load_task(cfg)
    try:
        root = task.population_pool(cfg.robust.root_size, derive_seed(cfg.seed, "fltrust-root-data"))
    except NotImplementedError as exc:
        option = (
            "robust.aggregator = 'fltrust'"
            if cfg.robust.aggregator == "fltrust"
            else f"robust.root_finetune = {cfg.robust.root_finetune}"
        )
        raise UncheckedConfigError(  # refused at load (config/composition.py: ROOT_DATA_TASKS)
            f"{option} needs root data no client holds, which task = {cfg.task!r} lacks: {exc}"
        ) from None
    model = task.initial_model()

    def train(global_model: Tensors, optimizer_state: dict[str, Any] | None, seed: int) -> tuple[Tensors, Any]:
        assign_tensors(model, global_model)
        optimizer = task.new_optimizer(model)
        if optimizer_state is not None:
            optimizer.load_state_dict(optimizer_state)
        task.train_local(model, optimizer, root, seed=seed)
        return {n: t.cpu() for n, t in trainable_tensors(model).items()}, optimizer.state_dict()

    return train


__all__ = ["root_training"]
