"""Turn-level credit for episodes: the advantage each model token gets, [N, L].

Episode-level (``update.episode_advantages``, GRPO or RLOO over the group of ``group_size``
episodes from one reset): every model token of episode i gets A_i, the group advantage of
R_i = score_i - beta * sum of its model tokens' KL.

Turn-level, with a mixing weight w (the idea of MT-GRPO: Zeng et al. 2025, "Reinforcing
multi-turn reasoning in LLM agents via turn-level credit assignment"): a model token of turn k
gets

    (1 - w) * A_i + w * T_ik,   T_ik = the group advantage of G_ik = sum_{j >= k} r_ij

where r_ij = reward_ij - beta * (KL of episode i's model tokens in turn j) and the group is the
episodes of i's group that reached turn k (wrote a token in it): those whose history brought
them to turn k, compared on what followed. G_i0 = R_i and every episode writes in turn 0, so
T_i0 = A_i (to float32 rounding): turn 0 gets the episode advantage at every w. w = 0 gives
episode-level credit exactly.

PPO (``episode_gae``): token-level GAE over the sequence of an episode's model tokens in
order, the env's tokens skipped. With t = 1..n the model tokens of episode i,

    r_t = -beta * KL_t + (reward_ik if t is the last model token of turn k, else 0)
    delta_t = r_t + gamma * V_{t+1} - V_t   (V_{n+1} = 0: the episode's last token is terminal)
    A_t = delta_t + gamma * lambda * A_{t+1},   returns_t = A_t + V_t

so the value of turn k+1's first token bootstraps turn k's last across the env's reply, and
the env's tokens get no reward, value target or advantage.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.rlhf.core import advantages as adv


def masked_group_advantages(
    algorithm: str,
    values: jax.Array,
    members: jax.Array,
    group_size: int,
    divide_by_std: bool,
    eps: float = 1e-6,
) -> jax.Array:
    """``algorithm``'s group advantages of ``values`` [N, T] per column, each group of
    ``group_size`` adjacent rows restricted to its ``members`` [N, T] (``core.advantages``'s
    ``masked`` baseline: GRPO (v - mean) / (std + eps), RLOO v - the mean of the other
    members); 0 off ``members``."""
    baseline = adv.critic_free(algorithm).masked
    return baseline(values, members, group_size, divide_by_std, eps)


def per_turn(values: jax.Array, turn_index: np.ndarray, num_turns: int) -> jax.Array:
    """[N, T]: the sum of ``values`` [N, L] over each turn's columns (``turn_index`` [L], -1
    on the prompt, which no turn holds)."""
    one_hot = jnp.asarray(turn_index[:, None] == np.arange(num_turns)[None, :], values.dtype)
    return values @ one_hot


def turn_advantages(
    algorithm: str,
    group_size: int,
    group_std: bool,
    rewards: jax.Array,
    penalty_kl: jax.Array,
    beta: Any,
    model_mask: jax.Array,
    turn_index: np.ndarray,
) -> jax.Array:
    """[N, L]: T_ik (see the module) on every model token of turn k, 0 elsewhere; ``rewards``
    [N, T] per turn, ``penalty_kl`` [N, L] the KL that ``beta`` weighs, ``turn_index`` [L]
    each column's turn."""
    num_turns = rewards.shape[1]
    turn_kl = per_turn(jnp.where(model_mask, penalty_kl, 0.0), turn_index, num_turns)
    turn_rewards = rewards - beta * turn_kl
    returns = jnp.cumsum(turn_rewards[:, ::-1], axis=1)[:, ::-1]
    reached = per_turn(model_mask.astype(jnp.float32), turn_index, num_turns) > 0
    by_turn = masked_group_advantages(algorithm, returns, reached, group_size, group_std)
    columns = jnp.asarray(np.maximum(turn_index, 0))
    return jnp.where(model_mask, by_turn[:, columns], 0.0)


def mixed_advantages(episode: jax.Array, turn: jax.Array, turn_weight: Any) -> jax.Array:
    """(1 - w) * episode + w * turn, both [N, L]; w = ``turn_weight`` (may be traced)."""
    return (1.0 - turn_weight) * episode + turn_weight * turn


def turn_ends(model_mask: jax.Array, turn_index: np.ndarray) -> jax.Array:
    """[N, L] bool: the last model token of each turn (no later model token in its turn)."""
    turn_index = np.asarray(turn_index)
    same_turn = np.append(turn_index[1:] == turn_index[:-1], False)
    following = jnp.pad(model_mask[:, 1:], ((0, 0), (0, 1))) & same_turn
    return model_mask & ~following


class Slots(NamedTuple):
    """Each row's model tokens in order, moved to the front of M slots: ``columns`` [N, M] the
    column of slot j (the row's j-th model token; 0 for an empty slot) and ``mask`` [N, M]
    (slot j holds one). The trainer's update reads episodes in slots: a one-turn episode's
    slots are its response's R columns, in order."""

    columns: jax.Array
    mask: jax.Array

    def gather(self, x: jax.Array) -> jax.Array:
        """[N, L] -> [N, M]: the value at each slot's column, 0 in empty slots."""
        return jnp.where(self.mask, jnp.take_along_axis(x, self.columns, axis=1), 0)

    def scatter(self, x: jax.Array, width: int) -> jax.Array:
        """[N, M] -> [N, width]: each slot's value at its column, 0 on the other columns."""
        rows = jnp.arange(x.shape[0])[:, None]
        target = jnp.where(self.mask, self.columns, width)
        return jnp.zeros((x.shape[0], width), x.dtype).at[rows, target].set(x, mode="drop")


def model_slots(model_mask: jax.Array, num_slots: int) -> Slots:
    """The ``Slots`` of ``model_mask`` [N, L] (at most ``num_slots`` model tokens a row):
    model token j of a row goes to slot j (a scatter to slot cumsum - 1)."""
    rows, width = model_mask.shape
    slot = jnp.where(model_mask, jnp.cumsum(model_mask, axis=1) - 1, num_slots)
    columns = jnp.broadcast_to(jnp.arange(width, dtype=jnp.int32), (rows, width))
    row = jnp.arange(rows)[:, None]
    placed = jnp.zeros((rows, num_slots), jnp.int32).at[row, slot].set(columns, mode="drop")
    count = model_mask.sum(axis=1)
    return Slots(placed, jnp.arange(num_slots)[None, :] < count[:, None])


def episode_token_rewards(
    rewards: jax.Array,
    penalty_kl: jax.Array,
    model_mask: jax.Array,
    turn_index: np.ndarray,
    beta: Any,
) -> jax.Array:
    """[N, L]: r_t = -beta * KL_t on each model token, plus turn k's reward ``rewards`` [N, T]
    on its last model token; 0 off ``model_mask``."""
    columns = jnp.asarray(np.maximum(np.asarray(turn_index), 0))
    kl_part = jnp.where(model_mask, -beta * penalty_kl, 0.0)
    return kl_part + jnp.where(turn_ends(model_mask, turn_index), rewards[:, columns], 0.0)


def slot_gae(
    token_rewards: jax.Array,
    values: jax.Array,
    slots: Slots,
    gamma: Any,
    gae_lambda: Any,
) -> tuple[jax.Array, jax.Array]:
    """PPO's GAE advantages and returns over each row's model tokens in order (see the
    module), all [N, M] in slots: ``core.advantages.token_advantages`` (``compute_gae``), whose
    terminal is each row's last filled slot."""
    return adv.token_advantages(token_rewards, values, slots.mask, gamma, gae_lambda)


def episode_gae(
    rewards: jax.Array,
    penalty_kl: jax.Array,
    values: jax.Array,
    model_mask: jax.Array,
    turn_index: np.ndarray,
    beta: Any,
    gamma: Any,
    gae_lambda: Any,
) -> tuple[jax.Array, jax.Array]:
    """PPO's advantages and returns [N, L] (see the module), 0 off ``model_mask``: ``rewards``
    [N, T] per turn, ``penalty_kl`` [N, L] the KL that ``beta`` weighs, ``values`` [N, L] the
    critic's V before each column's token. Each row's model tokens go to slots
    (``model_slots``), through ``slot_gae`` and back to their columns."""
    width = model_mask.shape[1]
    slots = model_slots(model_mask, width)
    token_rewards = episode_token_rewards(rewards, penalty_kl, model_mask, turn_index, beta)
    advantages, returns = slot_gae(
        slots.gather(token_rewards), slots.gather(values), slots, gamma, gae_lambda
    )
    return slots.scatter(advantages, width), slots.scatter(returns, width)
