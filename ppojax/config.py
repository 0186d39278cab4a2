"""PPOConfig: every setting of a PPO run, validated at construction.

Fields that fix shapes or the program are static (``pytree_node=False``); scalar
hyperparameters are pytree leaves, so ``jax.vmap`` can sweep them without recompiling.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from typing import Any

from flax import struct

ACTIVATIONS = ("tanh", "relu", "gelu", "silu", "elu")
POLICY_OBJECTIVES = ("clip", "penalty", "clip_penalty")


def static(default: Any) -> Any:
    return struct.field(pytree_node=False, default=default)


@struct.dataclass
class PPOConfig:
    """Hyperparameters of one PPO run.

    Static fields (shapes and program structure): env_id, num_envs, num_steps,
    total_timesteps, update_epochs, num_minibatches, anneal_lr, normalize_advantages,
    hidden_sizes, activation, policy_objective, adaptive_penalty, normalize_observations,
    normalize_rewards. Traced fields (sweepable with vmap): every float. The optional ones
    (vf_clip_eps, target_kl, reward_clip) switch their feature off with ``None``, which changes
    the program.

    policy_objective: "clip" (PPO-Clip), "penalty" (PPO-Penalty: E[r A] - beta KL(pi_old||pi)
    with the analytic KL) or "clip_penalty" (both terms). beta starts at penalty_coef and, when
    adaptive_penalty, doubles after an update whose KL exceeds 1.5 * penalty_target and halves
    after one below penalty_target / 1.5.
    target_kl: stop an update's remaining minibatch steps once a minibatch's approximate KL
    exceeds it. normalize_observations: running mean/variance over all envs, clipped to
    +-obs_clip. normalize_rewards: divide by the running std of the discounted return (gamma);
    reward_clip clips the (scaled) reward to +-reward_clip.
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

    def __post_init__(self) -> None:
        if isinstance(self.hidden_sizes, list):
            object.__setattr__(self, "hidden_sizes", tuple(self.hidden_sizes))
        validate(self)

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
        settings = {**PRESETS.get(env_id, {}), "env_id": env_id, **overrides}
        unknown = sorted(set(settings) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(unknown_field_message(unknown[0]))
        return cls(**settings)


def _replace(self: PPOConfig, **changes: Any) -> PPOConfig:
    """A copy with ``changes`` applied, validated again; unknown names get close matches."""
    unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
    if unknown:
        raise ValueError(unknown_field_message(unknown[0]))
    return dataclasses.replace(self, **changes)


# flax.struct.dataclass installs its own ``replace``; this one also names unknown fields.
PPOConfig.replace = _replace  # type: ignore[method-assign]


PRESETS: dict[str, dict[str, Any]] = {
    "CartPole-v1": {},
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
    },
}


def unknown_field_message(name: str) -> str:
    names = [f.name for f in dataclasses.fields(PPOConfig)]
    close = difflib.get_close_matches(name, names, n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    return f"PPOConfig has no field {name!r}.{hint} Fields: {', '.join(names)}."


def _is_concrete_number(value: Any) -> bool:
    """True for Python / NumPy scalars; False for tracers and batched arrays (vmap sweeps)."""
    try:
        float(value)
    except Exception:  # tracers, batched arrays and pytree placeholders are checked elsewhere
        return False
    return True


def check_positive_int(owner: str, name: str, value: Any) -> None:
    """Raise ``ValueError`` naming ``owner.name`` unless ``value`` is an int > 0."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{owner}.{name} must be a positive int, got {value!r}.")


def check_range(
    owner: str, name: str, value: Any, low: float, high: float, *, open_low: bool
) -> None:
    """Raise ``ValueError`` naming ``owner.name`` unless ``value`` lies in [low, high] (or
    (low, high] with ``open_low``); traced and batched values pass (checked per point)."""
    if not _is_concrete_number(value):
        return
    number = float(value)
    below = number <= low if open_low else number < low
    if math.isnan(number) or below or number > high:
        left = "(" if open_low else "["
        raise ValueError(f"{owner}.{name} must lie in {left}{low}, {high}], got {value!r}.")


def check_env_id(env_id: str) -> None:
    import gymnax

    if env_id in gymnax.registered_envs:
        return
    close = difflib.get_close_matches(env_id, gymnax.registered_envs, n=3, cutoff=0.5)
    hint = f" Close matches: {', '.join(close)}." if close else ""
    raise ValueError(
        f"PPOConfig.env_id {env_id!r} is not a gymnax environment.{hint} "
        "`ppojax.list_envs()` lists every id."
    )


def validate(config: PPOConfig) -> None:
    """Raise ``ValueError`` naming the field and the fix for any invalid setting."""
    for name in ("num_envs", "num_steps", "total_timesteps", "update_epochs", "num_minibatches"):
        check_positive_int("PPOConfig", name, getattr(config, name))
    if config.batch_size % config.num_minibatches:
        raise ValueError(
            f"PPOConfig.num_minibatches={config.num_minibatches} must divide "
            f"num_envs*num_steps={config.batch_size}; choose a divisor of {config.batch_size}."
        )
    if config.num_updates < 1:
        raise ValueError(
            f"PPOConfig.total_timesteps={config.total_timesteps} is smaller than one rollout "
            f"(num_envs*num_steps={config.batch_size}); raise total_timesteps."
        )
    if not config.hidden_sizes or any(
        not isinstance(size, int) or size <= 0 for size in config.hidden_sizes
    ):
        raise ValueError(
            f"PPOConfig.hidden_sizes must be a non-empty tuple of positive ints, "
            f"got {config.hidden_sizes!r}."
        )
    if config.activation not in ACTIVATIONS:
        raise ValueError(
            f"PPOConfig.activation {config.activation!r} is unknown; use one of {ACTIVATIONS}."
        )
    if config.policy_objective not in POLICY_OBJECTIVES:
        raise ValueError(
            f"PPOConfig.policy_objective {config.policy_objective!r} is unknown; "
            f"use one of {POLICY_OBJECTIVES}."
        )
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
            check_range("PPOConfig", name, getattr(config, name), 0.0, math.inf, open_low=True)
    check_env_id(config.env_id)
