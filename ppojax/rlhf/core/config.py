"""RLHFConfig: the settings of the library's RLHF step, validated at construction.

Only the algorithm's settings live here; a task (its vocabulary, its model sizes, its SFT and
reward-model stages) has its own config. A frozen dataclass registered as a pytree, as
``PPOConfig`` is: fields that fix shapes or the program are static (``ppojax.checks.static``);
scalar hyperparameters are pytree leaves, so ``jax.vmap`` can sweep them (for example
``kl_coef``) in one compiled call.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import sys
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ppojax.checks import (
    ConfigError,
    check_bool,
    check_choice,
    check_positive_int,
    check_range,
    parse_bool,
    register_config,
    static,
)
from ppojax.rlhf.core.advantages import ESTIMATORS
from ppojax.rlhf.core.aggregation import AGGREGATIONS
from ppojax.rlhf.core.kl import KL_ESTIMATORS, KL_PLACES

# Fields renamed so that a name means one thing in PPOConfig and RLHFConfig alike: the old
# name -> the field. ppo_epochs is PPOConfig's update_epochs. target_kl was the adaptive-KL
# controller's target; in PPOConfig target_kl stops an update early on approximate KL, so
# the target became kl_target (beside kl_coef, adaptive_kl, kl_horizon).
RENAMED = {"ppo_epochs": "update_epochs", "target_kl": "kl_target"}
# Old names still accepted in code and on the command line (with a warning). target_kl is
# not: as a keyword or flag it would mean the adaptive target here and early stopping in
# PPOConfig, so it is an error naming kl_target.
DEPRECATED = ("ppo_epochs",)


@register_config
@dataclasses.dataclass(frozen=True)
class RLHFConfig:
    """Hyperparameters of ``ppojax.rlhf.make_trainer``.

    Static: token ids (pad_id, eos_id), shapes (response_len, group_size, num_minibatches,
    update_epochs), the program (algorithm, kl_in, kl_estimator, adaptive_kl, loss_aggregation,
    whiten_advantages, group_std, critic_warmup_steps, divergence_guard, remat_layers,
    logit_chunk, master_weights), the
    reward weights and the LoRA layout (lora_rank, lora_targets, lora_full). Traced:
    temperature, learning rate and every coefficient.
    """

    pad_id: int = static(0)  # the token after EOS and on the left of short prompts
    eos_id: int = static(2)  # a response ends at its first eos_id (included)
    response_len: int = static(10)  # sampled positions per response
    algorithm: str = static("ppo")  # advantages.ESTIMATORS: "ppo" (critic), "grpo", "rloo"
    group_size: int = static(1)  # samples per prompt; grpo and rloo need >= 2
    update_epochs: int = static(4)  # epochs over each step's responses (PPOConfig's name)
    num_minibatches: int = static(4)  # must divide prompts * group_size
    kl_in: str = static("reward")  # "reward": -beta KL_t per token; "loss": + beta KL_t
    kl_estimator: str = static("k1")  # kl.KL_ESTIMATORS: k1, k2, k3
    adaptive_kl: bool = static(False)  # False: beta stays kl_coef
    loss_aggregation: str = static("token")  # aggregation.AGGREGATIONS
    whiten_advantages: bool = static(True)  # ppo: normalize advantages over real tokens
    group_std: bool = static(True)  # grpo: divide by the group's std (Dr. GRPO: False)
    critic_warmup_steps: int = static(0)  # ppo: first steps train the critic only
    reward_weights: tuple[float, ...] | None = static(None)  # None: weight 1 for each fn
    lora_rank: int = static(0)  # 0: full fine-tuning; > 0: frozen base + adapters
    lora_targets: tuple[str, ...] = static(())  # param path parts whose kernels get adapters
    lora_full: tuple[str, ...] = static(())  # param path parts trained in full (a value head)
    # Skip a step whose loss, gradients or update is not finite; on by default, where env
    # PPO's PPOConfig has it off: one bad batch would otherwise end an hours-long LM run.
    divergence_guard: bool = static(True)
    # Memory levers: they change the program's peak, not its numbers (beyond float32 order).
    # remat_layers: the loss's forward keeps only each decoder layer's input and its backward
    # recomputes the rest a layer at a time (``ppojax.rlhf.core.remat``).
    remat_layers: bool = static(False)
    # logit_chunk: response tokens whose LM-head logits are computed at once, scoring and in
    # the loss, for a policy that gives its head apart (ppojax.rlhf.core.logprobs); 0: all
    # [B, R, V] at once. 4096: in the planner, lower one-H100 peaks than 0 for three Qwen2.5
    # steps, than 16384 for two of them and than 1024 for the third (docs/rlhf.md).
    logit_chunk: int = static(4096)
    # Float32 master params and Adam moments under the compute dtype (the dtype the model's
    # params come in, bf16 for a bf16 model: ``ppojax.engine.precision``). False keeps the
    # state in the model's dtype, which loses updates smaller than a bf16 weight's spacing
    # (most of them at lr 1e-6).
    master_weights: bool = static(True)

    temperature: float = 1.0
    learning_rate: float = 1e-4
    max_grad_norm: float = 1.0
    gamma: float = 1.0
    gae_lambda: float = 0.95
    clip_eps: float = 0.2  # ratio clipped below at 1 - clip_eps
    clip_eps_high: float | None = None  # above at 1 + clip_eps_high (None: clip_eps)
    vf_clip_eps: float = 0.2
    vf_coef: float = 0.5
    ent_coef: float = 0.0
    kl_coef: float = 0.05  # beta, or its start value under adaptive_kl
    kl_target: float = 2.0  # adaptive_kl: wanted sequence KL (nats)
    kl_horizon: float = 1000.0  # adaptive_kl: beta *= 1 + e * rows / kl_horizon
    missing_eos_penalty: float = 0.0  # subtracted from the score of responses without EOS
    lora_alpha: float = 16.0  # adapters add (lora_alpha / lora_rank) A @ B

    def __post_init__(self) -> None:
        validate(self)

    def replace(self, **changes: Any) -> RLHFConfig:
        """A copy with ``changes`` applied, validated again."""
        changes = current_names(changes)
        unknown = sorted(set(changes) - set(config_names()))
        if unknown:
            raise ConfigError(
                unknown[0], f"RLHFConfig has no field {unknown[0]!r}; its fields: {config_names()}"
            )
        return dataclasses.replace(self, **changes)

    @property
    def upper_clip_eps(self) -> float:
        """The clip above 1: clip_eps_high, or clip_eps when that is None."""
        return self.clip_eps if self.clip_eps_high is None else self.clip_eps_high

    @property
    def needs_critic(self) -> bool:
        """Whether the algorithm's estimator learns a value function (PPO's does)."""
        return ESTIMATORS[self.algorithm].needs_critic


_dataclass_init = RLHFConfig.__init__


@functools.wraps(_dataclass_init)
def _init(self: RLHFConfig, *args: Any, **kwargs: Any) -> None:
    _dataclass_init(self, *args, **current_names(kwargs))


RLHFConfig.__init__ = _init  # type: ignore[method-assign]  # old keywords, see current_names


def current_names(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` (keywords of ``RLHFConfig(...)`` or ``.replace(...)``) with a deprecated
    name (``DEPRECATED``) renamed after a ``DeprecationWarning`` naming the field; ``target_kl``
    is a ``ConfigError`` naming ``kl_target``."""
    if not any(name in settings for name in RENAMED):
        return settings
    if "target_kl" in settings:
        raise ConfigError(
            "target_kl",
            "RLHFConfig.target_kl is now kl_target (the adaptive-KL controller's target, "
            "nats per sequence): target_kl means early stopping on approximate KL, which "
            "PPOConfig has and RLHFConfig does not.",
        )
    for old in DEPRECATED:
        if old in settings:
            new = RENAMED[old]
            warnings.warn(
                f"RLHFConfig.{old} is deprecated; use {new}", DeprecationWarning, stacklevel=3
            )
    return stored_names(settings)


def stored_names(values: Mapping[str, Any]) -> dict[str, Any]:
    """RLHFConfig fields as stored by any version (a run folder's config.json), each old name
    (``RENAMED``) read as its field. Unambiguous: no version stores a field under an old name,
    so a ``target_kl`` there is the adaptive target; a ``ConfigError`` when a dict has both."""
    renamed = dict(values)
    for old, new in RENAMED.items():
        if old in renamed:
            if new in renamed:
                raise ConfigError(
                    new, f"RLHF settings give both {old} (the old name) and {new}; keep {new}."
                )
            renamed[new] = renamed.pop(old)
    return renamed


def _check_ints(config: RLHFConfig) -> None:
    for name in ("response_len", "group_size", "update_epochs", "num_minibatches"):
        check_positive_int("RLHFConfig", name, getattr(config, name))
    for name in ("pad_id", "eos_id", "critic_warmup_steps", "lora_rank", "logit_chunk"):
        value = getattr(config, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(name, f"RLHFConfig.{name} must be an int >= 0, got {value!r}.")
    if config.pad_id == config.eos_id:
        raise ConfigError("eos_id", "RLHFConfig.eos_id must differ from pad_id.")
    least = ESTIMATORS[config.algorithm].min_group_size
    if config.group_size < least:
        raise ConfigError(
            "group_size",
            f"RLHFConfig.group_size must be >= {least} for algorithm={config.algorithm!r} (its "
            f"baseline is the other samples of the same prompt), got {config.group_size}.",
        )
    for name in ("lora_targets", "lora_full"):
        names = getattr(config, name)
        if not (isinstance(names, tuple) and all(isinstance(n, str) and n for n in names)):
            raise ConfigError(
                name, f"RLHFConfig.{name} must be a tuple of parameter path parts, got {names!r}."
            )
    if config.lora_full and not config.lora_rank:
        raise ConfigError(
            "lora_full",
            "RLHFConfig.lora_full names parameters trained in full beside LoRA adapters; "
            "without lora_rank > 0 every parameter is trained in full: set lora_rank or "
            "leave lora_full empty.",
        )
    if config.lora_rank and not config.lora_targets:
        raise ConfigError(
            "lora_targets",
            "RLHFConfig.lora_targets must name at least one layer (a part of a parameter path, "
            "such as 'q_proj' or 'c_attn') when lora_rank > 0.",
        )


def _check_weights(config: RLHFConfig) -> None:
    weights = config.reward_weights
    if weights is None:
        return
    valid = isinstance(weights, tuple) and len(weights) > 0
    if not (valid and all(isinstance(w, (int, float)) and math.isfinite(w) for w in weights)):
        raise ConfigError(
            "reward_weights",
            f"RLHFConfig.reward_weights must be None or a tuple of finite numbers, one per "
            f"reward function, got {weights!r}.",
        )


def validate(config: RLHFConfig) -> None:
    """Raise ``ConfigError`` naming the field and the fix for any invalid setting. The names
    algorithm, kl_estimator and loss_aggregation may take are their registries' keys
    (``advantages.ESTIMATORS``, ``kl.KL_ESTIMATORS``, ``aggregation.AGGREGATIONS``)."""
    check_choice("RLHFConfig", "algorithm", config.algorithm, tuple(ESTIMATORS))
    check_choice("RLHFConfig", "kl_in", config.kl_in, KL_PLACES)
    check_choice("RLHFConfig", "kl_estimator", config.kl_estimator, tuple(KL_ESTIMATORS))
    check_choice("RLHFConfig", "loss_aggregation", config.loss_aggregation, tuple(AGGREGATIONS))
    _check_ints(config)
    _check_weights(config)
    flags = ("adaptive_kl", "whiten_advantages", "group_std", "divergence_guard", "remat_layers")
    for name in (*flags, "master_weights"):
        check_bool("RLHFConfig", name, getattr(config, name))
    positive = ("temperature", "learning_rate", "max_grad_norm", "clip_eps", "vf_clip_eps")
    for name in positive + ("kl_target", "kl_horizon", "lora_alpha"):
        check_range("RLHFConfig", name, getattr(config, name), 0.0, math.inf, open_low=True)
    if config.clip_eps_high is not None:
        check_range(
            "RLHFConfig", "clip_eps_high", config.clip_eps_high, 0.0, math.inf, open_low=True
        )
    for name in ("gamma", "gae_lambda"):
        check_range("RLHFConfig", name, getattr(config, name), 0.0, 1.0, open_low=False)
    for name in ("vf_coef", "ent_coef", "kl_coef", "missing_eos_penalty"):
        check_range("RLHFConfig", name, getattr(config, name), 0.0, math.inf, open_low=False)


FIELDS = {f.name: f for f in dataclasses.fields(RLHFConfig)}


def config_names() -> tuple[str, ...]:
    """Every field name, for command-line parsing and error messages."""
    return tuple(f.name for f in dataclasses.fields(RLHFConfig))


def field_type(field: dataclasses.Field) -> Callable[[str], Any]:
    """How to parse an RLHFConfig field from one command-line word."""
    if field.name == "reward_weights":
        return lambda text: tuple(float(part) for part in text.split(","))
    if field.name in ("lora_targets", "lora_full"):
        return lambda text: tuple(part for part in text.split(",") if part)
    if field.name == "clip_eps_high":
        return float
    return parse_bool if isinstance(field.default, bool) else type(field.default)


def add_config_flags(
    parser: argparse.ArgumentParser, skip: Sequence[str], helps: Mapping[str, str] | None = None
) -> None:
    """One option per RLHFConfig field but ``skip`` (unset: the field's default); ``helps``:
    a field's help text where its default is not the field's."""
    for field in dataclasses.fields(RLHFConfig):
        if field.name not in skip:
            parser.add_argument(
                "--" + field.name.replace("_", "-"),
                dest=field.name,
                type=field_type(field),
                default=None,
                help=(helps or {}).get(field.name, f"default {field.default!r}"),
            )
    for old, new in RENAMED.items():  # hidden from --help
        if new not in skip:
            parser.add_argument(
                "--" + old.replace("_", "-"),
                dest=new if old in DEPRECATED else argparse.SUPPRESS,
                type=field_type(FIELDS[new]),
                default=None if old in DEPRECATED else argparse.SUPPRESS,
                action=functools.partial(_RenamedFlag, new_flag="--" + new.replace("_", "-")),
                help=argparse.SUPPRESS,
            )


class _RenamedFlag(argparse.Action):
    """An old flag (``RENAMED``): a deprecated one (``DEPRECATED``) still sets its field, after
    one warning line naming the new flag; ``--target-kl`` of ppojax rlhf is an error naming
    ``--kl-target`` (``parser.error``, exit status 2), for the same flag of ppojax train stops
    an update early."""

    def __init__(self, *args: Any, new_flag: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.new_flag = new_flag

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if self.dest == argparse.SUPPRESS:  # not DEPRECATED: refused
            parser.error(
                f"{option_string} is now {self.new_flag} (the adaptive-KL controller's target, "
                f"nats per sequence); {option_string} means early stopping on approximate KL, "
                "which ppojax train has and ppojax rlhf does not"
            )
        sys.stderr.write(
            f"{parser.prog}: warning: {option_string} is deprecated; use {self.new_flag}\n"
        )
        setattr(namespace, self.dest, values)
