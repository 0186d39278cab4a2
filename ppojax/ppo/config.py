"""PPOConfig: every setting of a PPO run, validated at construction.

Fields that fix shapes or the program are static (``pytree_node=False``); scalar
hyperparameters are pytree leaves, so ``jax.vmap`` can sweep them without recompiling.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any

import numpy as np

from ppojax.checks import (
    ConfigError,
    EnvKwargs,
    check_bool,
    check_choice,
    check_positive_int,
    check_range,
    is_int,
    register_config,
    show,
    static,
)
from ppojax.engine.gae import ADVANTAGE_ESTIMATORS
from ppojax.envs.registry import check_env_id as check_registry_id
from ppojax.ppo.presets import PRESETS

ACTIVATIONS = ("tanh", "relu", "gelu", "silu", "elu")
POLICY_OBJECTIVES = ("clip", "penalty", "clip_penalty")
ENCODERS = ("mlp", "cnn")
RECURRENT_CORES = ("gru", "lstm")
COMPUTE_DTYPES = ("float32", "bfloat16")


@register_config
@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Hyperparameters of one PPO run.

    Static fields (shapes and program structure): env_id, num_envs, num_steps,
    total_timesteps, update_epochs, num_minibatches, anneal_lr, normalize_advantages,
    hidden_sizes, activation, advantage_estimator, policy_objective, adaptive_penalty,
    normalize_observations, normalize_rewards, divergence_guard, env_kwargs, reset_pool,
    eval_every, eval_episodes, eval_deterministic, and the network's fields. Traced fields
    (sweepable with vmap): every float but init_log_std (it sets the initial parameters,
    which the network's settings fix) and action_noise_correlation (0.0 leaves the rollout's
    program as it was). The optional ones (vf_clip_eps, target_kl, reward_clip, eval_every,
    reset_pool) switch their feature off with ``None``, which changes the program.

    advantage_estimator: a name in ``ppojax.engine.gae.ADVANTAGE_ESTIMATORS``: "gae"
    (generalised advantage estimation with gae_lambda) or "monte_carlo" (the discounted
    return to the episode's or the rollout's end, minus the value).
    policy_objective: "clip" (PPO-Clip), "penalty" (PPO-Penalty: E[r A] - beta KL(pi_old||pi)
    with the analytic KL) or "clip_penalty" (both terms). beta starts at penalty_coef and, when
    adaptive_penalty, doubles after an update whose KL exceeds 1.5 * penalty_target and halves
    after one below penalty_target / 1.5.
    target_kl: stop an update's remaining minibatch steps once a minibatch's approximate KL
    exceeds it. divergence_guard: skip a minibatch step whose loss, gradients or parameter
    update is not finite (parameters and optimizer state kept; ``nonfinite_steps``
    counts such steps either way, and without the guard they are applied, so one bad step
    poisons the run). Off by default, as in classic PPO and its peers, because its selects
    slow the small programs of a seed sweep (compile and run time on the classic config:
    benchmarks/results/compile_ablation.json); the command line (``ppojax train`` / ``sweep``)
    turns it on for a run folder's runs unless their config sets it.
    normalize_observations: running mean/variance over all envs, clipped to +-obs_clip.
    normalize_rewards: divide by the running std of the discounted return (gamma);
    reward_clip clips the (scaled) reward to +-reward_clip.

    The network (all static): encoder "mlp" (observations flattened, a pytree's leaves
    concatenated, then dense layers of hidden_sizes) or "cnn" ([H, W, C] observations through
    VALID convolutions of cnn_channels with square cnn_kernel_size kernels and cnn_stride, then
    the dense layers of hidden_sizes; the default is MinAtar's one 3x3 conv of 16 channels).
    recurrent: None (feed-forward), "gru" or "lstm", a core of recurrent_size units after the
    encoder; its state resets to zeros where an episode ends, and minibatches are then whole
    env sequences (num_minibatches must divide num_envs). shared_torso: one encoder (and core)
    feeding both heads instead of one each; off by default, because the value loss then pulls
    on the policy's features and the balance depends on vf_coef and the reward scale, while
    separate torsos train the classic-control presets as tuned. compute_dtype: "float32", or
    "bfloat16" for the encoder's layers (their matrix products and activations; half the
    bytes an accelerator moves for them), the parameters, the recurrent core, the heads, the
    optimizer and every loss term staying float32.
    Continuous actions (a diagonal Gaussian; both fields have no effect on discrete ones):
    state_dependent_std makes the log-std a dense head on the actor's features, so the
    policy can explore more in some states than in others, instead of one parameter per
    action dimension; not with a recurrent core. init_log_std: where the log-std starts (the
    parameter, or the head's bias, its kernel starting near zero). action_noise_correlation:
    rho in [0, 1), the rollout's sampling noise an AR(1) process with that step-to-step
    correlation instead of white (each step's noise still N(0, 1), see
    ``ppojax.ppo.rollout``); 0.0 is the program without it. An exploration aid, not a free
    improvement: the noise carries the past, so an action is no longer drawn from pi(.|s)
    given the state alone and the policy gradient is biased; where white noise explores well
    enough it brings nothing (Pendulum's preset at rho 0.5: -160.2 against -155.7,
    benchmarks/results/exploration.json, read in benchmarks/README.md, "One-off studies").

    env_kwargs (static): settings of the env, a dict of JSON scalars. Keys the env's factory
    names are passed to it (for gymnax ids, to the env's constructor); keys that name a field
    of the env-params dataclass override it, e.g. ``{"max_steps_in_episode": 50}``; an unknown
    key is a ``ConfigError`` naming it (see ``ppojax.envs.registry``).

    reset_pool (static): where a rollout's episodes restart. None: every env step has a fresh
    start of its own, drawn ahead in one batched call, and the env takes it where its episode
    ends; exact, and cheap wherever a reset costs about a step (gymnax's envs). K: K fresh
    starts per env per rollout instead (num_steps / K times fewer resets; per block of a
    rollout whose pre-drawn randomness would pass 64 MiB), taken in order by that env's
    episodes that end in the rollout; an env whose episodes end more than K times in one
    rollout starts the later ones from its K-th start again, and the metric ``repeated_starts``
    counts them. For suites whose reset costs far more than a step (Craftax's world generation:
    ~70 steps) with episodes longer than a rollout.

    eval_every: every that many updates and after the last one (None: never, and the program
    is exactly the one without evaluation) the compiled loop plays eval_episodes whole
    episodes of the current policy on fresh envs, its mode when eval_deterministic, else
    samples; see ``ppojax.ppo.evaluation``.
    """

    env_id: str = static("CartPole-v1")
    num_envs: int = static(4)
    num_steps: int = static(128)
    total_timesteps: int = static(500_000)
    update_epochs: int = static(4)
    num_minibatches: int = static(4)
    anneal_lr: bool = static(True)
    normalize_advantages: bool = static(True)
    hidden_sizes: tuple[int, ...] = static((64, 64))
    activation: str = static("tanh")
    policy_objective: str = static("clip")
    adaptive_penalty: bool = static(True)
    normalize_observations: bool = static(False)
    normalize_rewards: bool = static(False)

    learning_rate: float = 2.5e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    advantage_estimator: str = static("gae")
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    vf_clip_eps: float | None = 0.2
    penalty_coef: float = 1.0
    penalty_target: float = 0.01
    target_kl: float | None = None
    divergence_guard: bool = static(False)
    obs_clip: float = 10.0
    reward_clip: float | None = None
    eval_every: int | None = static(None)
    eval_episodes: int = static(10)
    eval_deterministic: bool = static(True)

    encoder: str = static("mlp")
    cnn_channels: tuple[int, ...] = static((16,))
    cnn_kernel_size: int = static(3)
    cnn_stride: int = static(1)
    recurrent: str | None = static(None)
    recurrent_size: int = static(128)
    shared_torso: bool = static(False)
    state_dependent_std: bool = static(False)
    init_log_std: float = static(0.0)
    action_noise_correlation: float = static(0.0)
    compute_dtype: str = static("float32")

    env_kwargs: EnvKwargs = static(EnvKwargs())
    reset_pool: int | None = static(None)

    def __new__(cls, *args: Any, **kwargs: Any) -> PPOConfig:
        # An unknown keyword names its closest fields (a bare TypeError would not).
        check_field_names(kwargs)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        normalize_static_fields(self)
        validate(self)

    def replace(self, **changes: Any) -> PPOConfig:
        """A copy with ``changes`` applied, validated again."""
        check_field_names(changes)
        return dataclasses.replace(self, **changes)

    @property
    def batch_size(self) -> int:
        """Transitions per update: num_envs * num_steps."""
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        """Rollout + update cycles: total_timesteps // batch_size."""
        return self.total_timesteps // self.batch_size

    @property
    def num_gradient_steps(self) -> int:
        return self.num_updates * self.update_epochs * self.num_minibatches

    @classmethod
    def preset(cls, env_id: str, **overrides: Any) -> PPOConfig:
        """The tuned configuration for ``env_id`` (see ``PRESETS``), with overrides."""
        preset = PRESETS.get(env_id, {}) if isinstance(env_id, str) else {}
        return cls(**{**preset, "env_id": env_id, **overrides})


INT_FIELDS = (
    "num_envs",
    "num_steps",
    "total_timesteps",
    "update_epochs",
    "num_minibatches",
    "cnn_kernel_size",
    "cnn_stride",
    "recurrent_size",
)
BOOL_FIELDS = (
    "anneal_lr",
    "divergence_guard",
    "normalize_advantages",
    "adaptive_penalty",
    "normalize_observations",
    "normalize_rewards",
    "shared_torso",
    "state_dependent_std",
)


class UnknownFieldError(ConfigError, TypeError):
    """A setting for a field PPOConfig does not have (a TypeError too, as for any unknown
    keyword argument); the message names the closest fields."""

    def __init__(self, name: str) -> None:
        super().__init__(name, unknown_field_message(name))


def check_field_names(settings: dict[str, Any]) -> None:
    """Raise ``UnknownFieldError`` for the first name in ``settings`` that is no field."""
    unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(PPOConfig)})
    if unknown:
        raise UnknownFieldError(unknown[0])


def unknown_field_message(name: str) -> str:
    names = [f.name for f in dataclasses.fields(PPOConfig)]
    close = difflib.get_close_matches(str(name), names, n=3)
    hint = f"Did you mean {', '.join(close)}?" if close else f"Fields: {', '.join(names)}."
    return f"PPOConfig has no field {name!r}. {hint}"


def normalize_static_fields(config: Any) -> None:
    """Plain Python values for static fields given as NumPy scalars, and a tuple for a
    tuple field given as a list or array (static fields must hash and write to JSON).
    Anything else is left as it is for ``validate`` to judge."""
    for field in dataclasses.fields(config):
        if field.metadata.get("pytree_node", True):
            continue
        value = getattr(config, field.name)
        if isinstance(field.default, EnvKwargs) and isinstance(value, dict):
            value = EnvKwargs(value)
        if isinstance(field.default, tuple) and isinstance(value, (list, np.ndarray)):
            value = tuple(value.tolist() if isinstance(value, np.ndarray) else value)
        if isinstance(value, tuple):
            value = tuple(item.item() if isinstance(item, np.generic) else item for item in value)
        elif isinstance(value, np.generic):
            value = value.item()
        object.__setattr__(config, field.name, value)


def check_env_id(env_id: Any) -> None:
    """Raise ``ConfigError`` unless ``env_id`` is a gymnax id, a registered id or a suite id
    (see ``ppojax.envs.registry``); typos get the closest ids."""
    check_registry_id(env_id)


ENV_KWARG_TYPES = (bool, int, float, str, type(None))


def check_env_kwargs(env_kwargs: Any) -> None:
    """Raise ``ConfigError`` unless ``env_kwargs`` maps names to JSON scalars (bool, int,
    float, str, None) or tuples of them: the field is static, so it must hash and write to
    config.json."""
    example = "{'max_steps_in_episode': 50}"
    if not isinstance(env_kwargs, EnvKwargs):
        raise ConfigError(
            "env_kwargs",
            f"PPOConfig.env_kwargs must be a dict such as {example}, got {show(env_kwargs)}.",
        )
    for name, value in env_kwargs.items():
        items = value if isinstance(value, tuple) else (value,)
        if not isinstance(name, str) or not all(isinstance(v, ENV_KWARG_TYPES) for v in items):
            raise ConfigError(
                "env_kwargs",
                f"PPOConfig.env_kwargs[{name!r}] = {show(value)}: keys must be str and values "
                "bool, int, float, str, None or lists of them (the config is written to JSON).",
            )


def check_sizes(name: str, sizes: Any, example: str) -> None:
    """Raise ``ConfigError`` unless ``sizes`` is a non-empty tuple of positive ints."""
    valid = isinstance(sizes, tuple) and len(sizes) > 0
    if valid and all(isinstance(size, int) and not isinstance(size, bool) for size in sizes):
        if all(size > 0 for size in sizes):
            return
    raise ConfigError(
        name,
        f"PPOConfig.{name} must be a non-empty tuple of positive ints such as {example}, "
        f"got {show(sizes, (tuple,))}.",
    )


def check_network(config: PPOConfig) -> None:
    """The network fields: sizes, the encoder and core names, and that a recurrent run's
    minibatches of whole env sequences split the envs evenly."""
    check_sizes("hidden_sizes", config.hidden_sizes, "(64, 64)")
    check_sizes("cnn_channels", config.cnn_channels, "(16,)")
    check_choice("PPOConfig", "encoder", config.encoder, ENCODERS)
    check_choice("PPOConfig", "compute_dtype", config.compute_dtype, COMPUTE_DTYPES)
    check_log_std(config)
    if config.recurrent is None:
        return
    check_choice("PPOConfig", "recurrent", config.recurrent, RECURRENT_CORES)
    if config.num_envs % config.num_minibatches:
        raise ConfigError(
            "num_minibatches",
            f"PPOConfig.num_minibatches={config.num_minibatches} must divide "
            f"num_envs={config.num_envs} when recurrent={config.recurrent!r}: a recurrent "
            "minibatch is whole env sequences; choose a divisor of num_envs.",
        )


def check_log_std(config: PPOConfig) -> None:
    """init_log_std: one number (static, so no array) in [-10, 10] (std 4.5e-5 to 2.2e4);
    action_noise_correlation: one number in [0, 1);
    state_dependent_std: not with a recurrent core, whose minibatch replay keeps one log-std
    per sequence step rather than per sample."""
    value = config.init_log_std
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigError(
            "init_log_std",
            f"PPOConfig.init_log_std must be one number (a static field), got {show(value)}.",
        )
    check_range("PPOConfig", "init_log_std", value, -10.0, 10.0, open_low=False)
    rho = config.action_noise_correlation
    if not isinstance(rho, (int, float)) or isinstance(rho, bool) or not 0.0 <= rho < 1.0:
        raise ConfigError(
            "action_noise_correlation",
            "PPOConfig.action_noise_correlation must be one number in [0, 1) (0: white "
            f"noise), got {show(rho)}.",
        )
    if config.state_dependent_std and config.recurrent is not None:
        raise ConfigError(
            "state_dependent_std",
            f"PPOConfig.state_dependent_std=True is not supported with recurrent="
            f"{config.recurrent!r}; use a feed-forward network or state_dependent_std=False.",
        )


def validate(config: PPOConfig) -> None:
    """Raise ``ConfigError`` (a ``ValueError``) naming the field, the value and the fix for any
    invalid setting: types first, then ranges, then how the fields fit together."""
    for name in INT_FIELDS:
        check_positive_int("PPOConfig", name, getattr(config, name))
    for name in BOOL_FIELDS:
        check_bool("PPOConfig", name, getattr(config, name))
    if config.batch_size % config.num_minibatches:
        raise ConfigError(
            "num_minibatches",
            f"PPOConfig.num_minibatches={config.num_minibatches} must divide "
            f"num_envs*num_steps={config.batch_size}; choose a divisor of {config.batch_size}.",
        )
    if config.num_updates < 1:
        raise ConfigError(
            "total_timesteps",
            f"PPOConfig.total_timesteps={config.total_timesteps} is smaller than one rollout "
            f"(num_envs*num_steps={config.batch_size}); raise total_timesteps.",
        )
    check_network(config)
    check_choice("PPOConfig", "activation", config.activation, ACTIVATIONS)
    check_choice("PPOConfig", "policy_objective", config.policy_objective, POLICY_OBJECTIVES)
    estimators = tuple(ADVANTAGE_ESTIMATORS)
    check_choice("PPOConfig", "advantage_estimator", config.advantage_estimator, estimators)
    check_range("PPOConfig", "learning_rate", config.learning_rate, 0.0, math.inf, open_low=True)
    check_range("PPOConfig", "gamma", config.gamma, 0.0, 1.0, open_low=False)
    check_range("PPOConfig", "gae_lambda", config.gae_lambda, 0.0, 1.0, open_low=False)
    check_range("PPOConfig", "clip_eps", config.clip_eps, 0.0, math.inf, open_low=True)
    check_range("PPOConfig", "ent_coef", config.ent_coef, 0.0, math.inf, open_low=False)
    check_range("PPOConfig", "vf_coef", config.vf_coef, 0.0, math.inf, open_low=False)
    check_range("PPOConfig", "max_grad_norm", config.max_grad_norm, 0.0, math.inf, open_low=True)
    check_range("PPOConfig", "penalty_coef", config.penalty_coef, 0.0, math.inf, open_low=False)
    check_range("PPOConfig", "penalty_target", config.penalty_target, 0.0, math.inf, open_low=True)
    check_range("PPOConfig", "obs_clip", config.obs_clip, 0.0, math.inf, open_low=True)
    for name in ("vf_clip_eps", "target_kl", "reward_clip"):
        if getattr(config, name) is not None:
            value = getattr(config, name)
            check_range("PPOConfig", name, value, 0.0, math.inf, open_low=True, optional=True)
    check_evaluation(config)
    check_reset_pool(config)
    check_env_id(config.env_id)
    check_env_kwargs(config.env_kwargs)


def check_reset_pool(config: PPOConfig) -> None:
    """Raise ``ConfigError`` unless ``reset_pool`` is None or an int in [1, num_steps]."""
    pool = config.reset_pool
    if pool is None:
        return
    if not is_int(pool) or not 1 <= pool <= config.num_steps:
        raise ConfigError(
            "reset_pool",
            f"PPOConfig.reset_pool must be None (a fresh start for every env step) or an int "
            f"from 1 to num_steps={config.num_steps} (fresh starts per env per rollout), got "
            f"{show(pool, (int,))}.",
        )


def check_evaluation(config: PPOConfig) -> None:
    """Raise ``ConfigError`` for evaluation settings that are no positive ints or bool."""
    check_positive_int("PPOConfig", "eval_episodes", config.eval_episodes)
    check_bool("PPOConfig", "eval_deterministic", config.eval_deterministic)
    every = config.eval_every
    if every is None:
        return
    if not is_int(every) or every < 1:
        raise ConfigError(
            "eval_every",
            f"PPOConfig.eval_every must be a positive int (updates between evaluations) or None "
            f"(no evaluation), got {show(every, (int,))}.",
        )
