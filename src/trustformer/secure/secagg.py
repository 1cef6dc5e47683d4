"""Secure aggregation of client vectors (Bonawitz et al. 2017; SecAgg+ semantics, Bell et al. 2020).

The server learns only the SUM of the survivors' vectors, and the sum is still recovered when
clients drop out after the masking setup.

Protocol (one instance per round; ``session`` binds run id and round so no mask ever repeats):

1. ``advertise_keys``: every client makes two fresh X25519 key pairs, ``c`` (to encrypt shares)
   and ``s`` (to agree pairwise mask seeds), and sends both public keys. The server checks and
   broadcasts them (``collect_keys``); the clients that advertised form U1.
2. ``share_keys``: client i draws a self-mask seed ``b_i`` and Shamir-shares ``b_i`` and its masking
   private key ``s_sk_i`` among U1 (threshold t). Each recipient's pair of shares is encrypted
   with AES-256-GCM under a key derived (HKDF-SHA256) from X25519(c_sk_i, c_pk_j); the associated
   data binds session, sender and recipient. The server only routes ciphertexts (``route_shares``);
   the senders form U2.
3. ``masked_input``: client i sends, in Z_{2^64},
   ``y_i = q(x_i) + PRG(b_i) + sum_{j in U2, j>i} PRG(s_ij) - sum_{j in U2, j<i} PRG(s_ij)``
   where ``q`` is fixed-point quantisation and ``s_ij`` = HKDF(X25519(s_sk_i, s_pk_j)). The
   clients whose ``y`` arrives are the survivors U3, the rest of U2 the dropped ones.
4. ``unmask``: each survivor reveals its shares of ``b_j`` for every survivor j and of ``s_sk_j``
   for every dropped j -- never both for one client (that would unmask an individual input).
   The server reconstructs the seeds, removes the self masks of the survivors and the pairwise
   masks the survivors added against the dropped clients; the pairwise masks between survivors
   cancel exactly in the integer sum.

Threat model: semi-honest (honest-but-curious) server and clients. The server follows the protocol
but tries to learn individual inputs from what it sees; it learns nothing beyond the sum of the
survivors' inputs as long as fewer than t clients collude with it. The consistency-check round of
the actively secure variant (signatures over U3) is not implemented, so a server that lies to
different clients about who dropped is out of scope; each client still refuses to reveal both
secrets of one client within its own view, across repeated requests too. For correctness, at least
t clients must survive each step; t > n/2 is the usual choice. The neighbour graph is the complete
graph (every pair of clients masks against each other), which is what SecAgg+ reduces to for the
few clients of a federation here.

Message flow per round (client ids are any distinct integers in [0, 2^64), e.g. partition ids)::

    broadcast = server.collect_keys({i: clients[i].advertise_keys() for i in ids})
    routed = server.route_shares({i: clients[i].share_keys(broadcast) for i in ids})
    survivors, dropped = server.collect_masked({i: clients[i].masked_input(x[i], routed[i]) for i in alive})
    total = server.unmask({i: clients[i].unmask(survivors, dropped) for i in survivors})

A client's own shares never leave it (``share_keys`` returns ciphertexts for the other clients
only). Client state spans several messages: ``SecAggClient.to_bytes``/``from_bytes`` keep it in
the client's own state store (JSON, no pickle; it contains the client's private keys).

Fixed-point encoding, key derivation and the mask PRG are in ``masking.py``, Shamir sharing over the
prime 2^521 - 1 in ``shamir.py``; the encrypted shares use AES-256-GCM (``cryptography`` package).

The protocol's parts, one job each: ``secagg_common.py`` (parameters and shared checks), ``secagg_client.py``
(:class:`SecAggClient`) and ``secagg_server.py`` (:class:`SecAggServer`); this module names them together. Its
benchmark lives with the experiments (``bench/secagg_bench.py``).
"""

from __future__ import annotations

from .masking import SecAggError, quantization_error_bound
from .secagg_client import SecAggClient
from .secagg_common import SecAggParams
from .secagg_server import SecAggServer

__all__ = [
    "SecAggClient",
    "SecAggError",
    "SecAggParams",
    "SecAggServer",
    "quantization_error_bound",
]
