"""The actor's and the critic's MLPs as one MLP (the kernels candidate "fused_actor_critic").

Two MLP torsos of the same widths read the same observation: their first layers side by side
are one layer [D, 2 H], their later layers block-diagonal [2 H, 2 H], and the heads one block-
diagonal layer [2 H, A (+ A) + 1]. The products with the zero blocks add exact zeros, so the
outputs are the two networks' (up to the order of a sum's terms), from the same parameters,
in one matrix product per layer instead of two, forward and backward. The off-diagonal blocks
double the FLOPs of the later layers; what it saves is kernels and passes over the
activations, which is what a small network costs on a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

Layer = tuple[jax.Array, jax.Array]  # (kernel [in, out], bias [out])


def block_diagonal(upper: jax.Array, lower: jax.Array) -> jax.Array:
    """[[upper, 0], [0, lower]]: [m, n] and [p, q] -> [m + p, n + q]."""
    top = jnp.concatenate([upper, jnp.zeros((upper.shape[0], lower.shape[1]), upper.dtype)], 1)
    bottom = jnp.concatenate([jnp.zeros((lower.shape[0], upper.shape[1]), lower.dtype), lower], 1)
    return jnp.concatenate([top, bottom], 0)


def torso_layers(torso: Mapping[str, Any], depth: int) -> list[Layer]:
    """The (kernel, bias) of each Dense layer of one MLP torso's parameters."""
    mlp = torso["MLP_0"]
    return [(mlp[f"Dense_{i}"]["kernel"], mlp[f"Dense_{i}"]["bias"]) for i in range(depth)]


def actor_critic_layers(params: Mapping[str, Any], depth: int) -> tuple[list[Layer], list[Layer]]:
    """The (kernel, bias) of the actor's and the critic's MLP layers, each followed by its
    head's (the kernels candidate "pallas_ppo_loss" takes them so)."""
    return tuple(
        torso_layers(params[f"{side}_torso"], depth)
        + [(params[f"{side}_head"]["kernel"], params[f"{side}_head"]["bias"])]
        for side in ("actor", "critic")
    )


def fused_layers(actor: list[Layer], critic: list[Layer]) -> list[Layer]:
    """The layers of the fused MLP: the first side by side, the others block-diagonal."""
    (actor_kernel, actor_bias), (critic_kernel, critic_bias) = actor[0], critic[0]
    layers = [
        (
            jnp.concatenate([actor_kernel, critic_kernel], 1),
            jnp.concatenate([actor_bias, critic_bias]),
        )
    ]
    for (actor_kernel, actor_bias), (critic_kernel, critic_bias) in zip(
        actor[1:], critic[1:], strict=True
    ):
        layers.append(
            (
                block_diagonal(actor_kernel, critic_kernel),
                jnp.concatenate([actor_bias, critic_bias]),
            )
        )
    return layers


def fused_heads(params: Mapping[str, Any], state_dependent_std: bool) -> Layer:
    """The actor's heads (policy, and the log-std head when ``state_dependent_std``) on the
    actor's features and the critic's head on the critic's, as one block-diagonal layer."""
    actor_heads = ["actor_head"] + (["log_std_head"] if state_dependent_std else [])
    actor_kernel = jnp.concatenate([params[name]["kernel"] for name in actor_heads], 1)
    actor_bias = jnp.concatenate([params[name]["bias"] for name in actor_heads])
    critic = params["critic_head"]
    kernel = block_diagonal(actor_kernel, critic["kernel"])
    return kernel, jnp.concatenate([actor_bias, critic["bias"]])


def fused_actor_critic(
    params: Mapping[str, Any],
    x: jax.Array,
    depth: int,
    activation: Callable[[jax.Array], jax.Array],
    action_dim: int,
    state_dependent_std: bool,
    dtype: Any = jnp.float32,
) -> tuple[jax.Array, jax.Array | None, jax.Array]:
    """(policy head [B, A], the log-std head's output [B, A] or None, value [B]) of the two
    MLP torsos of ``depth`` layers, computed in ``dtype``, and their float32 heads, from flat
    features ``x`` [B, D]."""
    layers = fused_layers(
        torso_layers(params["actor_torso"], depth), torso_layers(params["critic_torso"], depth)
    )
    x = x.astype(dtype)
    for kernel, bias in layers:
        x = activation(x @ kernel.astype(dtype) + bias.astype(dtype))
    x = x.astype(jnp.float32)
    kernel, bias = fused_heads(params, state_dependent_std)
    out = x @ kernel + bias
    head = out[:, :action_dim]
    log_std = out[:, action_dim : 2 * action_dim] if state_dependent_std else None
    return head, log_std, out[:, -1]
