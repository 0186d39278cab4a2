"""What ``ppojax rlhf --env`` checks before it makes a run folder: the env id, the arguments
of its factory, the vocabulary it says, and the shapes and dtypes its ``reset`` and ``step``
return (``jax.eval_shape`` of a JAX env; one reset and one step of a Python env). Each
failure is a ``ValueError`` naming the env and what is wrong, which the command prints as one
line with exit code 2."""

from __future__ import annotations

import inspect
import json
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ppojax.rlhf.core.episodes import checked_reset, checked_step
from ppojax.rlhf.core.host_rollout import HostRollout
from ppojax.rlhf.core.sampling import KVCacheHook
from ppojax.rlhf.core.turns import EpisodeSettings
from ppojax.rlhf.envs.chat import ChatFormat
from ppojax.rlhf.envs.env import Tokens, make_text_env, text_env_factory
from ppojax.rlhf.envs.host import HostEnvError, runs_on_host


class Vocabulary(NamedTuple):
    """The token ids a model for an env needs: ``vocab_size`` rows, its pad and end-of-turn
    ids."""

    vocab_size: int
    pad_id: int
    eos_id: int


def parse_env_args(words: Sequence[str]) -> dict[str, Any]:
    """``--env-arg NAME=VALUE`` words as keyword arguments: VALUE read as JSON (``4``,
    ``true``, ``[1, 2]``), else kept as text."""
    values: dict[str, Any] = {}
    for word in words:
        name, equals, text = word.partition("=")
        if not equals or not name.isidentifier():
            raise ValueError(f"--env-arg {word!r}: give NAME=VALUE, such as num_values=4")
        if name in values:
            raise ValueError(f"--env-arg {name} is given more than once")
        try:
            values[name] = json.loads(text)
        except ValueError:
            values[name] = text
    return values


def factory_arguments(env_id: str) -> list[str] | None:
    """The names the factory of ``env_id`` takes (None: any, it has ``**kwargs``); a
    ``ValueError`` listing the known ids for an unknown one."""
    try:
        factory = text_env_factory(env_id)
    except KeyError as error:
        raise ValueError(f"--env: {error.args[0]}") from None
    try:
        parameters = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL]


def build_env(env_id: str, env_args: dict[str, Any], turns: int, chat: Any = None) -> Any:
    """The env ``make_text_env(env_id, **env_args)``, its factory's ``max_turns`` set to
    ``turns`` when it takes one and ``env_args`` leaves it, and ``chat`` (a ``ChatFormat``,
    for ``--model``) given as its ``chat``; a ``ValueError`` for an unknown id, an argument the
    factory does not take, a ``max_turns`` unlike ``turns``, or one the factory refuses."""
    names = factory_arguments(env_id)
    kwargs = dict(env_args)
    if "chat" in kwargs:
        raise ValueError("--env-arg chat: --model FOLDER gives the env its chat template")
    if names is not None:
        for name in kwargs:
            if name not in names:
                takes = ", ".join(names) if names else "no arguments"
                raise ValueError(f"--env-arg {name}: text env {env_id!r} takes {takes}, not {name}")
    if "max_turns" in kwargs and kwargs["max_turns"] != turns:
        raise ValueError(
            f"--env-arg max_turns={kwargs['max_turns']} and --turns {turns} disagree: give "
            "--turns alone (it sets the env's max_turns too)"
        )
    if names is None or "max_turns" in names:
        kwargs["max_turns"] = turns
    if chat is not None:
        kwargs["chat"] = chat
    try:
        return make_text_env(env_id, **kwargs)
    except (TypeError, ValueError) as error:
        given = " ".join(f"--env-arg {k}={v}" for k, v in env_args.items())
        raise ValueError(f"--env {env_id} {given}: {error}".replace("  ", " ")) from None


def vocabulary(env_id: str, env: Any) -> Vocabulary:
    """The vocabulary ``env`` says (its ``vocab_size``, ``pad_id`` and ``eos_id``
    attributes); a ``ValueError`` naming the env when one is missing or they do not fit."""
    values = {name: getattr(env, name, None) for name in Vocabulary._fields}
    wrong = [
        name
        for name, value in values.items()
        if not isinstance(value, int) or isinstance(value, bool) or value < 0
    ]
    if wrong:
        raise ValueError(
            f"text env {env_id!r}: {type(env).__name__} must say its vocabulary as int "
            f"attributes vocab_size, pad_id and eos_id (the command builds a model for it); "
            f"{', '.join(wrong)} {'is' if len(wrong) == 1 else 'are'} missing or not an int >= 0"
        )
    vocab = Vocabulary(**values)
    if vocab.pad_id == vocab.eos_id or max(vocab.pad_id, vocab.eos_id) >= vocab.vocab_size:
        raise ValueError(
            f"text env {env_id!r}: pad_id {vocab.pad_id} and eos_id {vocab.eos_id} must differ "
            f"and be below vocab_size {vocab.vocab_size}"
        )
    return vocab


def chat_vocabulary(chat: ChatFormat, vocab_size: int = 0) -> Vocabulary:
    """The ids a ``--model`` run plays with: the template's end-of-turn ends a turn; the
    tokenizer's pad id pads unless it is that token too (Llama's), then another id does
    (padding is masked everywhere, but a turn must end at its first end-of-turn)."""
    pad, eos = chat.tokenizer.pad_id, chat.eot_id
    if pad is None or pad == eos:
        pad = 0 if eos != 0 else 1
    return Vocabulary(vocab_size, pad, eos)


def check_env(
    env_id: str, env: Any, model: KVCacheHook, settings: EpisodeSettings, vocab: Vocabulary
) -> None:
    """A ``ValueError`` naming ``env_id`` and the field at fault for what ``reset`` or
    ``step`` return wrongly: a JAX env through ``jax.eval_shape`` (nothing runs), a Python
    env through one reset and one step of an empty turn."""
    if runs_on_host(env):
        check_python_env(env_id, env, model, settings, vocab)
    else:
        check_jax_env(env_id, env, settings.turn_len)


def check_jax_env(env_id: str, env: Any, turn_len: int) -> None:
    """``reset`` and ``step`` traced by ``jax.eval_shape`` with the rollout's checks
    (``episodes.checked_reset``, ``checked_step``: what they return, step's state kept, the
    env's line for what fails to trace); nothing runs."""
    name = repr(env_id)
    response = Tokens(
        jax.ShapeDtypeStruct((turn_len,), jnp.int32), jax.ShapeDtypeStruct((turn_len,), bool)
    )
    state, _ = jax.eval_shape(checked_reset(env, name), jax.random.key(0))
    jax.eval_shape(checked_step(env, name), state, response)


def check_python_env(
    env_id: str, env: Any, model: KVCacheHook, settings: EpisodeSettings, vocab: Vocabulary
) -> None:
    """One reset and one step of a turn of just EOS, checked as the host rollout checks them
    (``HostRollout``: ids, reward, done), and the prompt's ids below ``vocab_size``."""
    probe = HostRollout(model, env, 1, settings, 1, env_name=repr(env_id))
    try:
        states, prompt = probe.reset(jax.random.split(jax.random.key(0), 1))  # one group
        _, reply, _, _ = probe.step(states[0], [settings.eos_id], 0, 0)
    except HostEnvError as error:
        raise ValueError(f"{error} (in the check before training)") from None
    ids = [int(i) for i in jnp.where(prompt.mask, prompt.tokens, 0).reshape(-1)] + reply
    if max(ids, default=0) >= vocab.vocab_size:
        raise ValueError(
            f"text env {env_id!r}: reset() or step() returned token id {max(ids)}, not below "
            f"its vocab_size {vocab.vocab_size}"
        )
