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
    """One decoded token of ``rows`` rows: its ``launches`` and the ``bytes`` they move, the
    ``minimum`` bytes (``weights`` + ``cache``: every parameter and the whole KV cache read
    once), the model's ``layers`` and the launches by opcode."""

    launches: float
    bytes: float
    weights: int
    cache: int
    layers: int
    by_opcode: dict[str, float]

    @property
    def minimum(self) -> int:
        return self.weights + self.cache

    @property
    def launches_per_layer(self) -> float:
        return self.launches / self.layers

    @property
    def over_minimum(self) -> float:
        return self.bytes / self.minimum


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


def abstract_inputs(
    config: DecoderConfig, dtype: Any, rows: int, length: int
) -> tuple[Any, ...]:
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


def decode_program(
    config: DecoderConfig,
    dtype: Any,
    rows: int,
    prompt_len: int,
    response_len: int,
    target: str = "h100",
    unroll: int = 1,
) -> launches.Block:
    """The sampling loop of ``response_len`` tokens after a ``prompt_len`` prompt, compiled
    for one GPU of ``target``: its loop, counted (one trip: ``unroll`` tokens)."""
    dtype = jnp.dtype(dtype)
    module = Decoder(config, dtype)
    run = sampling_loop(module, response_len, unroll)
    args = abstract_inputs(config, dtype, rows, prompt_len + response_len)
    program = launches.count(deviceless.compile_for(run, args, target).as_text())
    loops = [block for block in program.walk()[1:] if block.trips == response_len // unroll]
    if len(loops) != 1:
        raise ValueError(f"expected one loop of {response_len // unroll} trips, found {loops}")
    return loops[0]


def decode_cost(
    config: DecoderConfig,
    dtype: Any,
    rows: int,
    prompt_len: int,
    response_len: int,
    target: str = "h100",
    unroll: int = 1,
) -> DecodeCost:
    """Launches and bytes per decoded token of ``decode_program``, beside the minimum."""
    loop = decode_program(config, dtype, rows, prompt_len, response_len, target, unroll)
    item = jnp.dtype(dtype).itemsize
    leaves = jax.tree.leaves(abstract_params(config, dtype))
    weights = sum(math.prod(leaf.shape) for leaf in leaves) * item
    per_position = config.num_layers * 2 * config.num_kv_heads * config.head_dim * item
    cache = rows * (prompt_len + response_len) * per_position
    by_opcode = {op: per_token(n, unroll) for op, n in loop.by_opcode().items()}
    return DecodeCost(
        per_token(loop.launches_per_trip(), unroll),
        per_token(loop.bytes_per_trip(), unroll),
        weights,
        cache,
        config.num_layers,
        by_opcode,
    )


def per_token(count: int, unroll: int) -> float:
    """A trip's count per token: an int where ``unroll`` divides it."""
    return count // unroll if count % unroll == 0 else count / unroll
