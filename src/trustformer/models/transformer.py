"""Encoder-decoder Transformer for translation (Vaswani et al. 2017), pre-LN variant.

Design choices, all deliberate:

* One shared vocabulary. With ``tie_embeddings`` (the default) a single matrix ``embedding.weight``
  embeds source and target tokens and is reused as the output projection, so it appears exactly
  once in ``state_dict()``.
* Sinusoidal positional encoding: no parameters, any length.
* Pre-LN layers (LayerNorm before each sub-layer, final LayerNorm on encoder and decoder outputs),
  which train stably with Adam at lr 1e-3 without a warm-up schedule.
* Attention masks are boolean, ``True`` meaning "may attend", as in
  ``torch.nn.functional.scaled_dot_product_attention``. Keys equal to ``pad_id`` are masked in
  encoder self-attention, decoder self-attention and cross-attention; decoder self-attention is
  also causal (position t sees positions <= t only).
* Teacher forcing shifts the target by one: decoder input ``tgt[:, :-1]``, labels ``tgt[:, 1:]``.
* Decoding (greedy and beam search) runs the encoder once and caches decoder keys/values.

State-dict names are stable and readable, e.g. ``encoder.layers.0.self_attn.q_proj.weight``,
``decoder.layers.1.cross_attn.k_proj.bias``, ``decoder.layers.1.ffn.fc1.weight``, ``decoder.norm.weight``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "TransformerConfig",
    "Seq2SeqTransformer",
    "TiedEmbedding",
    "causal_mask",
    "eval_mode",
    "sinusoidal_positions",
]


@dataclass(frozen=True)
class TransformerConfig:
    """Sizes and special token ids of a :class:`Seq2SeqTransformer` (defaults: paper Table II)."""

    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int
    d_model: int = 256
    n_heads: int = 8
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    d_ff: int = 512
    max_len: int = 50
    dropout: float = 0.1
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_heads", "n_encoder_layers", "n_decoder_layers", "d_ff", "max_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        for name in ("pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < self.vocab_size:
                raise ValueError(f"{name} must be an int in [0, vocab_size={self.vocab_size}), got {value!r}")
        if len({self.pad_id, self.bos_id, self.eos_id}) != 3:
            raise ValueError(
                f"pad_id, bos_id and eos_id must be distinct, got pad_id={self.pad_id}, "
                f"bos_id={self.bos_id}, eos_id={self.eos_id}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")


# ----------------------------------------------------------------------------- small utilities


def sinusoidal_positions(length: int, d_model: int) -> Tensor:
    """Sinusoidal positional encoding of Vaswani et al. (2017), shape (length, d_model)."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    angle = position * inv_freq
    pe = torch.zeros(length, d_model)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)[:, : d_model // 2]
    return pe


def causal_mask(length: int, device: torch.device | None = None) -> Tensor:
    """Boolean (length, length) mask, True where query position t may attend key position s <= t."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()


def _never_empty(mask: Tensor) -> Tensor:
    """Let query rows with no allowed key attend everywhere (avoids NaN; such rows are padding)."""
    return mask | ~mask.any(dim=-1, keepdim=True)


@contextmanager
def eval_mode(module: nn.Module) -> Iterator[nn.Module]:
    """Put ``module`` in eval mode for the block and restore its previous train/eval mode after."""
    was_training = module.training
    module.eval()
    try:
        yield module
    finally:
        module.train(was_training)


# ----------------------------------------------------------------------------- layers


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention with separate q/k/v/out projections."""

    def __init__(self, d_model: int, n_heads: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def _split_heads(self, x: Tensor) -> Tensor:
        batch, length, d_model = x.shape
        return x.view(batch, length, self.n_heads, d_model // self.n_heads).transpose(1, 2)

    def project_kv(self, context: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of ``context`` (B, L, D), each split into heads: (B, H, L, D/H)."""
        return self._split_heads(self.k_proj(context)), self._split_heads(self.v_proj(context))

    def attend(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """Attention of queries from ``x`` (B, T, D) over keys/values (B, H, L, D/H); mask: (B, H, T, L)."""
        q = self._split_heads(self.q_proj(x))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0)
        batch, _, length, _ = y.shape
        return self.out_proj(y.transpose(1, 2).reshape(batch, length, -1))

    def forward(self, x: Tensor, context: Tensor, mask: Tensor | None) -> Tensor:
        return self.attend(x, *self.project_kv(context), mask)


class FeedForward(nn.Module):
    """Position-wise feed-forward block: Linear -> ReLU -> dropout -> Linear."""

    def __init__(self, d_model: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(F.relu(self.fc1(x))))


class EncoderLayer(nn.Module):
    """Pre-LN encoder layer: x + SelfAttn(LN(x)), then x + FFN(LN(x))."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, config.dropout)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config.d_model, config.d_ff, config.dropout)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        h = self.ln1(x)
        x = x + self.dropout(self.self_attn(h, h, mask))
        return x + self.dropout(self.ffn(self.ln2(x)))


class DecoderLayer(nn.Module):
    """Pre-LN decoder layer: masked self-attention, cross-attention over memory, feed-forward."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, config.dropout)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.cross_attn = MultiHeadAttention(config.d_model, config.n_heads, config.dropout)
        self.ln3 = nn.LayerNorm(config.d_model)
        self.ffn = FeedForward(config.d_model, config.d_ff, config.dropout)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: Tensor, memory: Tensor, self_mask: Tensor, memory_mask: Tensor) -> Tensor:
        h = self.ln1(x)
        x = x + self.dropout(self.self_attn(h, h, self_mask))
        x = x + self.dropout(self.cross_attn(self.ln2(x), memory, memory_mask))
        return x + self.dropout(self.ffn(self.ln3(x)))

    def step(
        self,
        x: Tensor,
        cache: tuple[Tensor, Tensor] | None,
        memory_kv: tuple[Tensor, Tensor],
        memory_mask: Tensor,
    ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """One decoding position ``x`` (B, 1, D) given cached self-attention keys/values (eval only)."""
        h = self.ln1(x)
        k, v = self.self_attn.project_kv(h)
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        x = x + self.self_attn.attend(h, k, v, None)  # the newest position sees all earlier ones
        x = x + self.cross_attn.attend(self.ln2(x), *memory_kv, memory_mask)
        return x + self.ffn(self.ln3(x)), (k, v)


class Encoder(nn.Module):
    """Stack of encoder layers followed by a final LayerNorm."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        self.norm = nn.LayerNorm(config.d_model)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class Decoder(nn.Module):
    """Stack of decoder layers followed by a final LayerNorm."""

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
        self.norm = nn.LayerNorm(config.d_model)

    def forward(self, x: Tensor, memory: Tensor, self_mask: Tensor, memory_mask: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, memory, self_mask, memory_mask)
        return self.norm(x)


@dataclass
class DecodingState:
    """Everything incremental decoding carries between steps (one row per hypothesis)."""

    memory_kv: list[tuple[Tensor, Tensor]]  # cross-attention keys/values per decoder layer
    memory_mask: Tensor  # (N, 1, 1, S) bool
    self_kv: list[tuple[Tensor, Tensor] | None]  # self-attention cache per decoder layer
    step: int = 0

    def reorder(self, index: Tensor) -> None:
        """Keep rows ``index`` (beam search: which hypothesis each new beam extends)."""
        self.memory_kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.memory_kv]
        self.memory_mask = self.memory_mask.index_select(0, index)
        self.self_kv = [
            None if kv is None else (kv[0].index_select(0, index), kv[1].index_select(0, index)) for kv in self.self_kv
        ]


# ----------------------------------------------------------------------------- model


class TiedEmbedding(nn.Embedding):
    """The shared embedding, called as a module for both its uses: token ids -> embeddings (a lookup), and
    hidden states -> logits (``F.linear`` with the same matrix, the tied output projection). Routing the
    projection through the module keeps every use of the matrix visible to per-example gradient hooks
    (Opacus, ``core/dpsgd.py``); the computation is exactly the plain ``F.linear``."""

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]
        return F.linear(x, self.weight) if x.is_floating_point() else super().forward(x)


class Seq2SeqTransformer(nn.Module):
    """Encoder-decoder Transformer with teacher-forced loss, greedy decoding and beam search."""

    positions: Tensor  # the sinusoid buffer registered in __init__

    def __init__(self, config: TransformerConfig) -> None:
        super().__init__()
        self.config = config
        d = config.d_model
        if config.tie_embeddings:
            self.embedding = TiedEmbedding(config.vocab_size, d)
        else:
            self.src_embedding = nn.Embedding(config.vocab_size, d)
            self.tgt_embedding = nn.Embedding(config.vocab_size, d)
            self.lm_head = nn.Linear(d, config.vocab_size, bias=False)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.dropout = nn.Dropout(config.dropout)
        self.register_buffer("positions", sinusoidal_positions(config.max_len, d), persistent=False)
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        """Xavier-uniform linear weights, zero biases, N(0, d_model^-1/2) embeddings."""
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=self.config.d_model**-0.5)

    def num_parameters(self) -> int:
        """Number of distinct parameters (a tied embedding counts once)."""
        return sum(p.numel() for p in self.parameters())

    # ---- embeddings and masks

    def _embed(self, tokens: Tensor, embedding: nn.Embedding, start: int = 0) -> Tensor:
        """Token embedding * sqrt(d_model) + positional encoding of positions start.., then dropout."""
        end = start + tokens.size(1)
        pe = self.positions
        if end > pe.size(0):  # longer than config.max_len: sinusoids extend to any length
            pe = sinusoidal_positions(end, self.config.d_model)
        x = embedding(tokens) * math.sqrt(self.config.d_model) + pe[start:end].to(self.positions.device)
        return self.dropout(x)

    def _src_embedding(self) -> nn.Embedding:
        return self.embedding if self.config.tie_embeddings else self.src_embedding

    def _tgt_embedding(self) -> nn.Embedding:
        return self.embedding if self.config.tie_embeddings else self.tgt_embedding

    def _project(self, h: Tensor) -> Tensor:
        if isinstance(self.embedding if self.config.tie_embeddings else None, TiedEmbedding):
            return self.embedding(h)  # the plain tied matrix, as a module call (see TiedEmbedding)
        if self.config.tie_embeddings:  # a LoRA-adapted embedding (models/adapters.py)
            return F.linear(h, self._tied_weight())
        return self.lm_head(h)

    def _tied_weight(self) -> Tensor:
        """The tied embedding matrix as the output projection uses it. With a LoRA adapter on the embedding
        (``models/adapters.py``) that is the base matrix plus the adapters' unmerged update, as the embedding
        lookup sees it, so the adapted model and its merged copy compute the same logits."""
        # a TiedEmbedding, or the peft LoRA layer that replaces it (whose attributes its type does not show)
        emb: Any = self.embedding
        weight = emb.weight
        delta = getattr(emb, "get_delta_weight", None)  # a peft LoRA embedding layer
        if delta is not None and not emb.merged and not emb.disable_adapters:
            for name in emb.active_adapters:
                if name in emb.lora_embedding_A:
                    weight = weight + delta(name)
        return weight

    def _key_padding_mask(self, tokens: Tensor) -> Tensor:
        """(B, 1, 1, L) bool: True at non-pad keys."""
        return _never_empty(tokens != self.config.pad_id)[:, None, None, :]

    # ---- training path

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Encoder output (B, S, D) and the source key mask (B, 1, 1, S)."""
        src_mask = self._key_padding_mask(src)
        return self.encoder(self._embed(src, self._src_embedding()), src_mask), src_mask

    def decode(self, tgt_in: Tensor, memory: Tensor, memory_mask: Tensor) -> Tensor:
        """Logits (B, T, V) for decoder input ``tgt_in`` (B, T) attending to ``memory``."""
        key_mask = (tgt_in != self.config.pad_id)[:, None, None, :]
        self_mask = causal_mask(tgt_in.size(1), tgt_in.device)[None, None] & key_mask
        x = self._embed(tgt_in, self._tgt_embedding())
        return self._project(self.decoder(x, memory, _never_empty(self_mask), memory_mask))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits (B, T, V): position t predicts the token after ``tgt_in[:, t]`` from ``tgt_in[:, :t+1]``."""
        return self.decode(tgt_in, *self.encode(src))

    def loss(self, src: Tensor, tgt: Tensor, *, label_smoothing: float = 0.0) -> tuple[Tensor, int]:
        """Teacher-forced cross-entropy: input ``tgt[:, :-1]``, labels ``tgt[:, 1:]``.

        ``tgt`` is BOS + tokens + EOS, right-padded with ``pad_id``. Returns the loss summed over
        non-pad label positions and their count, so callers can average exactly over a dataset.
        """
        if tgt.dim() != 2 or tgt.size(1) < 2:
            raise ValueError(f"tgt must be (batch, length >= 2), got shape {tuple(tgt.shape)}")
        tgt_in, labels = tgt[:, :-1], tgt[:, 1:]
        logits = self(src, tgt_in)
        loss_sum = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(),
            labels.reshape(-1),
            ignore_index=self.config.pad_id,
            reduction="sum",
            label_smoothing=label_smoothing,
        )
        return loss_sum, int((labels != self.config.pad_id).sum().item())

    def pair_losses(self, src: Tensor, tgt: Tensor, *, label_smoothing: float = 0.0) -> Tensor:
        """Each row's token-averaged teacher-forced cross-entropy (padding excluded), shape (batch,): a loss per
        example that depends on that example alone (what record-level DP-SGD clips, ``core/dpsgd.py``)."""
        tgt_in, labels = tgt[:, :-1], tgt[:, 1:]
        logits = self(src, tgt_in)
        per_token = F.cross_entropy(
            logits.transpose(1, 2).float(),
            labels,
            ignore_index=self.config.pad_id,
            reduction="none",
            label_smoothing=label_smoothing,
        )
        counts = (labels != self.config.pad_id).sum(1).clamp(min=1)
        return per_token.sum(1) / counts

    # ---- incremental decoding

    def _start_decoding(self, src: Tensor) -> DecodingState:
        """Run the encoder once and precompute cross-attention keys/values of every decoder layer."""
        memory, memory_mask = self.encode(src)
        memory_kv = [cast(DecoderLayer, layer).cross_attn.project_kv(memory) for layer in self.decoder.layers]
        return DecodingState(memory_kv, memory_mask, [None] * len(self.decoder.layers))

    def _decode_step(self, last_tokens: Tensor, state: DecodingState) -> Tensor:
        """Logits (N, V) of the next token given each row's latest token (N,); updates ``state``.

        PAD and BOS are never valid outputs, so their logits are set to -inf.
        """
        x = self._embed(last_tokens[:, None], self._tgt_embedding(), start=state.step)
        for i, layer in enumerate(self.decoder.layers):
            x, state.self_kv[i] = cast(DecoderLayer, layer).step(
                x, state.self_kv[i], state.memory_kv[i], state.memory_mask
            )
        state.step += 1
        logits = self._project(self.decoder.norm(x))[:, -1].float()
        logits[:, [self.config.pad_id, self.config.bos_id]] = float("-inf")
        return logits

    def _check_src(self, src: Tensor, max_len: int | None) -> int:
        if src.dim() != 2:
            raise ValueError(f"src must be (batch, length), got shape {tuple(src.shape)}")
        max_len = self.config.max_len if max_len is None else max_len
        if max_len < 1:
            raise ValueError(f"max_len must be >= 1, got {max_len}")
        return max_len

    @torch.no_grad()
    def greedy_decode(self, src: Tensor, *, max_len: int | None = None) -> list[list[int]]:
        """Greedy decoding from BOS; per sentence the tokens before the first EOS (at most ``max_len``).

        ``max_len`` (default ``config.max_len``) bounds the number of decoding steps, EOS included.
        """
        max_len = self._check_src(src, max_len)
        eos = self.config.eos_id
        with eval_mode(self):
            state = self._start_decoding(src)
            tokens = torch.full((src.size(0),), self.config.bos_id, dtype=torch.long, device=src.device)
            done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)
            steps: list[Tensor] = []
            for _ in range(max_len):
                tokens = self._decode_step(tokens, state).argmax(dim=-1)
                steps.append(tokens)
                done |= tokens == eos
                if bool(done.all()):
                    break
        out = []
        for row in torch.stack(steps, dim=1).tolist():
            out.append(row[: row.index(eos)] if eos in row else row)
        return out

    @torch.no_grad()
    def beam_search(
        self,
        src: Tensor,
        *,
        beam_size: int = 4,
        max_len: int | None = None,
        length_penalty: float = 1.0,
    ) -> list[list[int]]:
        """Batched beam search; returns per sentence the best hypothesis without BOS/EOS.

        Hypotheses are ranked by sum of log-probabilities / length ** length_penalty, length counting
        EOS. Each step keeps the ``beam_size`` best non-EOS continuations; an EOS continuation ranked
        within the top ``beam_size`` candidates ends its hypothesis (the best ``beam_size`` ended ones are
        kept). A sentence is done when ``beam_size`` hypotheses have ended and the worst of them scores
        at least the best open beam normalised by its current length (the usual heuristic), or after
        ``max_len`` steps, when open beams compete too. With beam_size=1 this equals greedy decoding.
        """
        max_len = self._check_src(src, max_len)
        if beam_size < 1:
            raise ValueError(f"beam_size must be >= 1, got {beam_size}")
        batch, k, eos, device = src.size(0), beam_size, self.config.eos_id, src.device
        neg_inf = float("-inf")
        finished: list[list[tuple[float, list[int]]]] = [[] for _ in range(batch)]
        done = [False] * batch
        with eval_mode(self):
            state = self._start_decoding(src.repeat_interleave(k, dim=0))
            scores = torch.full((batch, k), neg_inf, device=device)
            scores[:, 0] = 0.0  # all beams start identical: keep one
            history = torch.empty((batch, k, 0), dtype=torch.long, device=device)
            tokens = torch.full((batch * k,), self.config.bos_id, dtype=torch.long, device=device)
            for step in range(max_len):
                log_probs = F.log_softmax(self._decode_step(tokens, state), dim=-1).view(batch, k, -1)
                vocab = log_probs.size(-1)
                candidates = (scores.unsqueeze(-1) + log_probs).view(batch, k * vocab)
                top_scores, top_index = candidates.topk(min(2 * k, k * vocab), dim=1)
                new_scores = [[neg_inf] * k for _ in range(batch)]
                new_origin = [[0] * k for _ in range(batch)]
                new_tokens = [[eos] * k for _ in range(batch)]
                for b, (row_scores, row_index) in enumerate(zip(top_scores.tolist(), top_index.tolist(), strict=True)):
                    if done[b]:
                        continue
                    n_active = 0
                    for rank, (score, index) in enumerate(zip(row_scores, row_index, strict=True)):
                        if score == neg_inf or n_active == k:
                            break
                        origin, token = divmod(index, vocab)
                        if token != eos:
                            new_scores[b][n_active], new_origin[b][n_active] = score, origin
                            new_tokens[b][n_active] = token
                            n_active += 1
                        elif rank < k:
                            hyp = history[b, origin].tolist()
                            finished[b].append((score / (len(hyp) + 1) ** length_penalty, hyp))
                    finished[b] = sorted(finished[b], key=lambda item: item[0], reverse=True)[:k]
                    best_open = new_scores[b][0] / (step + 1) ** length_penalty
                    done[b] = len(finished[b]) == k and finished[b][-1][0] >= best_open
                if all(done):
                    break
                origin = torch.tensor(new_origin, dtype=torch.long, device=device)  # (batch, k)
                chosen = torch.tensor(new_tokens, dtype=torch.long, device=device)
                history = history.gather(1, origin.unsqueeze(-1).expand_as(history))
                history = torch.cat([history, chosen.unsqueeze(-1)], dim=2)
                scores = torch.tensor(new_scores, device=device)
                tokens = chosen.view(-1)
                state.reorder((origin + torch.arange(batch, device=device).unsqueeze(1) * k).view(-1))
            for b in range(batch):
                if not done[b]:
                    for score, hyp in zip(scores[b].tolist(), history[b].tolist(), strict=False):
                        if score != neg_inf:
                            finished[b].append((score / max(len(hyp), 1) ** length_penalty, hyp))
        return [max(hyps, key=lambda item: item[0])[1] if hyps else [] for hyps in finished]
