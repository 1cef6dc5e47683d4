"""LoRA adapters (Hu et al. 2021) on the project's models, through ``peft``'s low-level API.

``add_lora`` injects ``peft`` LoRA layers into a model in place (``peft.inject_adapter_in_model``: the model keeps
its class, its methods and its readable names, each adapted layer gaining ``lora_A`` / ``lora_B`` beside its
``base_layer``) and freezes everything else, so a model's trainable tensors are exactly its adapters: what the
protocols send, code and count. ``merged`` returns a plain copy with every adapter merged into its base layer
(``peft``'s own ``merge``), which is what a saved model holds.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

__all__ = ["LORA_MODULES", "add_lora", "adapter_names", "bitfit", "has_adapters", "merged"]

LORA_MODULES = {
    "attention": ("q_proj", "k_proj", "v_proj", "out_proj"),  # every self- and cross-attention projection
    "ffn": ("fc1", "fc2"),  # every feed-forward block
    "embedding": ("embedding",),  # the tied embedding (also the output projection: Seq2SeqTransformer._project)
}
"""``model.lora_targets`` group → the module names (suffixes) ``peft`` adapts."""


def add_lora(
    model: nn.Module,
    *,
    rank: int,
    alpha: float,
    dropout: float,
    targets: tuple[str, ...],
    seed: int,
    train: str = "ab",
    last_layers: int = 0,
) -> nn.Module:
    """Inject LoRA adapters into ``model`` (in place; returned) and freeze every other parameter. The adapters'
    random ``lora_A`` initialisation is drawn from ``seed`` (``lora_B`` starts at zero, so the adapted model is
    the base model until it trains), the same on every client. ``train = "b"``: ``lora_A`` stays frozen at that
    start too, only ``lora_B`` trains (FFA-LoRA, Sun et al. 2024). ``last_layers`` = N > 0: only the last N layers of
    each layer stack (``<stack>.layers.<i>``) get adapters, and the embedding if it is a target."""
    from peft import LoraConfig, inject_adapter_in_model

    names = sorted({name for group in targets for name in LORA_MODULES[group]})
    modules: list[str] | str = last_layers_pattern(model, names, last_layers) if last_layers else names
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,  # type: ignore[arg-type]  # peft annotates it int; a float works (scaling = alpha / r)
        lora_dropout=dropout,
        target_modules=modules,
        bias="none",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = inject_adapter_in_model(config, model)
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter(name) and (train == "ab" or "_B." in name or name.endswith("_B")))
    return model


def last_layers_pattern(model: nn.Module, suffixes: list[str], last: int) -> str:
    """A regular expression (``peft`` matches it against each module's full name) for the modules ending in one of
    ``suffixes`` inside the last ``last`` layers of every stack ``<stack>.layers.<i>``, or outside every stack (the
    embedding)."""
    import re

    stacks: dict[str, int] = {}
    for name, _module in model.named_modules():
        found = re.fullmatch(r"(.+)\.layers\.(\d+)", name)
        if found:
            stacks[found[1]] = max(stacks.get(found[1], -1), int(found[2]))
    inside = [
        rf"{re.escape(stack)}\.layers\.{i}\..*"
        for stack, top in sorted(stacks.items())
        for i in range(max(0, top + 1 - last), top + 1)
    ]
    ends = "|".join(re.escape(s) for s in suffixes)
    outside = r"(?!.*\.layers\.\d+\.)(?:.*\.)?"
    return rf"(?:{'|'.join(inside)}|{outside})(?:{ends})"


def is_adapter(name: str) -> bool:
    """Whether a parameter name is a LoRA tensor (``lora_A``, ``lora_B``, ``lora_embedding_A``/``_B``)."""
    return ".lora_" in name or name.startswith("lora_")


def adapter_names(model: nn.Module) -> list[str]:
    return [name for name, _ in model.named_parameters() if is_adapter(name)]


def has_adapters(model: nn.Module) -> bool:
    """Whether ``model`` holds LoRA tensors (by name: no ``peft`` import for a plain model)."""
    return any(is_adapter(name) for name, _ in model.named_parameters())


def merged(model: nn.Module) -> nn.Module:
    """A copy of ``model`` with every adapter merged into its base layer by ``peft`` and the LoRA layers replaced
    by their (merged) base layers: the plain model, with the plain names, computing what the adapted one does."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    plain = copy.deepcopy(model)
    for name, module in list(plain.named_modules()):
        if not isinstance(module, BaseTunerLayer):
            continue
        module.merge()
        parent_name, _, child = name.rpartition(".")
        setattr(plain.get_submodule(parent_name) if parent_name else plain, child, module.get_base_layer())
    for param in plain.parameters():
        param.requires_grad_(True)
    return plain


def bitfit(model: nn.Module) -> nn.Module:
    """BitFit (Ben Zaken et al. 2022): freeze every parameter of ``model`` but its bias terms (in place; returned).
    Its trainable tensors, what trains, travels and takes DP's noise, are then the biases alone."""
    biases = 0
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith(".bias") or name == "bias")
        biases += int(p.requires_grad)
    if not biases:
        raise ValueError("model.adapters = 'bitfit': the model has no bias term to train")
    return model
