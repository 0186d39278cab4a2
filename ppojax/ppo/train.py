"""``train(config, key)``: the whole PPO loop as one pure, jittable, vmappable function."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from ppojax.engine.epochs import OptimizerCarry
from ppojax.engine.gae import ADVANTAGE_ESTIMATORS
from ppojax.engine.losses import explained_variance
from ppojax.envs import make_env
from ppojax.envs.normalize import RewardNormalizer, observation_stats
from ppojax.networks import (
    NetworkSettings,
    build_network,
    init_params,
    initial_hidden,
    observation_template,
)
from ppojax.ppo.config import PPOConfig
from ppojax.ppo.evaluation import eval_key, eval_metrics, run_episodes, skipped_metrics
from ppojax.ppo.loss import policy_kl, uses_analytic_kl
from ppojax.ppo.rollout import (
    act,
    collect_rollout,
    episode_metrics,
    reset_envs,
    rollout_start,
)
from ppojax.ppo.types import (
    Agent,
    Batch,
    Metrics,
    SequenceBatch,
    TrainOutput,
    TrainState,
    Transition,
    as_key,
)
from ppojax.ppo.update import (
    adaptive_kl_update,
    learning_rate_at,
    make_optimizer,
    ppo_update,
)
from ppojax.runtime.sharding import constrain_env_axis


def make_agent(config: PPOConfig) -> Agent:
    """The env and network module that ``config`` describes; ``ConfigError`` naming the field
    when the encoder cannot take the env's observations."""
    env = make_env(config.env_id, **config.env_kwargs)
    return Agent(env, build_network(NetworkSettings.from_fields(config), env, config.env_id))


def init_state(config: PPOConfig, key: jax.Array) -> TrainState:
    """Fresh parameters, optimizer state and reset environments; ``key`` as for ``train``."""
    agent = make_agent(config)
    key, params_key, env_key = jax.random.split(as_key(key, "ppojax.init_state"), 3)
    observation = observation_template(agent.env)
    params = init_params(params_key, agent.network, observation)
    hidden = initial_hidden(agent.network, config.num_envs)
    obs, env_state = reset_envs(agent, env_key, config.num_envs)
    return TrainState(
        params=params,
        opt_state=make_optimizer(config).init(params),
        env_state=env_state,
        obs=obs,
        obs_stats=observation_stats(observation),
        reward_normalizer=RewardNormalizer.zeros(config.num_envs),
        kl_coef=jnp.asarray(config.penalty_coef, jnp.float32),
        key=key,
        update_step=jnp.int32(0),
        env_steps=jnp.int32(0),
        gradient_steps=jnp.int32(0),
        hidden=hidden,
    )


def next_values(agent: Agent, params: dict, transitions: Transition) -> jax.Array:
    """V(next_obs) [T, B] from the hidden state before any reset at an episode end, so that a
    truncated episode bootstraps from its own memory, in one batched call over [T * B]."""

    def merge(x: jax.Array) -> jax.Array:
        return x.reshape((-1,) + x.shape[2:])

    next_obs = jax.tree.map(merge, transitions.next_obs)
    hidden = None if transitions.next_hidden is None else merge(transitions.next_hidden)
    values = agent.network.apply(params, next_obs, hidden, method="value")
    return values.reshape(transitions.reward.shape)


def make_batch(
    agent: Agent,
    config: PPOConfig,
    params: dict,
    transitions: Transition,
    start_hidden: jax.Array | None = None,
) -> Batch | SequenceBatch:
    """Advantages over the rollout [T, B] by ``config.advantage_estimator`` (GAE by default),
    flattened to [T * B] samples; for a recurrent policy the env sequences [T, B] with their
    reset marks and ``start_hidden`` [B, S], the hidden state the rollout started from."""
    estimator = ADVANTAGE_ESTIMATORS[config.advantage_estimator]
    advantages, targets = estimator(
        transitions.reward,
        transitions.value,
        next_values(agent, params, transitions),
        transitions.terminated,
        transitions.truncated,
        gamma=config.gamma,
        gae_lambda=config.gae_lambda,
    )
    # Every Batch field but the estimator's outputs is the rollout's field of the same name.
    carried = {k: v for k, v in transitions._asdict().items() if k in Batch._fields}
    batch = Batch(**carried, advantage=advantages, target=targets)
    if start_hidden is not None:
        done = jnp.logical_or(transitions.terminated, transitions.truncated)
        starts = jnp.concatenate([jnp.zeros_like(done[:1]), done[:-1]])
        return SequenceBatch(batch, starts, start_hidden)
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), batch)


def next_kl_coef(config: PPOConfig, kl_coef: jax.Array, kl: jax.Array) -> jax.Array:
    """beta for the next update: the adaptive rule when PPO-Penalty adapts it, else unchanged."""
    if not uses_analytic_kl(config) or not config.adaptive_penalty:
        return kl_coef
    return adaptive_kl_update(kl_coef, kl, config.penalty_target)


def update_step(
    agent: Agent, optimizer: optax.GradientTransformation, config: PPOConfig, state: TrainState
) -> tuple[TrainState, Metrics]:
    """One rollout, GAE, and ``update_epochs`` epochs of minibatch updates."""
    key, rollout_key, update_key = jax.random.split(state.key, 3)
    start = rollout_start(state, rollout_key)
    # The named scopes label the compiled ops by phase, for profiles and per-phase counts.
    with jax.named_scope("rollout"):
        carry, transitions = collect_rollout(agent, config, state.params, start)
    with jax.named_scope("gae"):
        batch = make_batch(agent, config, state.params, transitions, state.hidden)
    with jax.named_scope("epochs"):
        optimized, loss_metrics = ppo_update(
            agent,
            config,
            optimizer,
            OptimizerCarry(state.params, state.opt_state),
            batch,
            state.kl_coef,
            update_key,
        )
    kl = jnp.float32(jnp.nan)
    if uses_analytic_kl(config):
        with jax.named_scope("post_update_kl"):
            kl = policy_kl(agent, optimized.params, batch)
    env_steps = state.env_steps + config.batch_size
    samples = batch.data if isinstance(batch, SequenceBatch) else batch
    metrics = {
        **episode_metrics(transitions),
        **loss_metrics,
        "explained_variance": explained_variance(samples.value, samples.target),
        "learning_rate": learning_rate_at(config, state.gradient_steps),
        "env_steps": env_steps,
        "kl": kl,
        "kl_coef": state.kl_coef,
        "repeated_starts": carry.repeated_starts,
    }
    new_state = TrainState(
        **optimized._asdict(),  # params and opt_state
        env_state=carry.env_state,
        obs=carry.obs,
        obs_stats=carry.obs_stats,
        reward_normalizer=carry.reward_normalizer,
        kl_coef=next_kl_coef(config, state.kl_coef, kl),
        key=key,
        update_step=state.update_step + 1,
        env_steps=env_steps,
        gradient_steps=state.gradient_steps + loss_metrics["gradient_steps"].astype(jnp.int32),
        hidden=carry.hidden,
    )
    return new_state, metrics


def evaluation_metrics(agent: Agent, config: PPOConfig, state: TrainState) -> Metrics:
    """``eval_return`` and ``eval_length`` of ``config.eval_episodes`` fresh episodes of the
    policy in ``state`` (observations normalized with its frozen statistics), keyed by
    ``eval_key(state.key)``."""
    stats = run_episodes(
        agent.env,
        functools.partial(act, agent, config, state.params, state.obs_stats),
        eval_key(state.key),
        config.eval_episodes,
        config.eval_deterministic,
        hidden=initial_hidden(agent.network, config.eval_episodes),
    )
    return eval_metrics(stats)


def eval_due(config: PPOConfig, update: jax.Array) -> jax.Array | None:
    """Whether update number ``update`` (counted from 1) ends with an evaluation: every
    ``eval_every``-th and the last one, so the final policy is always evaluated. None without
    evaluation (nothing is added to the program)."""
    if config.eval_every is None:
        return None
    return (update % config.eval_every == 0) | (update == config.num_updates)


def train_step(
    agent: Agent,
    optimizer: optax.GradientTransformation,
    config: PPOConfig,
    state: TrainState,
    due: jax.Array | None = None,
) -> tuple[TrainState, Metrics]:
    """``update_step``, then, with ``config.eval_every``, the evaluation metrics of the updated
    policy: measured when ``due`` (default: ``eval_due`` of the number of updates done), NaN
    otherwise. Without eval_every this is ``update_step`` itself.

    The evaluation runs under ``lax.cond``, so updates without one skip it, as long as the
    predicate is not batched: inside ``vmap(train)`` ``state.update_step`` is not (it starts
    from a constant), while a vmap over states batched already should pass ``due`` unbatched.
    """
    state, metrics = update_step(agent, optimizer, config, state)
    if config.eval_every is None:
        return state, metrics
    if due is None:
        due = eval_due(config, state.update_step)
    evaluation = jax.lax.cond(
        due,
        functools.partial(evaluation_metrics, agent, config),
        lambda _: skipped_metrics(),
        state,
    )
    return state, {**metrics, **evaluation}


def run_updates(
    config: PPOConfig, state: TrainState, num_updates: int, mesh: Mesh | None = None
) -> tuple[TrainState, Metrics]:
    """Continue training from ``state`` for ``num_updates`` updates (``num_updates`` static).

    Running the updates in chunks gives exactly the same result as one call, which is what
    progress reporting and resuming from checkpoints rely on. With ``mesh`` (static), the
    environments are split across its devices from the first update on (see
    ``ppojax.runtime.sharding``); num_envs must be a multiple of its device count.
    """
    agent = make_agent(config)
    optimizer = make_optimizer(config)
    step = functools.partial(train_step, agent, optimizer, config)

    def sharded_step(state: TrainState, _: None) -> tuple[TrainState, Metrics]:
        state, metrics = step(constrain_envs(state, mesh))
        return constrain_envs(state, mesh), metrics

    return jax.lax.scan(sharded_step, constrain_envs(state, mesh), None, num_updates)


def constrain_envs(state: TrainState, mesh: Mesh | None) -> TrainState:
    """Keep the env axis of the env state, observations, return accumulators and hidden state
    on ``mesh``; a ``ValueError`` when num_envs is no multiple of its device count."""
    if mesh is None:
        return state
    env_state, obs, discounted, hidden = constrain_env_axis(
        (state.env_state, state.obs, state.reward_normalizer.discounted_return, state.hidden),
        mesh,
        "PPOConfig.num_envs",
    )
    normalizer = state.reward_normalizer.replace(discounted_return=discounted)
    return state.replace(env_state=env_state, obs=obs, reward_normalizer=normalizer, hidden=hidden)


def train(config: PPOConfig, key: jax.Array, mesh: Mesh | None = None) -> TrainOutput:
    """Train a PPO agent: ``config.num_updates`` cycles of rollout, GAE and update.

    Pure in ``(config, key)``: ``jax.jit(train)(config, key)`` compiles once per program
    structure, and ``jax.vmap(train, in_axes=(None, 0))(config, keys)`` runs several seeds.
    Metrics have a leading axis of num_updates (see ``ppojax.ppo.types.METRIC_NAMES``, and
    ``EVAL_METRIC_NAMES`` with ``config.eval_every``, evaluated as ``train_step`` says).
    ``mesh`` (static under jit: ``jax.jit(train, static_argnames="mesh")``) splits the run's
    environments across devices; num_envs must be a multiple of the device count. ``key`` is
    one ``jax.random.key(seed)`` or one raw ``jax.random.PRNGKey(seed)`` (same result).
    """
    state = init_state(config, as_key(key))
    state, metrics = run_updates(config, state, config.num_updates, mesh)
    return TrainOutput(state, metrics)
