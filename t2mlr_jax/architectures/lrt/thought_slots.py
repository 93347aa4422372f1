"""Latent thought slots: K continuous slots after every vocabulary token, one causal sequence of N(K+1)
slots (the LRT with thought tokens and PonderLM-2).

Slot (t, 0) holds vocabulary token x_t, slots (t, 1..K) its thoughts. Every slot writes keys / values;
thought slots share the RoPE index (position id) and the document of their token; a thought slot has no
token (`backbone.LATENT`: no embedding, no value embedding), its input is the previous slot's final
state. Parallel refinement moves every slot's final state one slot to the right (`shift`); a document's
first vocabulary slot gets zeros. Sliding windows count slots, since the KV cache holds one per slot.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from t2mlr_jax.model.backbone import LATENT
from t2mlr_jax.model.token_layout import Layout


class Slots(NamedTuple):
    tokens: Int[Array, "B S"]  # the vocabulary token at (t, 0), LATENT at thought slots
    layout: Layout  # positions, documents and control flow of the owning token
    thought: Bool[Array, "B S"]  # a thought slot
    starts: Bool[Array, "B S"]  # a document's first vocabulary slot (no previous state)


def check_thoughts(k: int, where: str) -> int:
    if not isinstance(k, int) or k < 0:
        raise ValueError(f"{where}: a thought count K must be an integer >= 0, got {k!r}")
    return k


def expand(tokens: Int[Array, "B T"], layout: Layout, k: int) -> Slots:
    """The N(K+1)-slot sequence of N vocabulary tokens (K = 0: the tokens themselves)."""
    b, t = tokens.shape
    spread = lambda a: jnp.repeat(a, k + 1, axis=1)
    thought = jnp.broadcast_to(jnp.arange(t * (k + 1)) % (k + 1) != 0, (b, t * (k + 1)))
    layout = Layout(*(spread(a) for a in layout))
    return Slots(
        jnp.where(thought, LATENT, spread(tokens)), layout, thought, ~thought & (layout.positions == 0)
    )


def shift(states: Float[Array, "B S D"], starts: Bool[Array, "B S"]) -> Float[Array, "B S D"]:
    """What each slot receives: the previous slot's state, zeros at a document's first slot."""
    previous = jnp.pad(states[:, :-1], ((0, 0), (1, 0), (0, 0)))
    return jnp.where(starts[..., None], 0.0, previous).astype(states.dtype)


def widen(states: Float[Array, "B S D"], n: int, k: int) -> Float[Array, "B X D"]:
    """The states of N intervals of any one length on N intervals of K + 1 slots: each interval's last
    state repeated into the slots it lacks (`shift` then gives thought j slot j - 1's state)."""
    b, s, d = states.shape
    intervals = states.reshape(b, n, s // n, d)
    extra = jnp.repeat(intervals[:, :, -1:], k + 1 - s // n, axis=2)
    return jnp.concatenate([intervals, extra], axis=2).reshape(b, n * (k + 1), d)


def last_slots(states: Float[Array, "B S D"], k: int) -> Float[Array, "B T D"]:
    """Each vocabulary token's interval's last slot: the state that predicts the next token."""
    return states[:, k :: k + 1]


def batch_positions(batch: dict, positions: slice) -> dict:
    """Every [B, T] entry of the batch at `positions` (the rest as it is)."""
    t = batch["tokens"].shape[1]
    return {
        name: a[:, positions] if getattr(a, "ndim", 0) >= 2 and a.shape[1] == t else a
        for name, a in batch.items()
    }


def vocabulary_prefix(batch: dict, num_tokens: int) -> dict:
    """The batch cut to its first `num_tokens` positions: the rows at a thought count K hold T / (K + 1)
    vocabulary tokens, so that the expanded length stays T."""
    return batch_positions(batch, slice(num_tokens))


def interval_tokens(seq_len: int, k: int, where: str) -> int:
    """Vocabulary tokens per row of `seq_len` slots at K thoughts; one clear error when K + 1 does not
    divide the row."""
    if seq_len % (k + 1):
        raise ValueError(
            f"{where}: a row of {seq_len} slots does not split into whole intervals of K + 1 = {k + 1} "
            f"(vocabulary token + {k} thoughts); use a length divisible by every K + 1"
        )
    return seq_len // (k + 1)
