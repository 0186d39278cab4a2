"""The one optimizer factory both halves use: global-norm gradient clipping, then Adam."""

from __future__ import annotations

from typing import Any

import optax


def clipped_adam(
    learning_rate: Any,
    max_grad_norm: Any,
    *,
    eps: float = 1e-8,
    flat: bool = False,
) -> optax.GradientTransformation:
    """Gradients clipped to a global norm of ``max_grad_norm``, then Adam at ``learning_rate``
    (a number, or a schedule of the optimizer's step count) with ``eps``.

    ``flat`` runs both over all parameters as one vector: the same arithmetic as per leaf, in
    a few kernels per step instead of a few per leaf, which pays for the many small leaves of
    an env policy (benchmarks/compare.py --program-size) and costs a copy of every parameter
    for a language model's few large ones.
    """
    optimizer = optax.chain(
        optax.clip_by_global_norm(max_grad_norm), optax.adam(learning_rate, eps=eps)
    )
    return optax.flatten(optimizer) if flat else optimizer
