"""The PPO-RLHF step: sample, score with the reward model, penalize KL to the reference,
token-level GAE, then epochs of clipped PPO updates, as one jitted pure function.

Token t of a response is one action; the reward is r_t = -beta * KL_t, plus the reward
model's score at the last real token (EOS, or the final position when there is none).
GAE runs over response positions (time-major [R, B]) with the episode ending at that last
token, so padding after EOS never carries value or advantage.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from ppojax import losses
from ppojax.gae import compute_gae
from ppojax.rlhf.config import RLHFConfig
from ppojax.rlhf.model import TransformerLM, build_model
from ppojax.rlhf.reward import reward_scores
from ppojax.rlhf.sampling import TokenStats, response_stats, sample_responses
from ppojax.rlhf.sft import make_adam, zero_value_head
from ppojax.rlhf.task import EOS, gold_score, sample_prompts
from ppojax.update import OptimizerCarry, run_epochs

PPO_METRICS = (
    "reward_score",  # mean reward-model score of the sampled responses
    "gold_score",  # mean gold score of the same responses (logged only, never optimized)
    "kl",  # sum over tokens of log pi - log pi_ref (k1), mean over responses
    "kl_coef",  # beta used for this step's rewards
    "entropy",  # mean entropy of pi over real response tokens, at sampling time
    "response_length",  # mean number of real tokens (EOS included)
    "eos_fraction",  # fraction of responses that emitted EOS
    "explained_variance",  # of the returns by the values, over real tokens
    "policy_loss",  # clipped surrogate, mean over gradient steps
    "value_loss",  # clipped value loss, mean over gradient steps
    "approx_kl",  # (r - 1) - log r between old and current policy, mean over gradient steps
    "clip_fraction",  # fraction of real tokens with |r - 1| > clip_eps
    "grad_norm",  # global gradient norm before clipping
    "nonfinite_steps",  # gradient steps the divergence guard skipped (non-finite loss/grads)
)


@struct.dataclass
class RLHFState:
    """Arrays only: trained params ({"policy"} or {"policy", "critic"}), their optimizer state,
    the frozen reference and reward-model params, the KL coefficient beta and the step."""

    params: dict
    opt_state: optax.OptState
    ref_params: dict
    reward_params: dict
    kl_coef: jax.Array
    step: jax.Array


class PPOBatch(NamedTuple):
    """One prompt-response pair per row: prompts [N, P]; everything else [N, R]."""

    prompts: jax.Array
    responses: jax.Array
    mask: jax.Array
    log_probs: jax.Array
    values: jax.Array
    advantages: jax.Array
    returns: jax.Array


def make_optimizer(config: RLHFConfig) -> optax.GradientTransformation:
    """The PPO optimizer: global-norm clipping at max_grad_norm, then Adam at learning_rate."""
    return make_adam(config.learning_rate, config.max_grad_norm)


def init_rlhf_state(
    config: RLHFConfig, sft_params: dict, reward_params: dict, kl_coef: float | jax.Array
) -> RLHFState:
    """Policy = reference = SFT; with ``separate_critic`` the critic is a copy of the SFT
    weights (value head reset to 0), otherwise the policy's own value head is the critic."""
    params = {"policy": zero_value_head(sft_params)}
    if config.separate_critic:
        params["critic"] = zero_value_head(sft_params)
    return RLHFState(
        params=params,
        opt_state=make_optimizer(config).init(params),
        ref_params=sft_params,
        reward_params=reward_params,
        kl_coef=jnp.asarray(kl_coef, jnp.float32),
        step=jnp.int32(0),
    )


def policy_stats(
    model: TransformerLM,
    config: RLHFConfig,
    params: dict,
    prompts: jax.Array,
    responses: jax.Array,
) -> TokenStats:
    """Log-probs and entropy of the policy, values of the critic, all [B, R]."""
    stats = response_stats(model, params["policy"], prompts, responses, config.temperature)
    if not config.separate_critic:
        return stats
    critic = response_stats(model, params["critic"], prompts, responses, config.temperature)
    return stats._replace(values=critic.values)


def kl_estimate(log_probs: jax.Array, ref_log_probs: jax.Array, estimator: str) -> jax.Array:
    """Per-token KL(pi || pi_ref) estimate [B, R] from samples of pi.
    k1: log pi - log pi_ref;  k3: (rho - 1) - log rho with rho = pi_ref / pi."""
    log_rho = ref_log_probs - log_probs
    if estimator == "k1":
        return -log_rho
    return jnp.expm1(log_rho) - log_rho


def token_rewards(
    scores: jax.Array,
    kl: jax.Array,
    mask: jax.Array,
    kl_coef: float | jax.Array,
    no_eos_penalty: jax.Array,
) -> jax.Array:
    """r_t = -beta * KL_t on real tokens, plus (score - penalty) at the last real token; [B, R].

    ``no_eos_penalty`` [B] is the penalty for each response (0 where it emitted EOS)."""
    last = last_token(mask)
    final = (scores - no_eos_penalty)[:, None] * last
    return jnp.where(mask, -kl_coef * kl, 0.0) + final


def last_token(mask: jax.Array) -> jax.Array:
    """[B, R] float: 1 at the last real token of each response."""
    following = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
    return (mask & ~following).astype(jnp.float32)


def token_advantages(
    rewards: jax.Array, values: jax.Array, mask: jax.Array, config: RLHFConfig
) -> tuple[jax.Array, jax.Array]:
    """Token-level GAE with ``compute_gae`` (time = response position): every position at or
    after the last real token is terminal, so no value leaks across the end. [B, R] each."""
    terminated = ~mask | last_token(mask).astype(bool)
    next_values = jnp.concatenate([values[:, 1:], jnp.zeros_like(values[:, :1])], axis=1)
    advantages, returns = compute_gae(
        rewards.T,
        values.T,
        next_values.T,
        terminated.T,
        jnp.zeros_like(terminated.T),
        gamma=config.gamma,
        gae_lambda=config.gae_lambda,
    )
    return advantages.T, returns.T


def update_kl_coef(
    kl_coef: jax.Array,
    kl: jax.Array,
    target_kl: float | jax.Array,
    horizon: float | jax.Array,
    batch_size: int,
) -> jax.Array:
    """Adaptive KL controller: e = clip(KL / target - 1, -0.2, 0.2); beta *= 1 + e * n / horizon."""
    error = jnp.clip(kl / target_kl - 1.0, -0.2, 0.2)
    return kl_coef * (1.0 + error * batch_size / horizon)


def collect_batch(
    model: TransformerLM,
    config: RLHFConfig,
    state: RLHFState,
    prompts: jax.Array,
    key: jax.Array,
) -> tuple[PPOBatch, dict[str, jax.Array]]:
    """Sample responses to prompts [B, P] and turn them into a PPO batch with whitened
    advantages; the old log-probs come from the same full forward pass the loss uses."""
    samples = sample_responses(
        model, state.params["policy"], prompts, key, config.response_len, config.temperature
    )
    responses, mask = samples.tokens, samples.mask
    stats = policy_stats(model, config, state.params, prompts, responses)
    ref_log_probs = response_stats(
        model, state.ref_params, prompts, responses, config.temperature
    ).log_probs
    scores = reward_scores(model, state.reward_params, prompts, responses)
    kl = kl_estimate(stats.log_probs, ref_log_probs, config.kl_estimator)
    emitted_eos = (responses == EOS).any(axis=1)
    penalty = jnp.where(emitted_eos, 0.0, config.missing_eos_penalty)
    rewards = token_rewards(scores, kl, mask, state.kl_coef, penalty)
    advantages, returns = token_advantages(rewards, stats.values, mask, config)
    batch = PPOBatch(
        prompts=prompts,
        responses=responses,
        mask=mask,
        log_probs=stats.log_probs,
        values=stats.values,
        advantages=losses.normalize(advantages, mask),
        returns=returns,
    )
    metrics = {
        "reward_score": scores.mean(),
        "gold_score": gold_score(prompts, responses).mean(),
        "kl": jnp.where(mask, stats.log_probs - ref_log_probs, 0.0).sum(axis=1).mean(),
        "kl_coef": state.kl_coef,
        "entropy": losses.entropy_bonus(stats.entropy, mask),
        "response_length": mask.sum(axis=1).mean(),
        "eos_fraction": emitted_eos.mean(),
        "explained_variance": losses.explained_variance(stats.values, returns, mask),
    }
    return batch, metrics


def ppo_loss(
    model: TransformerLM, config: RLHFConfig, params: dict, batch: PPOBatch
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """-L_clip + vf_coef * L_value - ent_coef * H over the real tokens of a minibatch."""
    stats = policy_stats(model, config, params, batch.prompts, batch.responses)
    mask = batch.mask
    log_ratio = jnp.where(mask, stats.log_probs - batch.log_probs, 0.0)
    policy_loss = losses.clipped_surrogate_loss(log_ratio, batch.advantages, config.clip_eps, mask)
    value_loss = losses.value_loss(
        stats.values, batch.values, batch.returns, config.vf_clip_eps, mask
    )
    entropy = losses.entropy_bonus(stats.entropy, mask)
    total = losses.total_loss(
        policy_loss, value_loss, entropy, vf_coef=config.vf_coef, ent_coef=config.ent_coef
    )
    metrics = {
        "policy_loss": policy_loss,
        "value_loss": value_loss,
        "approx_kl": jax.lax.stop_gradient(losses.approx_kl(log_ratio, mask)),
        "clip_fraction": losses.clip_fraction(log_ratio, config.clip_eps, mask),
    }
    return total, metrics


def ppo_step(
    config: RLHFConfig, state: RLHFState, prompts: jax.Array, key: jax.Array
) -> tuple[RLHFState, dict[str, jax.Array]]:
    """One PPO-RLHF iteration on prompts [B, P]: rollout, ``ppo_epochs`` x ``num_minibatches``
    clipped updates (``run_epochs``), then the KL controller. Metrics: ``PPO_METRICS``."""
    model = build_model(config)
    sample_key, update_key = jax.random.split(key)
    batch, metrics = collect_batch(model, config, state, prompts, sample_key)
    carry, update_metrics = run_epochs(
        functools.partial(ppo_loss, model, config),
        make_optimizer(config),
        OptimizerCarry(state.params, state.opt_state),
        batch,
        update_key,
        num_epochs=config.ppo_epochs,
        num_minibatches=config.num_minibatches,
    )
    kl_coef = state.kl_coef
    if config.adaptive_kl:
        kl_coef = update_kl_coef(
            kl_coef, metrics["kl"], config.target_kl, config.kl_horizon, prompts.shape[0]
        )
    state = state.replace(
        params=carry.params, opt_state=carry.opt_state, kl_coef=kl_coef, step=state.step + 1
    )
    return state, {**metrics, **update_metrics}


def run_ppo(
    config: RLHFConfig, state: RLHFState, key: jax.Array
) -> tuple[RLHFState, dict[str, jax.Array]]:
    """``config.ppo_steps`` PPO steps on fresh prompt batches (``lax.scan``); metrics
    [ppo_steps] each."""

    def step(state: RLHFState, step_key: jax.Array):
        prompt_key, ppo_key = jax.random.split(step_key)
        prompts = sample_prompts(
            prompt_key, config.batch_size, config.prompt_len, config.num_digits
        )
        return ppo_step(config, state, prompts, ppo_key)

    return jax.lax.scan(step, state, jax.random.split(key, config.ppo_steps))
