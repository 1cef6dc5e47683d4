"""Models trained by Trustformer."""

from trustformer.models.transformer import Seq2SeqTransformer, TransformerConfig, build_optimizer

__all__ = ["Seq2SeqTransformer", "TransformerConfig", "build_optimizer"]
