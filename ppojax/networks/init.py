"""Orthogonal initialisation without LAPACK.

The orthogonal initialiser here computes its QR factorisation with Householder reflections
written in plain jax.numpy. ``jax.nn.initializers.orthogonal`` calls LAPACK's QR, and under
``jax.vmap`` several batched LAPACK QR kernels in one program can deadlock on a 2-core CPU;
plain XLA ops cannot, so vmapping ``train`` over seeds never hangs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp


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
