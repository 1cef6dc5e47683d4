"""Federated protocols, one module each, all driven by the same round loop (``trustformer.app``)."""

from __future__ import annotations

from ..config import RunConfig
from .base import ClientSession, FederatedProtocol
from .centralized import Centralized
from .fedavg import FedAvg
from .local import LocalOnly


def get_protocol(cfg: RunConfig) -> FederatedProtocol:
    """The protocol object named by ``federation.strategy``."""
    name = cfg.federation.strategy
    if name == "fedavg":
        return FedAvg()
    if name == "local":
        return LocalOnly()
    if name == "centralized":
        return Centralized()
    if name == "trustformer":
        from .trustformer import Trustformer

        return Trustformer(cfg)
    if name == "fedavg-topk":
        from .fedavg_topk import FedAvgTopK

        return FedAvgTopK(cfg)
    if name == "dp-fedavg":
        from .dp_fedavg import DPFedAvg

        return DPFedAvg(cfg)
    if name == "dp-fedsam":
        from .dp_fedsam import DPFedSAM

        return DPFedSAM(cfg)
    if name == "dp-blur-lus":
        from .dp_blur_lus import DPBlurLus

        return DPBlurLus(cfg)
    if name == "fedpc":
        from .fedpc import FedPC

        return FedPC(cfg)
    if name == "phong":
        from .phong import Phong

        return Phong(cfg)
    raise ValueError(f"unknown strategy {name!r}")


__all__ = ["ClientSession", "FederatedProtocol", "get_protocol"]
