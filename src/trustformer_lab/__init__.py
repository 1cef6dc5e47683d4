"""Trustformer's experiments: benchmarks (``bench``), attacks and audits (``attack``), reports (``report``) and the
papers' reproductions (``reproduce``), apart from the product (``trustformer``), which never imports them.

They reach the command line as ``trustformer bench``, ``attack``, ``report`` and ``reproduce`` through the entry-point
group ``trustformer.commands`` (``commands.py``; ``pyproject.toml``), the way a plugin adds commands to a tool.
"""
