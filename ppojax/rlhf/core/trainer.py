"""What every LM trainer's step stands on: its state (``RLHFState``), the ``Trainer``
contract of ``make_trainer`` (``episode_trainer``), the checks of its inputs, LoRA and float32
masters at init, and the update (``run_update``: epochs of minibatches through
``ppojax.engine.epochs.run_epochs``, then the KL controller). Every array of the state and
every traced config field can be vmapped.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from ppojax.checks import ConfigError
from ppojax.engine import precision
from ppojax.engine.epochs import OptimizerCarry, leaf_norm, run_epochs
from ppojax.rlhf.core import lora, remat, sharding
from ppojax.rlhf.core.advantages import critic_free_names
from ppojax.rlhf.core.config import RLHFConfig
from ppojax.rlhf.core.kl import next_kl_coef
from ppojax.rlhf.core.logprobs import computing

RewardFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]
CriticApply = Callable[[Any, jax.Array, jax.Array], jax.Array]


@struct.dataclass
class RLHFState:
    """Arrays only. ``params``: {"policy"} (the full params, or the LoRA adapters) and
    {"critic"} when the critic has its own; ``reference``: the frozen initial policy params
    (with LoRA the base, which the adapters add to); beta; the step count."""

    params: dict
    opt_state: optax.OptState
    reference: Any
    kl_coef: jax.Array
    step: jax.Array


class Trainer(NamedTuple):
    """Pure ``init(policy_params, key, critic_params=None) -> RLHFState`` and
    ``step(state, prompts [B, P], prompt_mask [B, P], key) -> (state, metrics)``."""

    init: Callable[..., RLHFState]
    step: Callable[..., tuple[RLHFState, dict[str, jax.Array]]]
    reward_names: tuple[str, ...]
    config: RLHFConfig


def reward_names(reward_fns: Sequence[RewardFn]) -> tuple[str, ...]:
    """Each function's __name__ (``reward_<i>`` for lambdas and partials), made unique."""
    names: list[str] = []
    for index, fn in enumerate(reward_fns):
        name = getattr(fn, "__name__", "<lambda>")
        name = f"reward_{index}" if name == "<lambda>" or name in names else name
        names.append(name)
    return tuple(names)


def check_inputs(
    config: RLHFConfig, reward_fns: Sequence[RewardFn], critic_apply: CriticApply | None
) -> None:
    """ConfigError naming what is missing or does not fit."""
    if not reward_fns or not all(callable(fn) for fn in reward_fns):
        raise ConfigError(
            "reward_fns", "make_trainer needs a reward function or a non-empty list of them."
        )
    weights = config.reward_weights
    if weights is not None and len(weights) != len(reward_fns):
        raise ConfigError(
            "reward_weights",
            f"RLHFConfig.reward_weights has {len(weights)} weights for {len(reward_fns)} "
            "reward functions; give one weight per function.",
        )
    check_critic(config, critic_apply)


def check_critic(config: RLHFConfig, critic_apply: CriticApply | None) -> None:
    """ConfigError when the algorithm learns a critic and ``critic_apply`` is None."""
    if config.needs_critic and critic_apply is None:
        others = " or ".join(repr(name) for name in critic_free_names())
        raise ConfigError(
            "critic_apply",
            f"algorithm={config.algorithm!r} needs critic_apply(params, tokens, mask) -> values "
            f"[B, L]; pass one, or choose algorithm={others}, which need no critic.",
        )


def policy_params_fn(config: RLHFConfig, reference: Any) -> Callable[[dict], Any]:
    """Trained params -> the policy's full params: the params themselves, or base + LoRA."""
    if not config.lora_rank:
        return lambda params: params["policy"]
    scale = config.lora_alpha / config.lora_rank
    return lambda params: lora.merge(reference, params["policy"], scale)


def initial_policy(config: RLHFConfig, policy_params: Any, key: jax.Array) -> Any:
    """What a trainer trains from ``policy_params``: the params themselves, or with
    ``config.lora_rank`` LoRA adapters drawn with ``key`` (B = 0: the policy starts at the
    base, which stays the frozen reference)."""
    if not config.lora_rank:
        return policy_params
    return lora.init_adapters(
        policy_params, config.lora_targets, config.lora_rank, key, config.lora_full
    )


def compute_params(state: RLHFState) -> dict:
    """The trained params in the compute dtype: the dtype of the frozen reference, the one
    the model came in (``ppojax.engine.precision``); the masters themselves when that is
    theirs."""
    cast = precision.cast(state.params, precision.compute_dtype(state.reference))
    return sharding.for_training(cast)  # gathered where used, in the compute dtype


def in_compute_dtype(loss: Callable[..., Any], reference: Any) -> Callable[..., Any]:
    """``loss(params, ...)`` on the params cast to the reference's dtype (``computing``): the
    cast is inside what is differentiated, so the float32 masters get float32 gradients."""
    return computing(loss, precision.compute_dtype(reference))


def policy_weight(config: RLHFConfig, step: jax.Array) -> jax.Array:
    """``LossParts.policy_on``: 0.0 during the critic's warm-up (step < critic_warmup_steps,
    only the value loss trains), 1.0 after."""
    return (step >= config.critic_warmup_steps).astype(jnp.float32)


def initial_state(
    config: RLHFConfig,
    optimizer: optax.GradientTransformation,
    policy: Any,
    reference: Any,
    critic_params: Any = None,
) -> RLHFState:
    """A trainer's state at step 0: ``policy`` (the params trained: the model, or its
    adapters) and a critic's own params when given, their optimizer state, the frozen
    ``reference`` and beta = config.kl_coef."""
    params = {"policy": policy}
    if critic_params is not None:
        params["critic"] = critic_params
    if config.master_weights:
        # float32 masters of bf16 params (engine.precision); the reference keeps the
        # model's dtype, which is the steps' compute dtype
        params = precision.widened(params)
    return RLHFState(
        params=params,
        opt_state=optimizer.init(params),
        reference=reference,
        kl_coef=jnp.asarray(config.kl_coef, jnp.float32),
        step=jnp.int32(0),
    )


def run_update(
    config: RLHFConfig,
    optimizer: optax.GradientTransformation,
    state: RLHFState,
    loss: Callable[..., Any],
    batch: Any,
    key: jax.Array,
    metrics: dict[str, jax.Array],
) -> tuple[RLHFState, dict[str, jax.Array]]:
    """The update of every LM trainer: ``update_epochs`` x ``num_minibatches`` steps of
    ``loss(params, minibatch)`` (in the compute dtype, its layers rematerialized when asked)
    over ``batch`` through ``run_epochs``, then beta (``kl.next_kl_coef`` on the rollout's
    ``metrics["objective/kl"]``) and the step count. The state after, and ``metrics`` with the
    update's."""
    loss = in_compute_dtype(loss, state.reference)
    if config.remat_layers:
        loss = remat.with_rematerialized_layers(loss)
    carry, update_metrics = run_epochs(
        loss,
        optimizer,
        OptimizerCarry(state.params, state.opt_state),
        batch,
        key,
        num_epochs=config.update_epochs,
        num_minibatches=config.num_minibatches,
        stop_kl=None,
        divergence_guard=config.divergence_guard,
        norm=leaf_norm,  # the clipping's own (per leaf); no gather of sharded gradients
    )
    metrics = {**metrics, **update_metrics}
    kl_coef = next_kl_coef(config, state.kl_coef, metrics["objective/kl"], batch)
    state = state.replace(
        params=carry.params, opt_state=carry.opt_state, kl_coef=kl_coef, step=state.step + 1
    )
    return state, metrics


def run_steps(
    trainer: Trainer,
    state: RLHFState,
    prompt_fn: Callable[[jax.Array], tuple[jax.Array, jax.Array]],
    key: jax.Array,
    num_steps: int,
) -> tuple[RLHFState, dict[str, jax.Array]]:
    """``num_steps`` trainer steps (``lax.scan``), each on ``prompt_fn(key) -> (prompts,
    prompt_mask)``; metrics [num_steps] each."""

    def step(state: RLHFState, step_key: jax.Array):
        prompt_key, train_key = jax.random.split(step_key)
        return trainer.step(state, *prompt_fn(prompt_key), train_key)

    return jax.lax.scan(step, state, jax.random.split(key, num_steps))
