"""Engines that run the Flower apps (``trustformer.app``): in one process (``inprocess``) and on Flower's
Simulation Engine (``simulation``). A Flower deployment, the third, is ``trustformer.deploy``."""
