"""The text environment interface, in gymnax's spirit, and the registry of text env ids.

A text environment speaks token ids, one episode per call, and is vmapped by the rollout:

    env.prompt_len, env.reply_len                    # static widths of its observations
    state, prompt = env.reset(key)                   # prompt: Tokens [prompt_len]
    state, reply, reward, done = env.step(state, response)
    # response: Tokens [R], the model's turn (its end-of-turn token included when emitted);
    # reply: Tokens [reply_len]; reward: float32 []; done: bool [] (the episode is over)

``Tokens`` is a padded token array: ids [W] and a mask [W] (True on real tokens). The prompt
is left-padded (real tokens at the end), as every prompt in the library is; a reply may hold
its padding anywhere, the rollout attends to its real tokens only. A JAX environment's
``reset`` and ``step`` are pure and jittable, and run inside the rollout's compiled program.

A Python environment (``host.PythonTextEnv``: lists of ids, floats and bools instead of
arrays) has the same methods and runs on the host between compiled turns (``host``).

An env may say what a successful episode is, apart from its return (``success_rule``): a
method ``success(rewards, terminated) -> bool`` of one episode (its per-turn rewards, the
turns played only, and whether the env ended it), or a number ``success_return`` that the
return must reach. Without either, success is a positive return.

``register_text_env(env_id, factory)`` names a factory ``factory(**kwargs) -> env``;
``make_text_env(env_id, **kwargs)`` builds one. The built-in ids are registered on first use.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np


class Tokens(NamedTuple):
    """A padded token array: ids [..., W] (int32) and mask [..., W] (bool, True on real
    tokens)."""

    tokens: jax.Array
    mask: jax.Array


class TextEnv(Protocol):
    """What the rollout needs of a text environment (see the module)."""

    prompt_len: int
    reply_len: int

    def reset(self, key: jax.Array) -> tuple[Any, Tokens]: ...

    def step(self, state: Any, response: Tokens) -> tuple[Any, Tokens, jax.Array, jax.Array]: ...


TextEnvFactory = Callable[..., TextEnv]
_FACTORIES: dict[str, TextEnvFactory] = {}
# The library's own ids: module and factory, imported on first use.
BUILT_IN = {
    "guessing": ("ppojax.rlhf.envs.guessing", "number_guessing"),
    "calculator": ("ppojax.rlhf.envs.calculator", "calculator"),
}


def register_text_env(env_id: str, factory: TextEnvFactory) -> None:
    """Make ``env_id`` buildable by ``make_text_env``; a later call for the same id replaces
    the factory."""
    if not isinstance(env_id, str) or not env_id:
        raise ValueError(f"register_text_env: env_id must be a non-empty str, got {env_id!r}")
    if not callable(factory):
        raise TypeError(f"register_text_env({env_id!r}): the factory must be callable")
    _FACTORIES[env_id] = factory


def text_env_ids() -> list[str]:
    """Every id ``make_text_env`` knows: the registered ones and the built-in ones."""
    return sorted(set(_FACTORIES) | set(BUILT_IN))


def text_env_factory(env_id: str) -> TextEnvFactory:
    """The factory ``env_id`` names (a built-in one imported on first use); a ``KeyError``
    listing the known ids (and the closest) for an unknown one."""
    if env_id not in _FACTORIES and env_id in BUILT_IN:
        module, name = BUILT_IN[env_id]
        register_text_env(env_id, getattr(importlib.import_module(module), name))
    if env_id not in _FACTORIES:
        close = difflib.get_close_matches(str(env_id), text_env_ids(), n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise KeyError(f"unknown text env {env_id!r}; known: {text_env_ids()}.{hint}")
    return _FACTORIES[env_id]


def make_text_env(env_id: str, **kwargs: Any) -> TextEnv:
    """The environment ``env_id`` names, built with ``kwargs``; a ``KeyError`` listing the
    known ids (and the closest) for an unknown one, a ``TypeError`` naming the id for an
    object without the interface."""
    env = text_env_factory(env_id)(**kwargs)
    check_interface(env_id, env)
    return env


def check_interface(env_id: str, env: Any) -> None:
    """A ``TypeError`` naming ``env_id`` and what is missing unless ``env`` has callable
    ``reset`` and ``step`` and positive int ``prompt_len`` and ``reply_len``."""
    for name in ("reset", "step"):
        if not callable(getattr(env, name, None)):
            raise TypeError(f"text env {env_id!r}: {type(env).__name__} has no method {name}()")
    for name in ("prompt_len", "reply_len"):
        value = getattr(env, name, None)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise TypeError(
                f"text env {env_id!r}: {name} must be an int >= 1 (a static width of its "
                f"observations), got {value!r}"
            )


def check_observation(env_name: str, where: str, observation: Any, width: int) -> Tokens:
    """``observation`` as ``Tokens`` of int32 ids and bool mask, both [width]; at trace time,
    a ``ValueError`` naming the env and ``where`` ("reset", "step") for anything else."""
    if not (isinstance(observation, tuple) and len(observation) == 2):
        raise ValueError(
            f"text env {env_name}: {where}() must return its observation as Tokens(tokens, "
            f"mask), got {type(observation).__name__}"
        )
    tokens, mask = (jnp.asarray(part) for part in observation)
    for name, part, kind in (("tokens", tokens, jnp.integer), ("mask", mask, jnp.bool_)):
        if part.shape != (width,) or not jnp.issubdtype(part.dtype, kind):
            raise ValueError(
                f"text env {env_name}: {where}() returned observation {name} of shape "
                f"{part.shape} and dtype {part.dtype}; it must be [{width}] of "
                f"{'int' if kind is jnp.integer else 'bool'}"
            )
    return Tokens(tokens.astype(jnp.int32), mask)


def check_scalar(env_name: str, name: str, value: Any, dtype: Any) -> jax.Array:
    """``value`` as a scalar of ``dtype``; a ``ValueError`` naming the env for another shape."""
    value = jnp.asarray(value)
    if value.shape != ():
        raise ValueError(
            f"text env {env_name}: step() returned {name} of shape {value.shape}; it must be "
            "a scalar (the rollout vmaps the env over episodes)"
        )
    return value.astype(dtype)


class SuccessRule(NamedTuple):
    """Which episodes an env counts a success: ``judge(rewards [N, T], turns [N], terminated
    [N]) -> bool [N]`` (numpy), and the rule in words (for what a command prints)."""

    judge: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
    says: str


def success_rule(env: Any) -> SuccessRule:
    """The success ``env`` defines (see the module): its ``success`` method, else its
    ``success_return``, else a positive return, said as the env defining none; a
    ``ValueError`` naming the env for a ``success_return`` that is not a number, and from
    ``judge`` for a ``success`` that raises."""
    success = getattr(env, "success", None)
    if callable(success):

        def judge(rewards: np.ndarray, turns: np.ndarray, terminated: np.ndarray) -> np.ndarray:
            judged = []
            rows = zip(rewards, turns, terminated, strict=True)
            for episode, (row, count, ended) in enumerate(rows):
                played = [float(r) for r in row[:count]]
                try:
                    judged.append(bool(success(played, bool(ended))))
                except Exception as error:  # the env's code: named, as one line
                    raise ValueError(
                        f"text env {type(env).__name__}: success({played}, {bool(ended)}) of "
                        f"episode {episode} raised {type(error).__name__}: {error}"
                    ) from error
            return np.array(judged, bool)

        return SuccessRule(judge, "the env's success()")
    threshold = getattr(env, "success_return", None)
    if threshold is not None:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
            raise ValueError(
                f"text env {type(env).__name__}: success_return must be a number (the return "
                f"a successful episode reaches), got {threshold!r}"
            )
        return SuccessRule(
            lambda rewards, turns, terminated: rewards.sum(axis=1) >= threshold,
            f"return >= {threshold:g}",
        )
    return SuccessRule(
        lambda rewards, turns, terminated: rewards.sum(axis=1) > 0,
        "return > 0: the env defines no success",
    )
