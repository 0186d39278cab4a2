"""Causal grouped-query attention for both transformers: the plain form, which builds the
whole [B, KV heads, group, S, L] score matrix, and a blockwise form that never does.

The blockwise form is flash attention written in JAX: queries in blocks of ``block`` rows,
each running an online softmax over key blocks of ``block`` columns (one loop over the block
pairs, which leaves out those a causal or sliding-window mask hides entirely), keeping only
the output and each row's log-sum-exp. Its backward (a ``custom_vjp``) recomputes each
block's probabilities from those, so neither pass holds more than one block's [B, KVH, G,
block, block] scores. The plain form stays as the reference the tests hold the blockwise one
to, and serves the cases where one block of queries covers them all (a decoded token's one
query reads the cache once).

Masks, in both forms: a query at cache position i sees key j when j <= i, key j holds a real
token (``key_mask``) and, with a ``window``, i - j < window; it always sees its own key, so a
padded query has a finite, unused output.
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

# A large finite number instead of -inf keeps softmax free of NaN while giving masked keys a
# weight of exactly 0 (exp underflows), in the online softmax too: a row's running maximum
# starts here and the first visible key rescales what masked keys added before it to 0.
MASKED_SCORE = -1e30
# Rows and columns of one block; 0 in ``Scores.block`` asks for the plain form.
DEFAULT_BLOCK = 256


class Scores(NamedTuple):
    """How scores are made from queries and keys: scale, Gemma 2's ``softcap``, a sliding
    ``window``, and the blockwise form's ``block`` (0: the plain form)."""

    scale: float
    softcap: float | None = None
    window: int | None = None
    block: int = DEFAULT_BLOCK


def capped(raw: jax.Array, scores: Scores) -> jax.Array:
    """raw * scale, through cap * tanh(x / cap) with a softcap."""
    x = raw * scores.scale
    return x if scores.softcap is None else scores.softcap * jnp.tanh(x / scores.softcap)


def visible(query_index: jax.Array, key_index: jax.Array, key_mask: jax.Array, window) -> Any:
    """[..., S, L] True where query positions [S] see key positions [L] (``key_mask`` [B, L]
    marks real keys): causal, real, within the window, or the query's own."""
    query_index, key_index = query_index[:, None], key_index[None, :]
    seen = key_index <= query_index
    if window is not None:
        # Padding lies only before a row's first real token, so slot distance is position
        # distance.
        seen = seen & (query_index - key_index < window)
    mask = key_mask[:, None, None, None, :]
    return (seen & mask) | (key_index == query_index)


def attend(
    queries: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    key_mask: jax.Array,
    start: Any,
    scores: Scores,
) -> jax.Array:
    """Queries [B, S, H, Dh] at cache positions ``start`` .. start + S - 1 over keys and values
    [B, L, KVH, Dh] -> [B, S, H * Dh]: the blockwise form for more than ``scores.block``
    queries (unless it is 0); the plain one for fewer, whose [S, L] scores a block of queries
    would hold anyway, and which reads the cache once (a decoded token)."""
    batch_size, chunk, heads, head_dim = queries.shape
    kv_heads = keys.shape[2]
    grouped = queries.reshape(batch_size, chunk, kv_heads, heads // kv_heads, head_dim)
    block = scores.block
    if block and chunk > block:
        known = start if isinstance(start, int) else None
        out = flash(scores, known, grouped, keys, values, key_mask.astype(bool), jnp.asarray(start))
    else:
        out = plain(scores, grouped, keys, values, key_mask, start)
    return out.reshape(batch_size, chunk, heads * head_dim)


def plain(
    scores: Scores, grouped: jax.Array, keys: jax.Array, values: jax.Array, key_mask, start
) -> jax.Array:
    """The reference: the whole [B, KVH, G, S, L] score matrix, softmax, weighted values;
    grouped queries [B, S, KVH, G, Dh] -> [B, S, KVH, G, Dh]."""
    chunk = grouped.shape[1]
    raw = jnp.einsum("bskgd,blkd->bkgsl", grouped, keys).astype(jnp.float32)
    seen = visible(start + jnp.arange(chunk), jnp.arange(keys.shape[1]), key_mask, scores.window)
    weights = jax.nn.softmax(jnp.where(seen, capped(raw, scores), MASKED_SCORE), axis=-1)
    return jnp.einsum("bkgsl,blkd->bskgd", weights.astype(values.dtype), values)


def padded(x: jax.Array, axis: int, size: int, value: Any = 0) -> jax.Array:
    """``x`` padded with ``value`` at the end of ``axis`` to ``size``."""
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, pad, constant_values=value)


class Blocks(NamedTuple):
    """The padded operands cut into blocks: queries [nq, B, bq, KVH, G, Dh], keys and values
    [nk, B, bk, KVH, Dh], key mask [nk, B, bk]; and the sizes."""

    queries: jax.Array
    keys: jax.Array
    values: jax.Array
    key_mask: jax.Array
    block: int
    num_q: int
    num_k: int


def cut(block: int, queries, keys, values, key_mask) -> Blocks:
    """Pad S and L up to whole blocks (padded keys masked) and split them into blocks."""
    chunk, length = queries.shape[1], keys.shape[1]
    num_q, num_k = -(-chunk // block), -(-length // block)

    def blocks(x: jax.Array, count: int, value: Any = 0) -> jax.Array:
        x = padded(x, 1, count * block, value)
        x = x.reshape(x.shape[0], count, block, *x.shape[2:])
        return jnp.moveaxis(x, 1, 0)

    return Blocks(
        blocks(queries, num_q),
        blocks(keys, num_k),
        blocks(values, num_k),
        blocks(key_mask, num_k, False),
        block,
        num_q,
        num_k,
    )


def block_pairs(scores: Scores, cut: Blocks, start: int | None) -> tuple[Any, Any]:
    """The (query block, key block) pairs whose scores are not all hidden, as two int32
    arrays: with a known ``start`` only the key blocks up to each query block's last query
    (causal) and, with a window, from its first query's window on; with a traced one, every
    pair (the masks hide the rest). A static list, so the loop over it has a trip count XLA
    knows (and the launch count counts)."""
    block = cut.block
    pairs = []
    for i in range(cut.num_q):
        for j in range(cut.num_k):
            if start is not None:
                first, last = start + i * block, start + i * block + block - 1
                if j * block > last:
                    continue
                if scores.window is not None and j * block + block - 1 < first - scores.window + 1:
                    continue
            pairs.append((i, j))
    pairs = np.asarray(pairs, np.int32).reshape(-1, 2)
    return jnp.asarray(pairs[:, 0]), jnp.asarray(pairs[:, 1])


def block_scores(scores: Scores, query, key, mask, query_index, key_index) -> tuple[Any, Any]:
    """One block's raw scores [B, KVH, G, bq, bk] (float32) and the masked, capped ones."""
    raw = jnp.einsum("bqkgd,blkd->bkgql", query, key, preferred_element_type=jnp.float32)
    seen = visible(query_index, key_index, mask, scores.window)
    return raw, jnp.where(seen, capped(raw, scores), MASKED_SCORE)


def forward(scores: Scores, known: int | None, queries, keys, values, key_mask, start) -> tuple:
    """The output [B, S, KVH, G, Dh] and each row's log-sum-exp [nq, B, KVH, G, bq]: one
    loop over the visible block pairs, each query block's running maximum, sum and weighted
    values carried (and updated in place) between its pairs."""
    cut_ = cut(scores.block, queries, keys, values, key_mask)
    block, (batch_size, chunk, kv_heads, group, head_dim) = cut_.block, queries.shape
    rows = (cut_.num_q, batch_size, kv_heads, group, block)

    def pair(carry: tuple, ij: tuple) -> tuple:
        top, total, acc = carry
        i, j = ij
        query_index = start + i * block + jnp.arange(block)
        key_index = j * block + jnp.arange(block)
        _, masked = block_scores(
            scores, cut_.queries[i], cut_.keys[j], cut_.key_mask[j], query_index, key_index
        )
        new_top = jnp.maximum(top[i], masked.max(axis=-1))
        rescale = jnp.exp(top[i] - new_top)
        probs = jnp.exp(masked - new_top[..., None])
        weighted = jnp.einsum(
            "bkgql,blkd->bkgqd",
            probs.astype(values.dtype),
            cut_.values[j],
            preferred_element_type=jnp.float32,
        )
        total = total.at[i].set(total[i] * rescale + probs.sum(axis=-1))
        acc = acc.at[i].set(acc[i] * rescale[..., None] + weighted)
        return (top.at[i].set(new_top), total, acc), None

    init = (
        jnp.full(rows, MASKED_SCORE, jnp.float32),
        jnp.zeros(rows, jnp.float32),
        jnp.zeros((*rows, head_dim), jnp.float32),
    )
    # the carries made once this layer's blocked queries exist: constant, XLA would make every
    # layer's at the step's start in one fusion, all of them live at once (a layer's worth of
    # float32 outputs for each layer of each forward pass). Tied to the raw queries instead,
    # Qwen2.5-0.5B's PPO remat step planned 8 GiB more on one H100, not less.
    init, _ = jax.lax.optimization_barrier((init, cut_.queries))
    (top, total, acc), _ = jax.lax.scan(pair, init, block_pairs(scores, cut_, known))
    outs, lse = acc / total[..., None], top + jnp.log(total)
    # [nq, B, KVH, G, bq, Dh] -> [B, nq * bq, KVH, G, Dh], the padding rows dropped
    out = jnp.moveaxis(outs, 4, 2).reshape(cut_.num_q, batch_size, block, kv_heads, group, head_dim)
    out = jnp.moveaxis(out, 0, 1).reshape(batch_size, cut_.num_q * block, kv_heads, group, head_dim)
    return out[:, :chunk].astype(queries.dtype), lse


def backward(scores: Scores, known: int | None, residuals: tuple, d_out: jax.Array) -> tuple:
    """Gradients of queries, keys and values: the same loop over the visible block pairs,
    each pair's probabilities recomputed from the saved log-sum-exp, the three gradients
    carried in float32 and added to in place."""
    queries, keys, values, key_mask, start, out, lse = residuals
    batch_size, chunk, kv_heads, group, head_dim = queries.shape
    cut_ = cut(scores.block, queries, keys, values, key_mask)
    block = cut_.block

    def query_blocks(x: jax.Array) -> jax.Array:  # [B, S, ...] -> [nq, B, bq, ...]
        x = padded(x, 1, cut_.num_q * block)
        return jnp.moveaxis(x.reshape(batch_size, cut_.num_q, block, *x.shape[2:]), 1, 0)

    d_out = query_blocks(d_out.astype(jnp.float32))
    # D_i = sum_d dO_i * O_i, per row: softmax's backward without the probabilities
    delta = jnp.einsum("nbqkgd,nbqkgd->nbkgq", d_out, query_blocks(out.astype(jnp.float32)))

    def pair(carry: tuple, ij: tuple) -> tuple:
        d_queries, d_keys, d_values = carry
        i, j = ij
        query, key, value = cut_.queries[i], cut_.keys[j], cut_.values[j]
        query_index = start + i * block + jnp.arange(block)
        key_index = j * block + jnp.arange(block)
        raw, masked = block_scores(scores, query, key, cut_.key_mask[j], query_index, key_index)
        probs = jnp.exp(masked - lse[i][..., None])
        d_o = d_out[i]
        d_value = jnp.einsum("bkgql,bqkgd->blkd", probs, d_o)
        d_probs = jnp.einsum("bqkgd,blkd->bkgql", d_o, value, preferred_element_type=jnp.float32)
        d_scores = probs * (d_probs - delta[i][..., None])
        if scores.softcap is None:
            d_raw = d_scores * scores.scale
        else:
            tanh = jnp.tanh(raw * scores.scale / scores.softcap)
            d_raw = d_scores * scores.scale * (1.0 - tanh * tanh)
        d_key = jnp.einsum("bkgql,bqkgd->blkd", d_raw, query, preferred_element_type=jnp.float32)
        d_query = jnp.einsum("bkgql,blkd->bqkgd", d_raw, key, preferred_element_type=jnp.float32)
        return (
            d_queries.at[i].add(d_query),
            d_keys.at[j].add(d_key),
            d_values.at[j].add(d_value),
        ), None

    kv_shape = (cut_.num_k, batch_size, block, kv_heads, head_dim)
    init = (
        jnp.zeros((cut_.num_q, batch_size, block, kv_heads, group, head_dim), jnp.float32),
        jnp.zeros(kv_shape, jnp.float32),
        jnp.zeros(kv_shape, jnp.float32),
    )
    (d_queries, d_keys, d_values), _ = jax.lax.scan(pair, init, block_pairs(scores, cut_, known))

    def whole(x: jax.Array, length: int) -> jax.Array:  # [n, B, b, ...] -> [B, length, ...]
        x = jnp.moveaxis(x, 0, 1)
        return x.reshape(x.shape[0], -1, *x.shape[3:])[:, :length]

    return (
        whole(d_queries, chunk).astype(queries.dtype),
        whole(d_keys, keys.shape[1]).astype(keys.dtype),
        whole(d_values, values.shape[1]).astype(values.dtype),
        None,
        None,
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def flash(scores: Scores, known: int | None, queries, keys, values, key_mask, start) -> jax.Array:
    """Blockwise attention of grouped queries [B, S, KVH, G, Dh] -> [B, S, KVH, G, Dh];
    ``known``: ``start`` as a Python int when it is one (the visible block pairs are then
    known when tracing), else None."""
    return forward(scores, known, queries, keys, values, key_mask, start)[0]


def _flash_forward(scores: Scores, known, queries, keys, values, key_mask, start) -> tuple:
    out, lse = forward(scores, known, queries, keys, values, key_mask, start)
    return out, (queries, keys, values, key_mask, start, out, lse)


flash.defvjp(_flash_forward, backward)


def default_scale(head_dim: int) -> float:
    """The scores' usual factor, head_dim ** -0.5."""
    return 1.0 / math.sqrt(head_dim)
