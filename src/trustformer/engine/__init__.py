"""Engines that run the Flower apps (``trustformer.app``): in one process (``inprocess``, the default) and on
Flower's Simulation Engine (``simulation``). A Flower deployment, the third, is ``trustformer.deploy``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported by the CLI before any engine is chosen: it imports nothing at run time
    from ..config import RunConfig


def run(cfg: RunConfig) -> dict[str, Any]:
    """Run the federation of ``cfg`` on ``runtime.engine``; returns the summary (also in ``<out>/summary.json``)."""
    if cfg.runtime.engine == "simulation":
        from .simulation import run_simulation

        return run_simulation(cfg)
    from .inprocess import run_in_process

    return run_in_process(cfg)
