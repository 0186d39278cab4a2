"""PPO on a gymnax env with discrete actions, the whole algorithm in one file, top to bottom.

The classic case only: float32 vector observations, an MLP actor and an MLP critic apart,
GAE, PPO-Clip, no normalization of observations or rewards, no early stop, no divergence
guard, no evaluation (``check_classic``). The library's
``ppojax.train`` computes the same run through its layers (``ppojax.ppo.rollout``,
``ppojax.engine.gae``, ``ppojax.engine.epochs``, ``ppojax.ppo.loss``), with speed forms that
swap in behind plain calls; this file writes the math out in plain JAX so that a reader sees
all of it, and tests/test_reference_ppo.py holds the two equal under ``kernels.plain()``.

Built from the library: the config (``PPOConfig``), the env's gymnax object and parameters
(``make_env``), the network and its initialisation, and the optimizer (clipping, then Adam on
all parameters as one vector). Everything else is below.

Randomness is consumed in the library's order, so one key gives one run in both:

    key -> (key, params_key, env_key)                      at the start
    state.key -> (next key, rollout_key, update_key)       each update
    rollout_key -> (_, noise_key); noise_key -> T step keys
    step key -> (env_key, reset_key, action_key)           each env step
    update_key -> E epoch keys, each one permutation of the T * B samples

(The library draws a rollout's randomness in blocks of at most 64 MiB, ``noise_block``; a
rollout that fits in one, every CartPole config up to about a million steps per rollout,
takes the keys above.)
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from ppojax.checks import ConfigError
from ppojax.engine.optim import clipped_adam
from ppojax.envs import make_env
from ppojax.networks import NetworkSettings, build_network, init_params, observation_template
from ppojax.ppo.config import PPOConfig


class Transition(NamedTuple):
    """One env step of every env; a rollout stacks them to [T, B, ...]."""

    obs: jax.Array  # [B, obs_dim], what the policy saw
    action: jax.Array  # [B]
    log_prob: jax.Array  # [B], log pi_old(action | obs)
    reward: jax.Array  # [B]
    terminated: jax.Array  # [B], the episode ended in a terminal state: no bootstrap
    truncated: jax.Array  # [B], the episode was cut by its time limit: bootstrap
    next_obs: jax.Array  # [B], the step's own next observation, before any reset
    episode_return: jax.Array  # [B], the return of an episode that ended here, else 0
    episode_length: jax.Array  # [B]


class RunState(NamedTuple):
    """Everything that carries from one update to the next."""

    params: Any
    opt_state: Any
    env_state: Any  # gymnax states [B]
    obs: jax.Array  # [B, obs_dim]
    episode_return: jax.Array  # [B], return so far of each env's running episode
    episode_length: jax.Array  # [B]
    key: jax.Array


def check_classic(config: PPOConfig) -> None:
    """``ConfigError`` for a setting this file does not implement."""
    classic = {
        "advantage_estimator": "gae",
        "policy_objective": "clip",
        "encoder": "mlp",
        "recurrent": None,
        "shared_torso": False,
        "normalize_observations": False,
        "normalize_rewards": False,
        "reward_clip": None,
        "target_kl": None,
        "divergence_guard": False,
        "reset_pool": None,
        "eval_every": None,
        "compute_dtype": "float32",
    }
    for name, value in classic.items():
        if getattr(config, name) != value:
            raise ConfigError(name, f"the reference PPO needs {name}={value!r}.")


def learning_rate(config: PPOConfig, step: jax.Array) -> jax.Array:
    """lr, or with anneal_lr lr * (1 - step / num_gradient_steps), floored at 0."""
    if not config.anneal_lr:
        return jnp.asarray(config.learning_rate, jnp.float32)
    return config.learning_rate * jnp.clip(1.0 - step / config.num_gradient_steps, 0.0, 1.0)


def make_optimizer(config: PPOConfig) -> optax.GradientTransformation:
    """Gradients clipped to a global norm of max_grad_norm, then Adam (eps 1e-5). ``flat``:
    on all parameters as one vector, the library's form, whose global norm is summed in that
    vector's order."""
    schedule = functools.partial(learning_rate, config)
    return clipped_adam(schedule, config.max_grad_norm, eps=1e-5, flat=True)


def train(config: PPOConfig, key: jax.Array) -> tuple[RunState, dict[str, jax.Array]]:
    """``config.num_updates`` updates of rollout, GAE and epochs; the last state and metrics
    [num_updates] per name."""
    check_classic(config)
    env = make_env(config.env_id, **config.env_kwargs)
    gym, env_params = env.env, env.env_params
    if not env.spec.discrete or env.spec.action_nvec is not None or env.spec.masked:
        raise ConfigError("env_id", "the reference PPO needs one discrete action, unmasked.")
    network = build_network(NetworkSettings.from_fields(config), env, config.env_id)
    optimizer = make_optimizer(config)

    key, params_key, env_key = jax.random.split(key, 3)
    params = init_params(params_key, network, observation_template(env))
    reset_keys = jax.random.split(env_key, config.num_envs)
    obs, env_state = jax.vmap(gym.reset_env, in_axes=(0, None))(reset_keys, env_params)
    zeros = jnp.zeros(config.num_envs)
    state = RunState(
        params, optimizer.init(params), env_state, obs, zeros, zeros.astype(jnp.int32), key
    )

    def update(state: RunState, _: None) -> tuple[RunState, dict[str, jax.Array]]:
        key, rollout_key, update_key = jax.random.split(state.key, 3)
        state, transitions = rollout(config, gym, env_params, network, state, rollout_key)
        values = value_of(network, state.params, transitions.obs)
        next_values = value_of(network, state.params, transitions.next_obs)
        advantages = gae(config, transitions, values, next_values)
        params, opt_state, metrics = epochs(
            config, network, optimizer, state, transitions, values, advantages, update_key
        )
        metrics.update(episode_metrics(transitions))
        return state._replace(params=params, opt_state=opt_state, key=key), metrics

    return jax.lax.scan(update, state, None, config.num_updates)


# -- the rollout: T steps of B envs with auto-reset ---------------------------------------


def rollout(
    config: PPOConfig, gym: Any, env_params: Any, network: Any, state: RunState, key: jax.Array
) -> tuple[RunState, Transition]:
    """``config.num_steps`` steps of every env under pi_params; transitions [T, B]."""

    def step(state: RunState, step_key: jax.Array) -> tuple[RunState, Transition]:
        env_key, reset_key, action_key = jax.random.split(step_key, 3)
        logits = network.apply(state.params, state.obs, None)[0]
        action = jax.random.categorical(action_key, logits)  # argmax(logits + Gumbel noise)
        log_prob = jnp.take_along_axis(jax.nn.log_softmax(logits), action[:, None], -1)[:, 0]

        env_keys = jax.random.split(env_key, config.num_envs)
        step_env = jax.vmap(gym.step_env, in_axes=(0, 0, 0, None))
        next_obs, stepped, reward, terminated, _ = step_env(
            env_keys, state.env_state, action, env_params
        )
        truncated = jax.vmap(gym.is_truncated, in_axes=(0, None))(stepped, env_params)
        done = terminated | truncated
        # auto-reset: where an episode ended, the env continues from a fresh start
        reset_keys = jax.random.split(reset_key, config.num_envs)
        fresh_obs, fresh = jax.vmap(gym.reset_env, in_axes=(0, None))(reset_keys, env_params)
        env_state = jax.tree.map(lambda a, b: jnp.where(_rows(done, a), a, b), fresh, stepped)
        obs = jnp.where(done[:, None], fresh_obs, next_obs)

        reward = reward.astype(jnp.float32)
        episode_return = state.episode_return + reward
        episode_length = state.episode_length + 1
        transition = Transition(
            state.obs,
            action,
            log_prob,
            reward,
            terminated,
            truncated,
            next_obs,
            jnp.where(done, episode_return, 0.0),
            jnp.where(done, episode_length, 0),
        )
        state = state._replace(
            env_state=env_state,
            obs=obs,
            episode_return=jnp.where(done, 0.0, episode_return),
            episode_length=jnp.where(done, 0, episode_length),
        )
        return state, transition

    _, noise_key = jax.random.split(key)
    return jax.lax.scan(step, state, jax.random.split(noise_key, config.num_steps))


def _rows(done: jax.Array, leaf: jax.Array) -> jax.Array:
    """``done`` [B] broadcast to ``leaf``'s [B, ...]."""
    return done.reshape(done.shape + (1,) * (leaf.ndim - 1))


# -- advantages: GAE that bootstraps truncated episodes and not terminated ones -----------


def value_of(network: Any, params: Any, obs: jax.Array) -> jax.Array:
    """V(obs) [T, B] of observations [T, B, obs_dim], in one call over all T * B of them.
    (The critic's matrix products over [T * B] rows: their float32 sums come out as the
    library's, which takes them in that one call too.)"""
    num_steps, num_envs = obs.shape[:2]
    values = network.apply(params, obs.reshape((num_steps * num_envs, -1)), None)[2]
    return values.reshape((num_steps, num_envs))


def gae(
    config: PPOConfig, transitions: Transition, values: jax.Array, next_values: jax.Array
) -> jax.Array:
    """Advantages [T, B]:

        delta_t = r_t + gamma (1 - terminated_t) V(next_obs_t) - V(obs_t)
        A_t = delta_t + gamma lambda (1 - done_t) A_{t+1},   A_T = 0

    V(next_obs_t) is the value of the step's own next observation, the final one of an
    episode that ended there: a truncated episode is worth more than its last reward, a
    terminated one is not.
    """
    not_terminated = 1.0 - transitions.terminated.astype(jnp.float32)
    not_done = 1.0 - (transitions.terminated | transitions.truncated).astype(jnp.float32)
    deltas = transitions.reward + config.gamma * not_terminated * next_values - values
    decays = config.gamma * config.gae_lambda * not_done

    def backward(next_advantage: jax.Array, step: tuple[jax.Array, jax.Array]):
        delta, decay = step
        advantage = delta + decay * next_advantage
        return advantage, advantage

    start = jnp.zeros_like(deltas[0])
    _, advantages = jax.lax.scan(backward, start, (deltas, decays), reverse=True)
    return advantages


# -- the update: epochs of shuffled minibatches, one Adam step each ------------------------


def epochs(
    config: PPOConfig,
    network: Any,
    optimizer: optax.GradientTransformation,
    state: RunState,
    transitions: Transition,
    values: jax.Array,
    advantages: jax.Array,
    key: jax.Array,
) -> tuple[Any, Any, dict[str, jax.Array]]:
    """``update_epochs`` passes over the T * B samples, each in ``num_minibatches`` random
    minibatches; the new params and optimizer state, and the loss terms' means over steps.
    The value target is A + V_old."""
    targets = advantages + values
    samples = (
        transitions.obs,
        transitions.action,
        transitions.log_prob,
        values,
        advantages,
        targets,
    )
    samples = jax.tree.map(lambda x: x.reshape((config.batch_size,) + x.shape[2:]), samples)

    def minibatch_step(carry: tuple[Any, Any], minibatch: tuple[jax.Array, ...]):
        params, opt_state = carry
        grad_fn = jax.value_and_grad(loss, argnums=2, has_aux=True)
        (_, terms), grads = grad_fn(config, network, params, minibatch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), terms

    def epoch(carry: tuple[Any, Any], epoch_key: jax.Array):
        order = jax.random.permutation(epoch_key, config.batch_size)
        shape = (config.num_minibatches, config.minibatch_size)
        minibatches = jax.tree.map(lambda x: x[order].reshape(shape + x.shape[1:]), samples)
        return jax.lax.scan(minibatch_step, carry, minibatches)

    carry = (state.params, state.opt_state)
    epoch_keys = jax.random.split(key, config.update_epochs)
    (params, opt_state), terms = jax.lax.scan(epoch, carry, epoch_keys)
    return params, opt_state, jax.tree.map(jnp.mean, terms)  # terms: [E, M] each


def loss(
    config: PPOConfig, network: Any, params: Any, minibatch: tuple[jax.Array, ...]
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """-L_clip + vf_coef * L_value - ent_coef * H on one minibatch [N], and its terms."""
    obs, action, old_log_prob, old_value, advantages, targets = minibatch
    logits, _, value, _ = network.apply(params, obs, None)
    log_probs = jax.nn.log_softmax(logits)
    log_prob = jnp.take_along_axis(log_probs, action[:, None], -1)[:, 0]

    if config.normalize_advantages:
        mean = advantages.mean()
        std = jnp.sqrt(jnp.square(advantages - mean).mean())
        advantages = (advantages - mean) / (std + 1e-8)
    log_ratio = log_prob - old_log_prob
    ratio = jnp.exp(log_ratio)
    clipped_ratio = jnp.clip(ratio, 1.0 - config.clip_eps, 1.0 + config.clip_eps)
    policy_loss = -jnp.minimum(ratio * advantages, clipped_ratio * advantages).mean()

    squared = jnp.square(value - targets)
    if config.vf_clip_eps is not None:
        eps = config.vf_clip_eps
        clipped_value = old_value + jnp.clip(value - old_value, -eps, eps)
        squared = jnp.maximum(squared, jnp.square(clipped_value - targets))
    value_loss = 0.5 * squared.mean()

    entropy = (-(jnp.exp(log_probs) * log_probs).sum(-1)).mean()
    total = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
    terms = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "entropy": entropy,
        "approx_kl": jax.lax.stop_gradient((jnp.expm1(log_ratio) - log_ratio).mean()),
        "clip_fraction": (jnp.abs(ratio - 1.0) > config.clip_eps).astype(jnp.float32).mean(),
    }
    return total, terms


def episode_metrics(transitions: Transition) -> dict[str, jax.Array]:
    """Mean return and length of the episodes that ended in the rollout (NaN if none)."""
    done = transitions.terminated | transitions.truncated
    count = done.sum()

    def mean(x: jax.Array) -> jax.Array:
        total = jnp.where(done, x, 0).sum().astype(jnp.float32)
        return jnp.where(count > 0, total / jnp.maximum(count, 1).astype(jnp.float32), jnp.nan)

    return {
        "episode_return": mean(transitions.episode_return),
        "episode_length": mean(transitions.episode_length),
        "episodes_finished": count,
    }
