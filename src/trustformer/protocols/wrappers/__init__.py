"""Layers around a protocol that change some of its hooks and forward the others (``base.py``): payload coding,
differential privacy, the server's defences and the attack harness's observer."""
