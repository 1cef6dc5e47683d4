"""Centralized training: one client holds the union of all shards (the upper reference).

It runs the local protocol on a single node; the runtime gives that node every shard.
"""

from __future__ import annotations

from .local import LocalOnly


class Centralized(LocalOnly):
    name = "centralized"
