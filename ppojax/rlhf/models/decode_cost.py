"""What decoding one token costs on a GPU, counted without one: the kernel launches and HBM
bytes of one trip of a sampling loop through the decoder's KV cache, compiled for an NVIDIA
GPU (``ppojax.runtime.deviceless``) and read by ``ppojax.runtime.launches``, beside the
minimum a token must move: the weights read once and the KV cache read once.

    cost = decode_cost(model_config("qwen2.5-0.5b"), "bfloat16", rows=64, prompt_len=512,
                       response_len=1024)
    cost.launches, cost.launches_per_layer, cost.bytes / cost.minimum

Counted without autotuning: a GPU's own compile picks its gemms and may fuse otherwise.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.rlhf.models.config import DecoderConfig
from ppojax.rlhf.models.decoder import Decoder, KVCache
from ppojax.rlhf.models.generate import pick
from ppojax.rlhf.models.shapes import abstract_params
from ppojax.runtime import deviceless, launches


class DecodeCost(NamedTuple):
    """One decoded token of ``rows`` rows: its ``launches`` (and ``launches_per_layer`` of
    the model's ``layers``) and the ``bytes`` they move, the ``minimum`` bytes (``weights`` +
    ``cache``: every parameter and the whole KV cache read once) and ``over_minimum`` =
    bytes / minimum, and the launches by opcode."""

    launches: float
    launches_per_layer: float
    bytes: float
    minimum: int
    over_minimum: float
    weights: int
    cache: int
    layers: int
    by_opcode: dict[str, float]


def sampling_loop(module: Decoder, steps: int, unroll: int = 1) -> Any:
    """``(params, logits, cache, start, key) -> tokens [steps, B]``: ``steps`` tokens drawn
    at temperature 1 from ``logits`` [B, V] on, each fed back through the cache at position
    ``start`` + t, as ``generate`` does after its prefill; ``unroll`` tokens a loop trip."""

    def run(params: dict, logits: jax.Array, cache: KVCache, start: Any, key: jax.Array) -> Any:
        mask = jnp.ones((logits.shape[0], 1), bool)

        def step(carry: tuple, inputs: tuple) -> tuple[tuple, jax.Array]:
            logits, cache = carry
            index, step_key = inputs
            token = pick(logits, step_key, 1.0, None, None)
            logits, cache = module.apply(params, token[:, None], mask, cache, start + index)
            return (logits[:, 0], cache), token

        inputs = (jnp.arange(steps), jax.random.split(key, steps))
        return jax.lax.scan(step, (logits, cache), inputs, unroll=unroll)[1]

    return run


def abstract_inputs(config: DecoderConfig, dtype: Any, rows: int, length: int) -> tuple[Any, ...]:
    """The loop's arguments as ``ShapeDtypeStruct``s: params, logits, a cache of ``length``
    positions, the start and a key (nothing allocated)."""
    params = abstract_params(config, dtype)
    kv = jax.ShapeDtypeStruct((rows, length, config.num_kv_heads, config.head_dim), dtype)
    layers = (kv,) * config.num_layers
    cache = KVCache(
        layers,
        layers,
        jax.ShapeDtypeStruct((rows, length), jnp.bool_),
        jax.ShapeDtypeStruct((rows,), jnp.int32),
    )
    logits = jax.ShapeDtypeStruct((rows, config.vocab_size), dtype)
    key = jax.eval_shape(lambda: jax.random.key(0))
    return params, logits, cache, jax.ShapeDtypeStruct((), jnp.int32), key


def decode_cost(
    config: DecoderConfig,
    dtype: Any,
    target: str = "h100",
    *,
    rows: int,
    prompt_len: int,
    response_len: int,
    unroll: int = 1,
) -> DecodeCost:
    """Launches and bytes per decoded token of the sampling loop of ``response_len`` tokens
    after a ``prompt_len`` prompt, compiled for one GPU of ``target`` (one trip: ``unroll``
    tokens), beside the minimum. The sampling shape is keywords: three ints in a row are
    easy to give in the wrong order."""
    dtype = jnp.dtype(dtype)
    run = sampling_loop(Decoder(config, dtype), response_len, unroll)
    args = abstract_inputs(config, dtype, rows, prompt_len + response_len)
    program = launches.count(deviceless.compile_for(run, args, target).as_text())
    loops = [block for block in program.walk()[1:] if block.trips == response_len // unroll]
    if len(loops) != 1:
        raise ValueError(f"expected one loop of {response_len // unroll} trips, found {loops}")
    leaves = jax.tree.leaves(args[0])
    weights = sum(math.prod(leaf.shape) for leaf in leaves) * dtype.itemsize
    per_position = config.num_layers * 2 * config.num_kv_heads * config.head_dim
    cache = rows * (prompt_len + response_len) * per_position * dtype.itemsize
    tokens = per_token(loops[0].launches_per_trip(), unroll)
    moved = per_token(loops[0].bytes_per_trip(), unroll)
    by_opcode = {op: per_token(n, unroll) for op, n in loops[0].by_opcode().items()}
    minimum = weights + cache
    layers = config.num_layers
    return DecodeCost(
        tokens, tokens / layers, moved, minimum, moved / minimum, weights, cache, layers, by_opcode
    )


def per_token(count: int, unroll: int) -> float:
    """A trip's count per token: an int where ``unroll`` divides it."""
    return count // unroll if count % unroll == 0 else count / unroll
