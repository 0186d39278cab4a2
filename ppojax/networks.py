"""Actor and critic MLPs (flax.linen) with orthogonal initialisation.

The orthogonal initialiser here computes its QR factorisation with Householder reflections
written in plain jax.numpy. ``jax.nn.initializers.orthogonal`` calls LAPACK's QR, and under
``jax.vmap`` several batched LAPACK QR kernels in one program can deadlock on a 2-core CPU;
plain XLA ops cannot, so vmapping ``train`` over seeds never hangs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from ppojax.envs import EnvSpec

ACTIVATION_FNS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "tanh": jnp.tanh,
    "relu": nn.relu,
    "gelu": nn.gelu,
    "silu": nn.silu,
    "elu": nn.elu,
}


def householder_qr_q(matrix: jax.Array) -> jax.Array:
    """Q of the reduced QR of ``matrix`` [m, n] (m >= n), signed so diag(R) > 0.

    Uses n Householder reflections H_j = I - 2 v v^T in a ``fori_loop``: Q = H_1 ... H_n.
    """
    rows, cols = matrix.shape
    row_index = jnp.arange(rows)

    def reflect(j: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]):
        r, q, signs = carry
        x = jnp.where(row_index >= j, r[:, j], 0.0)
        pivot = x[j]
        sign = jnp.where(pivot >= 0, 1.0, -1.0)
        alpha = -sign * jnp.linalg.norm(x)
        v = x - alpha * (row_index == j)
        v_norm = jnp.linalg.norm(v)
        v = jnp.where(v_norm > 0, v / jnp.where(v_norm > 0, v_norm, 1.0), 0.0)
        r = r - 2.0 * jnp.outer(v, v @ r)
        q = q - 2.0 * jnp.outer(q @ v, v)
        return r, q, signs.at[j].set(jnp.where(alpha >= 0, 1.0, -1.0))

    eye = jnp.eye(rows, dtype=matrix.dtype)
    signs = jnp.ones((cols,), matrix.dtype)
    _, q, signs = jax.lax.fori_loop(0, cols, reflect, (matrix, eye, signs))
    return q[:, :cols] * signs[None, :]


def orthogonal(scale: float = 1.0) -> Callable[..., jax.Array]:
    """Initialiser drawing (semi-)orthogonal matrices, the same values as
    ``jax.nn.initializers.orthogonal(scale)`` for the same key, without LAPACK."""

    def init(key: jax.Array, shape: Sequence[int], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        if len(shape) < 2:
            raise ValueError(f"orthogonal init needs a 2-D or larger shape, got {shape}")
        n_cols = shape[-1]
        n_rows = math.prod(shape) // n_cols
        gaussian = jax.random.normal(key, (max(n_rows, n_cols), min(n_rows, n_cols)), dtype)
        q = householder_qr_q(gaussian)
        if n_rows < n_cols:
            q = q.T
        return (scale * q).reshape(shape).astype(dtype)

    return init


class MLP(nn.Module):
    """Hidden layers of ``hidden_sizes`` with ``activation``, orthogonal(sqrt 2) init."""

    hidden_sizes: Sequence[int]
    activation: str

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATION_FNS[self.activation]
        for size in self.hidden_sizes:
            x = act(nn.Dense(size, kernel_init=orthogonal(math.sqrt(2.0)))(x))
        return x


class Actor(nn.Module):
    """Policy head: logits [.., n] (discrete) or (mean [.., d], log_std [d]) (continuous)."""

    spec: EnvSpec
    hidden_sizes: Sequence[int]
    activation: str

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        x = MLP(self.hidden_sizes, self.activation)(obs)
        head = nn.Dense(self.spec.action_dim, kernel_init=orthogonal(0.01))(x)
        if self.spec.discrete:
            return head, None
        log_std = self.param("log_std", nn.initializers.zeros, (self.spec.action_dim,))
        return head, log_std


class Critic(nn.Module):
    """State-value head: V(obs) [..]."""

    hidden_sizes: Sequence[int]
    activation: str

    @nn.compact
    def __call__(self, obs: jax.Array) -> jax.Array:
        x = MLP(self.hidden_sizes, self.activation)(obs)
        return nn.Dense(1, kernel_init=orthogonal(1.0))(x)[..., 0]


def build_networks(
    spec: EnvSpec, hidden_sizes: Sequence[int], activation: str
) -> tuple[Actor, Critic]:
    return (
        Actor(spec, tuple(hidden_sizes), activation),
        Critic(tuple(hidden_sizes), activation),
    )


def init_params(
    key: jax.Array, spec: EnvSpec, hidden_sizes: Sequence[int], activation: str
) -> dict:
    """Parameters ``{"actor": ..., "critic": ...}`` for observations of size spec.obs_dim."""
    actor, critic = build_networks(spec, hidden_sizes, activation)
    actor_key, critic_key = jax.random.split(key)
    dummy = jnp.zeros((spec.obs_dim,), jnp.float32)
    return {"actor": actor.init(actor_key, dummy), "critic": critic.init(critic_key, dummy)}
