"""A decoded token's attention in one Pallas kernel (the kernels candidate
"pallas_decode_attention"), which also writes the token's key and value into the KV cache.

Decoding one token a row, ``attention.plain`` runs as several XLA kernels a layer: the
scores' product, softmax's maximum, sum and division, and the weighted values, each writing
its [B, KV heads, group, L] result to memory for the next. This kernel takes one row and one
KV head a program: the query heads sharing that KV head (GQA's group) against the row's
cache, blockwise over the cache's positions with an online softmax (flash-decoding's inner
loop, without its split over the length: 64 rows x 2 KV heads are already 128 programs),
and writes only the [group, Dh] output. Its loop stops at the token's own position (the
positions after it are not yet written), and with a sliding window starts at the window's
first block, so it reads no more of the cache than the token sees.

It computes ``attention.plain``'s masks (causal, the cache's key mask, the window, the
token's own key always seen), scale and softcap, for one query a row (tests/test_kernels.py
holds it to the plain form in Pallas's interpreter, float32 and bfloat16, GQA, ragged rows).
Scores and the softmax are float32 as there; the products accumulate in float32 (the plain
form rounds the scores' product to the cache's dtype first), and the weights are rounded to
the values' dtype before their product, as there.

Configurations it does not cover go to the plain form (``fits``): a cache length that is not
a multiple of 16 (a key block is a power of two of 16 to ``BLOCK_KEYS`` positions dividing
it), a head size that is not a power of two of at least 16, more than one query a row. The
group is padded to a power of two of at least 16 (Triton's products want 16 rows) by
repeating its last query (a gather of clamped indices); the copies compute the last query's
numbers through the same instructions and are stored over its row with the same indices
(a masked store of them is Triton's alone: Pallas's interpreter has none for such an index).

The cache's keys and values are aliased to two of its outputs: it stores the block holding the
token's position with the token's key and value in, in place, and attends over the cache with
them merged into that block as it reads it (no read follows a write), so no XLA kernel updates
the cache. The token's queries, key and value come as one operand [B, H + 2 KVH, Dh], which XLA
writes in one fusion of the three projections' split-K sums, biases and RoPE. With the three
operands apart the cache write cut nothing (301 launches, 2.78 GB: XLA had fused the cache
updates into the projections' three fusions, which stayed for their sums and biases); with one
operand the three fusions become one. RoPE turned in the kernel too (its query and key in
halves) cut nothing more (253 launches and the same bytes: XLA fuses it into that one fusion)
and is left out.

Counted, not timed: no GPU has run it. On an H100's deviceless compile
(benchmarks/decode_program.py, without autotuning) it cuts a decoded token of Qwen2.5-0.5B
(64 rows, 1,536 cache positions, bfloat16) from 397 launches and 3.19 GB to 253 and 2.73 GB
(the attention alone, before the cache write: 301 and 2.78 GB), and of Qwen2.5-7B from 518
launches and 23.5 GB to 350 and 22.3 GB (406 and 22.6 GB); that count takes the
kernel's operands whole, though it reads the cache only up to the token, and its aliased cache
as read, not written (``ppojax.runtime.launches``). Lowered for any platform but CUDA it runs
in Pallas's interpreter as plain XLA ops, for tests.

Inside a sharded step (``sharding.rows_on``) it runs in ``shard_map`` on each device's rows:
XLA's partitioner has no rule for a Pallas call and would gather its operands, the cache
too, whole onto every device. A tensor-parallel sampler (heads split over devices) takes the
plain form, which the partitioner splits by heads.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from ppojax.rlhf.core import sharding
from ppojax.rlhf.models import attention
from ppojax.runtime import kernels

# Cache positions a step of the kernel's loop reads (the largest power of two up to this that
# divides the cache length), and the warps of a program. Not tuned on a GPU.
BLOCK_KEYS = 64
NUM_WARPS = 4
# Triton's matrix products want at least 16 rows and columns.
MIN_DIM = 16


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def key_block(length: int) -> int:
    """The key block for a cache of ``length`` positions: the largest power of two up to
    BLOCK_KEYS dividing it, or 0 when none of at least MIN_DIM does."""
    block = BLOCK_KEYS
    while block >= MIN_DIM:
        if length % block == 0:
            return block
        block //= 2
    return 0


def fits(queries: jax.Array, keys: jax.Array) -> bool:
    """Whether the kernel computes this attention: one query a row ([B, 1, H, Dh]), a head
    size that is a power of two of at least 16, a cache length with a ``key_block``."""
    head_dim = queries.shape[-1]
    return (
        queries.shape[1] == 1
        and head_dim >= MIN_DIM
        and _power_of_two(head_dim)
        and key_block(keys.shape[1]) > 0
    )


def _kernel(scores: attention.Scores, kv_heads: int, group: int, rows: int, block: int, *refs):
    """One row's one KV head: the token's heads [H + 2 KVH, Dh] (queries, keys, values), the
    cache's keys and values [L, Dh], key mask [L], start [1] -> out [group, Dh], the token's
    key and value written into the cache (aliased: ``k_out_ref`` is ``k_ref``'s buffer) at
    its position; ``rows`` (>= group) query rows computed, the group's last repeated."""
    from jax.experimental import pallas as pl

    token_ref, k_ref, v_ref, mask_ref, start_ref, out_ref, k_out_ref, v_out_ref = refs
    length, head_dim = k_ref.shape
    kv_head = pl.program_id(1)
    key_row = kv_heads * group + kv_head  # the token's rows: H queries, KVH keys, KVH values
    index = jnp.minimum(jax.lax.broadcasted_iota(jnp.int32, (rows,), 0), group - 1)
    query = token_ref[kv_head * group + index, :]
    new_key = token_ref[key_row, :][None, :].astype(k_ref.dtype)
    new_value = token_ref[key_row + kv_heads, :][None, :].astype(v_ref.dtype)
    start = start_ref[0]
    # where dynamic_update_slice writes it: the position clamped into the cache
    written = jnp.clip(start, 0, length - 1)
    top0 = jnp.full((rows,), attention.MASKED_SCORE, jnp.float32)
    total0 = jnp.zeros((rows,), jnp.float32)
    acc0 = jnp.zeros((rows, head_dim), jnp.float32)

    def cached(first):
        """The cache's block from ``first`` with the token's key and value in: read before any
        write of this program, so no read waits on a write."""
        position = first + jax.lax.broadcasted_iota(jnp.int32, (block,), 0)
        here = (position == written)[:, None]
        keys = jnp.where(here, new_key, k_ref[pl.ds(first, block), :])
        values = jnp.where(here, new_value, v_ref[pl.ds(first, block), :])
        return position, keys, values

    def step(j, carry):
        top, total, acc = carry
        first = pl.multiple_of(j * block, block)
        position, keys, values = cached(first)
        real = mask_ref[pl.ds(first, block)]
        seen = (position <= start) & real
        if scores.window is not None:
            seen = seen & (start - position < scores.window)
        seen = (seen | (position == start))[None, :]
        raw = jax.lax.dot_general(
            query, keys, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32
        )
        masked = jnp.where(seen, attention.capped(raw, scores), attention.MASKED_SCORE)
        new_top = jnp.maximum(top, masked.max(axis=1))
        rescale = jnp.exp(top - new_top)
        probs = jnp.where(seen, jnp.exp(masked - new_top[:, None]), 0.0)
        weighted = jax.lax.dot_general(
            probs.astype(values.dtype),
            values,
            (((1,), (0,)), ((), ())),
            preferred_element_type=jnp.float32,
        )
        return new_top, total * rescale + probs.sum(axis=1), acc * rescale[:, None] + weighted

    last = start // block + 1  # the block of the token's own position
    first = 0
    if scores.window is not None:
        first = jnp.maximum(start - scores.window + 1, 0) // block
    _, total, acc = jax.lax.fori_loop(first, last, step, (top0, total0, acc0))
    out_ref[index, :] = (acc / total[:, None]).astype(out_ref.dtype)
    # the block holding the token's position, stored whole with the token's key and value in
    block_first = pl.multiple_of(written // block * block, block)
    _, keys, values = cached(block_first)
    k_out_ref[pl.ds(block_first, block), :] = keys
    v_out_ref[pl.ds(block_first, block), :] = values


# attend_cached's operands, on three lines: the kernel and its dispatcher share an API, not code
def attend(
    queries: jax.Array, new_keys: jax.Array, new_values: jax.Array, keys: jax.Array,
    values: jax.Array, key_mask: jax.Array, start: Any, scores: attention.Scores,
    *, interpret: bool | None = None,
) -> tuple[jax.Array, jax.Array, jax.Array]:  # fmt: skip
    """``attention.attend`` of one query a row (``fits``) in the kernel, the token's keys and
    values written into the cache first: queries [B, 1, H, Dh] and the token's keys and values
    [B, 1, KVH, Dh] at cache position ``start``, the cache's keys and values [B, L, KVH, Dh]
    -> the output [B, 1, H * Dh] and the cache with the token's keys and values at ``start``
    (updated in place: the cache's operands are aliased to the kernel's outputs).
    ``interpret``: None for the Triton kernel where the program is lowered for CUDA and
    Pallas's interpreter elsewhere; True or False for one of them on every platform."""
    # imported here: Pallas adds ~30 ms to ``import ppojax``, for a path that is off by default
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pallas_triton

    batch_size, _, heads, head_dim = queries.shape
    length, kv_heads = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    rows = max(MIN_DIM, 1 << (group - 1).bit_length())
    block = key_block(length)
    # one operand of the token's heads: XLA writes the three projections' one fusion there
    token = jnp.concatenate(
        [x.reshape(batch_size, -1, head_dim) for x in (queries, new_keys, new_values)], axis=1
    )
    cache_spec = pl.BlockSpec((None, length, None, head_dim), lambda b, h: (b, 0, h, 0))
    group_spec = pl.BlockSpec((None, None, group, head_dim), lambda b, h: (b, h, 0, 0))
    call = functools.partial(
        pl.pallas_call,
        functools.partial(_kernel, scores, kv_heads, group, rows, block),
        out_shape=(
            jax.ShapeDtypeStruct((batch_size, kv_heads, group, head_dim), values.dtype),
            jax.ShapeDtypeStruct(keys.shape, keys.dtype),
            jax.ShapeDtypeStruct(values.shape, values.dtype),
        ),
        grid=(batch_size, kv_heads),
        in_specs=[
            pl.BlockSpec((None, token.shape[1], head_dim), lambda b, h: (b, 0, 0)),
            cache_spec,
            cache_spec,
            pl.BlockSpec((None, length), lambda b, h: (b, 0)),
            pl.BlockSpec((1,), lambda b, h: (0,)),
        ],
        out_specs=(group_spec, cache_spec, cache_spec),
        input_output_aliases={1: 1, 2: 2},
        compiler_params=pallas_triton.CompilerParams(num_warps=NUM_WARPS, num_stages=2),
        name="decode_attention",
    )
    arrays = (
        token,
        keys,
        values,
        key_mask.astype(bool),
        jnp.reshape(start, (1,)).astype(jnp.int32),
    )
    if interpret is None:
        # The platform the program is lowered for decides, not the machine that traces it.
        outputs = jax.lax.platform_dependent(
            *arrays, cuda=call(interpret=False), default=call(interpret=True)
        )
    else:
        outputs = call(interpret=interpret)(*arrays)
    out, keys, values = outputs
    return out.reshape(batch_size, 1, heads * head_dim), keys, values


def attend_cached(
    queries: jax.Array,
    new_keys: jax.Array,
    new_values: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    key_mask: jax.Array,
    start: Any,
    scores: attention.Scores,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The chunk's keys and values [B, S, KVH, Dh] written into the cache at ``start``, and
    ``attention.attend`` over it: the output and the updated keys and values. In the kernel
    where the candidate "pallas_decode_attention" is chosen (or, as one of CUDA's defaults,
    lowered for CUDA: ``kernels.by_platform``) and ``fits``; the plain form elsewhere
    (``dynamic_update_slice``, XLA's in-place update, then the attention)."""

    def plain(queries, new_keys, new_values, keys, values, key_mask, start):
        keys = jax.lax.dynamic_update_slice(keys, new_keys.astype(keys.dtype), (0, start, 0, 0))
        values = jax.lax.dynamic_update_slice(
            values, new_values.astype(values.dtype), (0, start, 0, 0)
        )
        return attention.attend(queries, keys, values, key_mask, start, scores), keys, values

    operands = (queries, new_keys, new_values, keys, values, key_mask, start)
    if not fits(queries, keys):
        return plain(*operands)

    kernel = functools.partial(attend, scores=scores)
    layout = sharding.step_layout()
    mesh = None if layout is None else layout.mesh
    if sharding.rows_spec() != PartitionSpec((sharding.DATA, sharding.FSDP)):
        # a tensor-parallel sampler splits the heads over "fsdp": XLA's partitioner splits the
        # plain form by them, which a Pallas call has no rule for
        return plain(*operands)
    if mesh is not None:
        # A Pallas call has no rule for XLA's partitioner, which would gather its operands
        # whole onto every device (the cache too); each device runs it on its own rows.
        devices = mesh.shape[sharding.DATA] * mesh.shape[sharding.FSDP]
        if queries.shape[0] % devices:
            return plain(*operands)
        rows = PartitionSpec((sharding.DATA, sharding.FSDP))
        kernel = jax.shard_map(
            kernel,
            mesh=mesh,
            in_specs=(rows,) * 6 + (PartitionSpec(),),
            out_specs=(rows,) * 3,
            check_vma=False,
        )
    chosen = kernels.by_platform("pallas_decode_attention", plain, kernel)
    return chosen(*operands[:-1], jnp.asarray(start))
