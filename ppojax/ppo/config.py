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
from ppojax.envs.registry import check_env_id as check_registry_id

ACTIVATIONS = ("tanh", "relu", "gelu", "silu", "elu")
POLICY_OBJECTIVES = ("clip", "penalty", "clip_penalty")
ENCODERS = ("mlp", "cnn")
RECURRENT_CORES = ("gru", "lstm")


@register_config
@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Hyperparameters of one PPO run.

    Static fields (shapes and program structure): env_id, num_envs, num_steps,
    total_timesteps, update_epochs, num_minibatches, anneal_lr, normalize_advantages,
    hidden_sizes, activation, policy_objective, adaptive_penalty, normalize_observations,
    normalize_rewards, env_kwargs, reset_pool, eval_every, eval_episodes, eval_deterministic.
    Traced fields (sweepable with vmap): every float. The optional ones (vf_clip_eps,
    target_kl, reward_clip, eval_every, reset_pool) switch their feature off with ``None``,
    which changes the program.

    policy_objective: "clip" (PPO-Clip), "penalty" (PPO-Penalty: E[r A] - beta KL(pi_old||pi)
    with the analytic KL) or "clip_penalty" (both terms). beta starts at penalty_coef and, when
    adaptive_penalty, doubles after an update whose KL exceeds 1.5 * penalty_target and halves
    after one below penalty_target / 1.5.
    target_kl: stop an update's remaining minibatch steps once a minibatch's approximate KL
    exceeds it. normalize_observations: running mean/variance over all envs, clipped to
    +-obs_clip. normalize_rewards: divide by the running std of the discounted return (gamma);
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
    separate torsos train the classic-control presets as tuned.

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
    clip_eps: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    vf_clip_eps: float | None = 0.2
    penalty_coef: float = 1.0
    penalty_target: float = 0.01
    target_kl: float | None = None
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


# The MinAtar games: 64 envs x 128 steps, 4 epochs of 8 minibatches, lr 5e-4, ReLU 256-256 MLPs
# on the flattened 10x10xC frame, 10M steps: the budget gymnax's published PPO baselines were
# trained with (benchmarks/encoders.py at 54d94c6 trains it, and the same with encoder="cnn").
# eval_every here and below: about ten in-loop evaluations per run at the preset's budget
# (10 deterministic episodes each, the last after the final update), so the final policy's
# evaluation return, what gymnax-blines publishes, is in the metrics. An evaluation plays
# whole episodes of 10 envs (at most the env's time limit of sequential steps, against an
# update's rollout and minibatch steps: a small part of these runs), and it leaves training
# bit for bit as it is (the Pendulum preset's metrics and parameters checked equal).
MINATAR_PRESET: dict[str, Any] = {
    "num_envs": 64,
    "num_steps": 128,
    "total_timesteps": 10_000_000,
    "update_epochs": 4,
    "num_minibatches": 8,
    "learning_rate": 5e-4,
    "activation": "relu",
    "hidden_sizes": (256, 256),
    "eval_every": 125,  # of 1220 updates
}

# gymnax-blines' PPO for classic control (github.com/RobertTLange/gymnax-blines,
# agents/<env>/ppo.yaml), translated: num_train_envs -> num_envs, n_steps -> num_steps,
# epoch_ppo -> update_epochs, n_minibatch -> num_minibatches, entropy_coeff -> ent_coef,
# critic_coeff -> vf_coef, lr_begin == lr_end -> a constant learning_rate (anneal_lr=False);
# separate actor and critic MLPs of 64-64 ReLU (utils/models.py), the value loss clipped at
# clip_eps = 0.2 (vf_clip_eps), advantages normalized per minibatch, gamma 0.99, GAE 0.95,
# max_grad_norm 1.0. Not translatable: their Gaussian policy's state-dependent std
# (softplus, here a state-independent log_std), their dense layers' default (LeCun) init,
# which makes the untrained policy state-dependent (here the policy head starts near
# uniform), and their time limit taken as termination (here truncation bootstraps).
BLINES_CLASSIC_CONTROL: dict[str, Any] = {
    "update_epochs": 4,
    "num_minibatches": 4,
    "learning_rate": 5e-4,
    "anneal_lr": False,
    "max_grad_norm": 1.0,
    "hidden_sizes": (64, 64),
    "activation": "relu",
}

SUITE_PRESET: dict[str, Any] = {
    "num_envs": 16,
    "num_steps": 64,
    "update_epochs": 4,
    "num_minibatches": 4,
    "learning_rate": 5e-4,
}

PRESETS: dict[str, dict[str, Any]] = {
    # PureJaxRL's classic config (PPOConfig's defaults) at the budget it needs: 500k steps
    # bring all 4 seeds to 500 (training and evaluation); at 250k the evaluations reach
    # 480-500 and training 405-490, at 150k training ~300 (gymnax-blines' 8 envs x 32 steps at
    # lr 5e-4 reach ~485 by 150k). No eval_every: CartPole is the default env of PPOConfig,
    # the CLI and the tests, and evaluations would add to every such compile and run.
    "CartPole-v1": {"total_timesteps": 500_000},
    # gymnax-blines: 16 envs x 32 steps, 4 x 4, lr 5e-4, 500k steps (2 seeds at 100k:
    # evaluation -73 and -80, training -100 and -130)
    "Acrobot-v1": {
        **BLINES_CLASSIC_CONTROL,
        "num_envs": 16,
        "num_steps": 32,
        "total_timesteps": 500_000,
        "eval_every": 100,  # of 976 updates
    },
    # gymnax-blines: 16 envs x 32 steps, 64 epochs x 4 minibatches, entropy 0.003, 250k steps;
    # its lr falls linearly from 5e-3 to 5e-4 over the first 10% of gradient steps, then stays:
    # here the 5e-4 it holds for the other 90%. The reward is -1 a step until the flag, so
    # learning starts only once some episode reaches it; on a CPU no seed had by 100k steps
    # (-200; also with lr 5e-3 annealed, 2e-3, or no entropy bonus and normalized observations)
    "MountainCar-v0": {
        **BLINES_CLASSIC_CONTROL,
        "num_envs": 16,
        "num_steps": 32,
        "update_epochs": 64,
        "ent_coef": 0.003,
        "total_timesteps": 250_000,
        "eval_every": 50,  # of 488 updates
    },
    # gymnax-blines: 32 envs x 16 steps, 4 x 4, lr 5e-4, entropy 0.01, 1M steps. The action
    # cost (-0.1 a^2 a step) pulls the policy to doing nothing (return 0) unless exploration
    # finds the flag (+100) first: by 300k steps 2 seeds on a CPU had settled there (return
    # -0.1; normalized observations and rewards, gamma 0.999 or entropy 0.05 did not find it)
    "MountainCarContinuous-v0": {
        **BLINES_CLASSIC_CONTROL,
        "num_envs": 32,
        "num_steps": 16,
        "total_timesteps": 1_000_000,
        "eval_every": 200,  # of 1953 updates
    },
    "Pendulum-v1": {
        "num_envs": 16,
        "num_steps": 256,
        "total_timesteps": 1_000_000,
        "update_epochs": 10,
        "num_minibatches": 16,
        "learning_rate": 1e-3,
        "gamma": 0.95,
        "ent_coef": 0.0,
        "normalize_observations": True,
        "normalize_rewards": True,
        "eval_every": 25,  # of 244 updates
    },
    **{
        f"{game}-MinAtar": MINATAR_PRESET
        for game in ("Asterix", "Breakout", "Freeway", "SpaceInvaders")
    },
    # The adapter suites' settings that benchmarks/envs.py at 54d94c6 trains (Snake there on a 6x6
    # board, env_kwargs={"num_rows": 6, "num_cols": 6, "time_limit": 100}, NAVIX's room with a
    # 20-step limit, {"max_steps": 20}); the envs stay as they are.
    "jumanji/Snake-v1": {**SUITE_PRESET, "total_timesteps": 600_000},
    "xminigrid/MiniGrid-Empty-5x5": {**SUITE_PRESET, "total_timesteps": 200_000},
    "navix/Navix-Empty-5x5-v0": {**SUITE_PRESET, "total_timesteps": 200_000},
    # Craftax Classic's symbolic world: generating a world (a reset) costs about 70 steps on a
    # CPU, so each env draws one start per rollout (reset_pool=1; ~6x the env steps/s);
    # 64 envs and 256-256 MLPs for its 1345-long observation
    "craftax/Craftax-Classic-Symbolic-v1": {
        **SUITE_PRESET,
        "num_envs": 64,
        "hidden_sizes": (256, 256),
        "reset_pool": 1,
        "total_timesteps": 250_000,
    },
    # brax's default (generalized) backend: continuous actions, so no entropy bonus and
    # observations normalized, as for Pendulum; lr 3e-4, the usual for Box actions
    "brax/inverted_pendulum": {
        **SUITE_PRESET,
        "total_timesteps": 500_000,
        "learning_rate": 3e-4,
        "ent_coef": 0.0,
        "normalize_observations": True,
    },
    # DeepMind Control's cartpole on MJX: 1000-step episodes, rewards in [0, 1] every step;
    # Playground's own settings scaled down (a long horizon, gamma 0.995, normalized rewards,
    # an entropy bonus of 0.01). lr 5e-4: at 1e-3 the two seeds of a sweep rose to 998 and
    # 876, then fell to ~230; without the entropy bonus a seed can stall near 450
    # (benchmarks/README.md at 54d94c6, "One env per adapter suite").
    "playground/CartpoleBalance": {
        "num_envs": 64,
        "num_steps": 32,
        "total_timesteps": 3_000_000,
        "update_epochs": 8,
        "num_minibatches": 8,
        "learning_rate": 5e-4,
        "gamma": 0.995,
        "normalize_observations": True,
        "normalize_rewards": True,
    },
}


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
    "normalize_advantages",
    "adaptive_penalty",
    "normalize_observations",
    "normalize_rewards",
    "shared_torso",
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
