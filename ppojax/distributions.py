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


def draw_action_noise(spec: EnvSpec, key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Noise for ``shape`` actions at once: standard Gumbel (discrete) or standard normal."""
    draw = jax.random.gumbel if spec.discrete else jax.random.normal
    return draw(key, shape + (spec.action_dim,))


def sample_from_noise(
    spec: EnvSpec, head: jax.Array, log_std: jax.Array | None, noise: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """An action of ``policy_distribution(spec, head, log_std)`` and its log-probability,
    from noise drawn beforehand by ``draw_action_noise``: argmax(logits + Gumbel) for
    Categorical (the Gumbel-max trick, as ``jax.random.categorical``), mean + std * N(0, 1)
    for the Gaussian. Drawing a rollout's noise in one batch replaces one PRNG call per step."""
    if spec.discrete:
        action = jnp.argmax(head + noise, axis=-1)
    else:
        action = head + jnp.exp(log_std) * noise
    return action, policy_distribution(spec, head, log_std).log_prob(action)
