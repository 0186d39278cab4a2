"""Policy distributions (distrax) built from the actor's output."""

from __future__ import annotations

import distrax
import jax
import jax.numpy as jnp

from ppojax.envs import EnvSpec


def policy_distribution(
    spec: EnvSpec, head: jax.Array, log_std: jax.Array | None
) -> distrax.Distribution:
    """Categorical(logits=head) for discrete actions; for continuous actions a diagonal
    Gaussian N(head, exp(log_std)^2) whose log_std is state-independent."""
    if spec.discrete:
        return distrax.Categorical(logits=head)
    scale = jnp.broadcast_to(jnp.exp(log_std), head.shape)
    return distrax.MultivariateNormalDiag(loc=head, scale_diag=scale)


def deterministic_action(spec: EnvSpec, head: jax.Array) -> jax.Array:
    """The mode of the policy: argmax of the logits, or the Gaussian mean."""
    if spec.discrete:
        return jnp.argmax(head, axis=-1)
    return head
