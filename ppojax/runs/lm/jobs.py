"""What ``ppojax sft | rm | dpo | rlhf --model`` train, each as a ``Job``: its state at step 0,
what every step reads but never changes (the data, a reference, a reward model's params: an
argument of the compiled chunk, never checkpointed), a pure step, and the params its run
folder's ``final/`` holds. ``ppojax.runs.lm.text_run`` trains a job into a run folder.

    job = sft_job(lm, load_completions("sft.jsonl", lm.tokenizer), batch_size=8, learning_rate=1e-4)
    state, metrics = job.step(job.frozen, job.state, key)

Every step draws its batch from the device arrays with its own key (no host round trip).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh

from ppojax.engine import precision
from ppojax.engine.optim import clipped_adam
from ppojax.rlhf.core.config import RLHFConfig
from ppojax.rlhf.core.episode_trainer import make_trainer
from ppojax.rlhf.core.logprobs import computing
from ppojax.rlhf.core.sharding import (
    MIN_SHARD_SIZE,
    batch_sharding,
    constrain,
    rows_on,
    shard_state,
)
from ppojax.rlhf.core.trainer import RLHFState, Trainer, policy_params_fn, reward_names
from ppojax.rlhf.data import PromptData, draw_batch
from ppojax.rlhf.models.pretrained import PretrainedLM
from ppojax.rlhf.post.dpo import make_dpo_step
from ppojax.rlhf.post.pairs import PairData
from ppojax.rlhf.post.reward_model import make_reward_model_step, pair_accuracy, reward_model
from ppojax.rlhf.post.sft import CompletionData, make_sft_step
from ppojax.rlhf.text_rewards import RewardFailure, TextReward, text_reward
from ppojax.runs.loop import StepFn

PAIR_CURVES = ("loss", "rewards/accuracies", "rewards/margins")


class Job(NamedTuple):
    """A run's state at step 0, its ``frozen`` arrays, ``step(frozen, state, key) -> (state,
    metrics)``, ``model_params(state, frozen)``: the params of the model to save, the
    metrics to plot, and ``evaluate(state, frozen) -> {name: float}`` for the summary."""

    state: Any
    frozen: Any
    step: StepFn
    model_params: Callable[[Any, Any], dict]
    curves: tuple[str, ...]
    evaluate: Callable[[Any, Any], dict[str, float]] | None = None


def model_dtype(lm: PretrainedLM) -> Any:
    """The dtype ``lm`` was loaded in: its compute dtype and the one ``final/`` is saved in."""
    return jax.numpy.dtype(lm.module.dtype)


def saved_as_model(lm: PretrainedLM) -> Callable[[Any, Any], dict]:
    """``model_params`` of a supervised job: the float32 masters in the model's dtype."""
    return lambda state, frozen: precision.cast(state["params"], model_dtype(lm))


def supervised_job(
    params: dict,
    data: Any,
    batch_size: int,
    learning_rate: float,
    make_step: Callable[[optax.GradientTransformation], Callable[..., Any]],
    master_weights: bool = True,
) -> tuple[dict, StepFn]:
    """State {"params", "opt_state"} and the step of an optimizer step on a batch of ``data``
    (``frozen["data"]``); ``make_step(optimizer)`` gives ``(params, opt_state, batch,
    *extra) -> (params, opt_state, metrics)``, extra being ``frozen["extra"]``. With
    ``master_weights`` the params and Adam's moments are float32 (``engine.precision``); the
    step's model functions cast them to the model's dtype themselves (``computing``).

    The divergence guard of RLHF's updates: a step whose loss or new parameters' global norm
    is not finite (a NaN or inf anywhere in them, or parameters past float32) is skipped,
    params and optimizer state kept; ``gradient_steps`` (1 or 0) and ``nonfinite_steps``
    (0 or 1) say which. Adam's new state only adds the clipped gradients, finite when the
    parameters they moved are."""
    adam = clipped_adam(learning_rate, 1.0)
    update = make_step(adam)

    def step(frozen: dict, state: dict, key: jax.Array):
        batch, _ = draw_batch(frozen["data"], key, batch_size)
        params, opt_state, metrics = update(
            state["params"], state["opt_state"], batch, *frozen["extra"]
        )
        finite = jnp.isfinite(metrics["loss"]) & jnp.isfinite(optax.tree.norm(params))
        new = {"params": params, "opt_state": opt_state}
        kept = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, state)
        counts = {"gradient_steps": finite.astype(jnp.float32)}
        counts["nonfinite_steps"] = 1.0 - counts["gradient_steps"]
        return kept, {**metrics, **counts}

    if master_weights:
        params = precision.widened(params)
    return {"params": params, "opt_state": adam.init(params)}, step


def policy_job(
    lm: PretrainedLM,
    data: Any,
    batch_size: int,
    learning_rate: float,
    make_step: Callable[[Callable[..., Any], optax.GradientTransformation], Any],
    master_weights: bool,
) -> tuple[dict, StepFn]:
    """``supervised_job`` on the policy's params, ``make_step(policy, optimizer)`` given the
    policy computing in the model's dtype."""
    policy = computing(lm.policy_apply, model_dtype(lm))
    return supervised_job(
        lm.params,
        data,
        batch_size,
        learning_rate,
        lambda adam: make_step(policy, adam),
        master_weights,
    )


def sft_job(
    lm: PretrainedLM,
    data: CompletionData,
    batch_size: int,
    learning_rate: float,
    master_weights: bool = True,
) -> Job:
    """Supervised fine-tuning on prompt/completion pairs, the loss on completion tokens."""
    state, step = policy_job(lm, data, batch_size, learning_rate, make_sft_step, master_weights)
    return Job(state, {"data": data, "extra": ()}, step, saved_as_model(lm), ("loss",))


def reward_model_job(
    lm: PretrainedLM,
    pairs: PairData,
    batch_size: int,
    learning_rate: float,
    held_out: PairData | None = None,
    master_weights: bool = True,
) -> Job:
    """A Bradley-Terry reward model: a scalar head (at 0) on the pretrained backbone; the
    summary gives the pair accuracy on ``held_out``."""
    critic = computing(lm.critic_apply, model_dtype(lm))
    state, step = supervised_job(
        lm.init_value_head(lm.params),
        pairs,
        batch_size,
        learning_rate,
        lambda adam: make_reward_model_step(critic, adam),
        master_weights,
    )

    def evaluate(state: dict, frozen: dict) -> dict[str, float]:
        if frozen["held_out"] is None:
            return {}
        accuracy = jax.jit(pair_accuracy, static_argnums=0)
        held = frozen["held_out"]
        return {"held_out_accuracy": float(accuracy(critic, state["params"], held))}

    frozen = {"data": pairs, "extra": (), "held_out": held_out}
    return Job(state, frozen, step, saved_as_model(lm), PAIR_CURVES, evaluate)


def dpo_job(
    lm: PretrainedLM,
    pairs: PairData,
    batch_size: int,
    learning_rate: float,
    loss_type: str = "sigmoid",
    beta: float = 0.1,
    master_weights: bool = True,
) -> Job:
    """DPO (sigmoid loss) or IPO against the starting params as the frozen reference."""

    def make_step(policy: Callable[..., Any], adam: optax.GradientTransformation) -> Any:
        return make_dpo_step(policy, adam, loss_type)

    state, step = policy_job(lm, pairs, batch_size, learning_rate, make_step, master_weights)
    frozen = {"data": pairs, "extra": (lm.params, np.float32(beta))}
    return Job(state, frozen, step, saved_as_model(lm), PAIR_CURVES)


def rlhf_job(
    lm: PretrainedLM,
    config: RLHFConfig,
    prompts: PromptData,
    batch_size: int,
    key: jax.Array,
    rewards: Sequence[TextReward] = (),
    reward_lm: PretrainedLM | None = None,
    reward_params: dict | None = None,
    failures: list[RewardFailure] | None = None,
    mesh: Mesh | None = None,
    sample_layout: str = "auto",
) -> Job:
    """PPO, GRPO or RLOO (``config.algorithm``) on ``batch_size`` prompts a step, scored by
    the text ``rewards`` (through ``jax.pure_callback``; their errors kept in ``failures``,
    see ``text_reward``) and by the reward model ``reward_lm`` with ``reward_params`` (its
    value head), summed with ``config.reward_weights``. PPO's critic is a copy of the model
    with a value head at 0. With a ``mesh`` the prompts' rows split over its devices (and
    ``sharded`` lays the state out), and sampling decodes in ``sample_layout``
    (``ppojax.rlhf.core.sharding.SAMPLE_LAYOUTS``)."""
    text = [text_reward(fn, lm.tokenizer, prompts, failures) for fn in rewards]

    def reward_fns(frozen: dict) -> list:
        if reward_lm is None:
            return list(text)
        return [*text, reward_model(reward_lm.critic_apply, frozen["reward"])]

    def trainer(frozen: dict) -> Trainer:
        fns = reward_fns(frozen)
        critic = lm.critic_apply if config.needs_critic else None
        return make_trainer(config, lm.policy_apply, fns, critic, kv_cache=lm.kv_cache)

    def step(frozen: dict, state: RLHFState, key: jax.Array):
        prompt_key, step_key = jax.random.split(key)
        (tokens, mask), _ = draw_batch(frozen["prompts"], prompt_key, batch_size)
        if mesh is not None:  # each device samples and scores its own prompts' rows
            tokens, mask = jax.lax.with_sharding_constraint((tokens, mask), batch_sharding(mesh))
        with rows_on(mesh, sample_layout):
            return trainer(frozen).step(state, tokens, mask, step_key)

    def model_params(state: RLHFState, frozen: dict) -> dict:
        full = policy_params_fn(config, state.reference)(state.params)
        return precision.cast(full, model_dtype(lm))

    frozen = {"prompts": prompts, "reward": reward_params}
    critic_params = lm.init_value_head(lm.params) if config.needs_critic else None
    state = trainer(frozen).init(lm.params, key, critic_params)
    names = tuple(f"rewards/{name}/mean" for name in reward_names(reward_fns(frozen)))
    curves = ("objective/scores", *names, "objective/kl")
    return Job(state, frozen, step, model_params, curves)


def sharded(job: Job, mesh: Mesh) -> Job:
    """``job`` with its state laid out FSDP-style over ``mesh`` (``rlhf.core.sharding``: the
    params, masters, reference and Adam's moments split over "fsdp"), at step 0 and after
    every step, as ``shard_trainer`` lays out a trainer's."""

    def step(frozen: Any, state: Any, key: jax.Array) -> tuple[Any, dict]:
        state, metrics = job.step(frozen, constrain(state, mesh, MIN_SHARD_SIZE), key)
        return constrain(state, mesh, MIN_SHARD_SIZE), metrics

    return job._replace(state=shard_state(job.state, mesh), step=step)
