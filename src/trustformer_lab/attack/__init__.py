"""Attacks that measure what a federation's server learns (``trustformer attack ...``)."""
