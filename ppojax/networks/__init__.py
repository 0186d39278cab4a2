"""Policy networks: encoder (mlp, cnn) -> optional recurrent core (gru, lstm) -> heads.

``build_network`` picks the modules from ``NetworkSettings`` (static config fields) and
checks that the encoder can take the env's observations; ``init_params`` initialises every kernel
orthogonally through the LAPACK-free Householder QR of ``ppojax.networks.init``.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import jax
import jax.numpy as jnp

from ppojax.checks import ConfigError
from ppojax.envs import PPOEnv
from ppojax.networks.init import householder_qr_q, orthogonal, orthogonalize, tall_shape
from ppojax.networks.modules import (
    ACTIVATION_FNS,
    ActorCritic,
    NetworkSettings,
    flatten_observation,
    hidden_size,
)

__all__ = [
    "ACTIVATION_FNS",
    "ActorCritic",
    "NetworkSettings",
    "build_network",
    "flatten_observation",
    "hidden_size",
    "householder_qr_q",
    "init_params",
    "initial_hidden",
    "observation_template",
    "orthogonal",
    "orthogonalize",
    "reset_hidden",
    "tall_shape",
]

HIDDEN_SCALE = math.sqrt(2.0)  # gain of the encoder layers (tanh/relu)
CORE_SCALE = 1.0  # recurrent kernels: orthogonal, norm-preserving
# small policy logits (and log-stds, which start near init_log_std everywhere), unit-scale values
HEAD_SCALES = {"actor_head": 0.01, "log_std_head": 0.01, "critic_head": 1.0}


def observation_template(env: PPOEnv) -> Any:
    """Shapes and dtypes of one env's observation (a pytree of ``jax.ShapeDtypeStruct``)."""
    return jax.eval_shape(lambda: env.reset(jax.random.key(0))[0])


def check_encoder(settings: NetworkSettings, observation: Any, env_name: str) -> None:
    """Raise ``ConfigError`` naming the field when the encoder cannot take ``observation``:
    the CNN needs one [H, W, C] array at least as large as its kernels need."""
    if settings.encoder != "cnn":
        return
    leaves = jax.tree.leaves(observation)
    shapes = [tuple(leaf.shape) for leaf in leaves]
    if len(leaves) != 1 or len(shapes[0]) != 3:
        raise ConfigError(
            "encoder",
            f"PPOConfig.encoder='cnn' needs image observations [H, W, C]; {env_name} gives "
            f"{shapes[0] if len(shapes) == 1 else shapes}. Use encoder='mlp'.",
        )
    height, width = shapes[0][:2]
    for layer, _ in enumerate(settings.cnn_channels):
        height = (height - settings.cnn_kernel_size) // settings.cnn_stride + 1
        width = (width - settings.cnn_kernel_size) // settings.cnn_stride + 1
        if height < 1 or width < 1:
            raise ConfigError(
                "cnn_channels",
                f"PPOConfig.cnn_channels={settings.cnn_channels}: conv layer {layer + 1} gets no "
                f"output from {env_name}'s {shapes[0]} observations with cnn_kernel_size="
                f"{settings.cnn_kernel_size}, cnn_stride={settings.cnn_stride}; use fewer "
                "layers or a smaller kernel.",
            )


def build_network(settings: NetworkSettings, env: PPOEnv, env_name: str) -> ActorCritic:
    """The network ``settings`` describe for ``env``, checked against its observations."""
    check_encoder(settings, observation_template(env), env_name)
    return ActorCritic(env.spec, settings)


def initial_hidden(network: ActorCritic, batch: int) -> jax.Array | None:
    """The hidden state at an episode's start, zeros [batch, S]; None without a core."""
    size = hidden_size(network.settings)
    return jnp.zeros((batch, size), jnp.float32) if size else None


def reset_hidden(hidden: jax.Array | None, done: jax.Array) -> jax.Array | None:
    """``hidden`` [B, S] with the rows where ``done`` [B] set to the initial state (zeros)."""
    if hidden is None:
        return None
    return jnp.where(done[:, None], 0.0, hidden)


def kernel_scale(path: tuple[str, ...]) -> float:
    for name, scale in HEAD_SCALES.items():
        if name in path:
            return scale
    return CORE_SCALE if "core" in path else HIDDEN_SCALE


def initial_value(path: tuple[str, ...], settings: NetworkSettings) -> float:
    """What a bias or parameter at ``path`` starts at: init_log_std for the log-std, else 0."""
    if path[-1] == "log_std" or (path[-1] == "bias" and "log_std_head" in path):
        return settings.init_log_std
    return 0.0


def init_params(key: jax.Array, network: ActorCritic, observation: Any) -> dict:
    """Variables of ``network`` for observations like ``observation`` (one env's, unbatched;
    arrays or ``ShapeDtypeStruct``): orthogonal kernels (gain sqrt 2 for the encoder, 1 for
    the recurrent core, 0.01 for the policy and log-std heads, 1 for the value head; a conv
    kernel [kh, kw, c_in, c_out] as the matrix [kh kw c_in, c_out]), zero biases, and the
    Gaussian's log_std parameter (or its log-std head's bias) at ``init_log_std``.

    The Gaussian draws of all kernels come from one PRNG call and their QR factorisations
    from one batched loop (``orthogonalize``): each ``jax.random.normal`` call compiles to a
    sizeable program of its own, so one call per layer made init the slowest part of
    ``train`` to compile.
    """
    dummy = jax.tree.map(lambda leaf: jnp.zeros((1, *leaf.shape), jnp.float32), observation)
    hidden = initial_hidden(network, 1)
    shapes = jax.eval_shape(lambda: network.init(jax.random.key(0), dummy, hidden))
    paths, leaves = zip(*jax.tree_util.tree_flatten_with_path(shapes)[0], strict=True)
    names = [tuple(getattr(entry, "key", None) for entry in path) for path in paths]
    kernels = [index for index, name in enumerate(names) if name[-1] == "kernel"]
    kernel_shapes = [leaves[index].shape for index in kernels]
    sizes = [math.prod(tall_shape(shape)) for shape in kernel_shapes]
    draws = jnp.split(jax.random.normal(key, (sum(sizes),)), list(itertools.accumulate(sizes))[:-1])
    gaussians = [
        draw.reshape(tall_shape(shape)) for draw, shape in zip(draws, kernel_shapes, strict=True)
    ]
    scales = [kernel_scale(names[index]) for index in kernels]
    values = [
        jnp.full(leaf.shape, initial_value(name, network.settings), leaf.dtype)
        for name, leaf in zip(names, leaves, strict=True)
    ]
    for index, kernel in zip(kernels, orthogonalize(gaussians, kernel_shapes, scales), strict=True):
        values[index] = kernel
    return jax.tree.unflatten(jax.tree.structure(shapes), values)
