"""Trustformer: privacy-preserving, communication-efficient federated training of Transformers."""

__version__ = "0.1.0"
