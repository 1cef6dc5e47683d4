"""Models trained by Trustformer."""

from trustformer.models.transformer import Seq2SeqTransformer, TransformerConfig

__all__ = ["Seq2SeqTransformer", "TransformerConfig"]
