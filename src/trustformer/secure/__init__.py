"""Secure exchange (``secure.mode``): an attested aggregator and sealed payloads (``tee``, a software
emulation of a TEE), pairwise-masked secure aggregation (``secagg``), or both.

``codec`` (safe payload encoding), ``attestation`` (measurement, quotes), ``sealing`` (session keys,
AES-256-GCM), ``tee`` (the backend interface and its emulation), ``secagg`` (secure aggregation),
``exchange`` (what the round loop calls), ``cli`` (``trustformer attest``).
"""
