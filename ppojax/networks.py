"""Actor and critic MLPs (flax.linen) with orthogonal initialisation.

The orthogonal initialiser here computes its QR factorisation with Householder reflections
written in plain jax.numpy. ``jax.nn.initializers.orthogonal`` calls LAPACK's QR, and under
``jax.vmap`` several batched LAPACK QR kernels in one program can deadlock on a 2-core CPU;
plain XLA ops cannot, so vmapping ``train`` over seeds never hangs.
"""

from __future__ import annotations

import itertools
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
        gaussian = jax.random.normal(key, tall_shape(shape), dtype)
        return orthogonalize([gaussian], [tuple(shape)], [scale])[0]

    return init


def tall_shape(shape: Sequence[int]) -> tuple[int, int]:
    """The [m, n] (m >= n) Gaussian matrix ``orthogonal`` draws for a kernel of ``shape``."""
    if len(shape) < 2:
        raise ValueError(f"orthogonal init needs a 2-D or larger shape, got {shape}")
    cols = shape[-1]
    rows = math.prod(shape) // cols
    return max(rows, cols), min(rows, cols)


def orthogonalize(
    gaussians: Sequence[jax.Array], shapes: Sequence[tuple[int, ...]], scales: Sequence[float]
) -> list[jax.Array]:
    """``scale * Q`` of each Gaussian draw (of ``tall_shape(shape)``), laid out in ``shape``
    (transposed where the kernel is wider than tall), all in one batched Householder loop:
    every matrix is zero-padded to the largest shape, which leaves its Q unchanged (the
    reflections act as the identity on the padding). One loop for all layers compiles
    several times faster than one loop per layer."""
    rows = max(gaussian.shape[0] for gaussian in gaussians)
    cols = max(gaussian.shape[1] for gaussian in gaussians)
    padded = jnp.stack(
        [jnp.pad(g, ((0, rows - g.shape[0]), (0, cols - g.shape[1]))) for g in gaussians]
    )
    q = jax.vmap(householder_qr_q)(padded)
    out = []
    for index, (gaussian, shape, scale) in enumerate(zip(gaussians, shapes, scales, strict=True)):
        matrix = q[index, : gaussian.shape[0], : gaussian.shape[1]]
        if math.prod(shape) // shape[-1] < shape[-1]:
            matrix = matrix.T
        out.append((scale * matrix).reshape(shape).astype(gaussian.dtype))
    return out


HIDDEN_SCALE = math.sqrt(2.0)  # gain of the hidden layers (tanh/relu MLPs)
HEAD_SCALES = {"actor": 0.01, "critic": 1.0}  # small policy logits, unit-scale values


class MLP(nn.Module):
    """Hidden layers of ``hidden_sizes`` with ``activation``, orthogonal(sqrt 2) init."""

    hidden_sizes: Sequence[int]
    activation: str

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATION_FNS[self.activation]
        for size in self.hidden_sizes:
            x = act(nn.Dense(size, kernel_init=orthogonal(HIDDEN_SCALE))(x))
        return x


class Actor(nn.Module):
    """Policy head: logits [.., n] (discrete) or (mean [.., d], log_std [d]) (continuous)."""

    spec: EnvSpec
    hidden_sizes: Sequence[int]
    activation: str

    @nn.compact
    def __call__(self, obs: jax.Array) -> tuple[jax.Array, jax.Array | None]:
        x = MLP(self.hidden_sizes, self.activation)(obs)
        head = nn.Dense(self.spec.action_dim, kernel_init=orthogonal(HEAD_SCALES["actor"]))(x)
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
        return nn.Dense(1, kernel_init=orthogonal(HEAD_SCALES["critic"]))(x)[..., 0]


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
    """Parameters ``{"actor": ..., "critic": ...}`` for observations of size spec.obs_dim:
    orthogonal kernels (gain sqrt 2 for hidden layers, 0.01 for the policy head, 1 for the
    value head), zero biases and zero log_std.

    The Gaussian draws of all kernels come from one PRNG call and their QR factorisations
    from one batched loop (``orthogonalize``): each ``jax.random.normal`` call compiles to a
    sizeable program of its own, so one call per layer made init the slowest part of
    ``train`` to compile.
    """
    hidden = tuple(hidden_sizes)
    dummy = jnp.zeros((spec.obs_dim,), jnp.float32)
    shapes = jax.eval_shape(
        lambda: {
            "actor": Actor(spec, hidden, activation).init(jax.random.key(0), dummy),
            "critic": Critic(hidden, activation).init(jax.random.key(0), dummy),
        }
    )
    paths, leaves = zip(*jax.tree_util.tree_flatten_with_path(shapes)[0], strict=True)
    names = [tuple(getattr(entry, "key", None) for entry in path) for path in paths]
    kernels = [index for index, name in enumerate(names) if name[-1] == "kernel"]
    kernel_shapes = [leaves[index].shape for index in kernels]
    sizes = [math.prod(tall_shape(shape)) for shape in kernel_shapes]
    draws = jnp.split(jax.random.normal(key, (sum(sizes),)), list(itertools.accumulate(sizes))[:-1])
    gaussians = [
        draw.reshape(tall_shape(shape)) for draw, shape in zip(draws, kernel_shapes, strict=True)
    ]
    scales = [HIDDEN_SCALE if "MLP_0" in names[i] else HEAD_SCALES[names[i][0]] for i in kernels]
    values = [jnp.zeros(leaf.shape, leaf.dtype) for leaf in leaves]
    for index, kernel in zip(kernels, orthogonalize(gaussians, kernel_shapes, scales), strict=True):
        values[index] = kernel
    return jax.tree.unflatten(jax.tree.structure(shapes), values)
