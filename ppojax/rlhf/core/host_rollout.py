"""Python text envs (``ppojax.rlhf.envs.host.PythonTextEnv``) played on the host between
compiled turns.

``HostRollout`` (``rollout_episodes`` picks it for such an env) plays the same episodes as the
one-program rollout, in the same layout, with the same keys: one compiled call per turn
samples the turn with the KV cache carried as an explicit state from call to call (a turn
after the first first extends the cache with the previous reply), then the host decodes the
sampled turn, calls ``env.step`` for every episode that finished its turn and pads the
replies. The cost against a JAX env: per turn, one dispatch and one host round trip (the
turn's [B, R] tokens, log-probs and mask down, the replies [B, O] up; the cache stays on the
device), and the env's Python time; a JAX env runs inside one program with neither. A
group's episodes start from one ``reset``, each from its own deep copy of the state. What the
env raises or returns wrongly (an id past the model's vocabulary, a reward not finite, at any
turn) becomes a ``HostEnvError`` naming the env, the turn and the episode, and for what it
raised, the file and line of the env's code that raised.
"""

from __future__ import annotations

import copy
import math
import numbers
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.rlhf.core import turns
from ppojax.rlhf.core.context import Context, episode_context
from ppojax.rlhf.core.sampling import KVCacheHook, PolicyApply
from ppojax.rlhf.core.turns import Episodes, EpisodeSettings, TurnCarry, TurnOutput
from ppojax.rlhf.envs.env import Tokens
from ppojax.rlhf.envs.host import HostEnvError, env_raised_at


def check_ids(where: str, ids: Any, width: int, vocab_size: int | None = None) -> list[int]:
    """``ids`` as a list of at most ``width`` non-negative ints, each below ``vocab_size``
    when given; a ``HostEnvError`` starting with ``where`` for anything else."""
    if isinstance(ids, np.ndarray) and ids.ndim == 1:
        ids = ids.tolist()
    if not isinstance(ids, list | tuple) or not all(
        isinstance(i, numbers.Integral) and not isinstance(i, bool) and i >= 0 for i in ids
    ):
        raise HostEnvError(f"{where}: token ids must be a list of ints >= 0, got {ids!r:.200}")
    if len(ids) > width:
        raise HostEnvError(f"{where}: {len(ids)} token ids, more than the env's width {width}")
    if vocab_size is not None and ids and max(ids) >= vocab_size:
        # an id past the embedding table gives the model garbage (NaN losses), not an error
        raise HostEnvError(
            f"{where}: token id {max(ids)} is not below the model's vocabulary size "
            f"{vocab_size} (its logits' width)"
        )
    return [int(i) for i in ids]


class HostRollout:
    """``rollout(params, key) -> Episodes``: ``batch_size`` episodes of the Python env ``env``
    (see the module), the model read through its KV cache (``model`` a ``KVCacheHook`` with
    ``extend``) or by recomputation (``model`` a ``policy_apply``). Build it once and call it
    every step: its two compiled pieces (the first turn, any later turn) compile once."""

    def __init__(
        self,
        model: KVCacheHook | PolicyApply,
        env: Any,
        batch_size: int,
        settings: EpisodeSettings,
        group_size: int = 1,
        env_name: str | None = None,
    ) -> None:
        self.model, self.env, self.settings = model, env, settings
        self.batch_size, self.group_size = batch_size, group_size
        self.name = env_name or getattr(env, "env_name", None) or type(env).__name__
        self.layout = turns.episode_layout(env, self.name, settings, batch_size, group_size)
        self.first_turn = jax.jit(self.sample_first)
        self.next_turn = jax.jit(self.sample_next)

    def context(self, params: Any) -> Context:
        """How the compiled pieces read the episode: the KV cache or recomputation."""
        return episode_context(self.model, params, self.layout.length, self.settings.pad_id)

    def sample_first(self, params: Any, prompt: Tokens, key: jax.Array) -> tuple:
        """Compiled: read each group's prompt once, sample turn 0."""
        context = self.context(params)
        group_rows = jax.tree.map(lambda rows: rows[:: self.group_size], prompt)
        model_state, logits = turns.read_prompts(context, group_rows, self.group_size)
        carry = turns.first_carry((), model_state, logits, self.settings, self.layout)
        return turns.sample_turn(context, carry, key, self.layout.response_start(0), self.settings)

    def sample_next(
        self, params: Any, carry: TurnCarry, reply: Tokens, turn: jax.Array, key: jax.Array
    ) -> tuple:
        """Compiled: extend the cache with turn - 1's replies [B, O], sample turn ``turn``."""
        context = self.context(params)
        column = self.layout.response_start(turn)
        model_state, logits = turns.feed_reply(
            context, carry.model_state, carry.logits, reply, column - self.layout.reply_len
        )
        carry = carry._replace(model_state=model_state, logits=logits)
        return turns.sample_turn(context, carry, key, column, self.settings)

    def reset(self, keys: jax.Array) -> tuple[list[Any], Tokens]:
        """Every episode's state (deep copies within a group, one reset key each) and the
        left-padded prompts."""
        width, pad_id = self.layout.prompt_len, self.settings.pad_id
        states, rows, masks = [], [], []
        for group, group_key in enumerate(keys):
            where = f"text env {self.name}: reset() of group {group}"
            try:
                state, prompt = self.env.reset(group_key)
            except Exception as error:
                raise HostEnvError(
                    f"{where} raised {type(error).__name__}{env_raised_at(error)}: {error}"
                ) from error
            ids = check_ids(f"{where} returned its prompt wrongly", prompt, width)
            for _ in range(self.group_size):
                states.append(copy.deepcopy(state))
                rows.append([pad_id] * (width - len(ids)) + ids)
                masks.append([False] * (width - len(ids)) + [True] * len(ids))
        tokens = jnp.asarray(np.asarray(rows, np.int32))
        return states, Tokens(tokens, jnp.asarray(np.asarray(masks, bool)))

    def check_prompt(self, prompt: Tokens, vocab_size: int) -> None:
        """A ``HostEnvError`` naming the group for a prompt id not below ``vocab_size``."""
        ids = np.where(np.asarray(prompt.mask), np.asarray(prompt.tokens), 0)
        for group in range(self.batch_size // self.group_size):
            where = f"text env {self.name}: reset() of group {group} returned its prompt wrongly"
            check_ids(where, ids[group * self.group_size].tolist(), ids.shape[1], vocab_size)

    def step(
        self, state: Any, response: list[int], turn: int, row: int, vocab_size: int | None = None
    ) -> tuple:
        """``env.step`` on one episode, its outputs checked (see the module), the reply's
        ids below ``vocab_size`` when given."""
        where = f"text env {self.name}: step() at turn {turn}, episode {row}"
        try:
            outputs = self.env.step(state, response)
        except Exception as error:
            raise HostEnvError(
                f"{where} raised {type(error).__name__}{env_raised_at(error)}: {error}"
            ) from error
        if not (isinstance(outputs, tuple) and len(outputs) == 4):
            raise HostEnvError(
                f"{where} must return (state, reply, reward, done), got {type(outputs).__name__}"
            )
        state, reply, reward, done = outputs
        width = self.layout.reply_len
        reply = check_ids(f"{where} returned its reply wrongly", reply, width, vocab_size)
        if not isinstance(reward, numbers.Real) or isinstance(reward, bool):
            raise HostEnvError(f"{where} returned reward {reward!r}; it must be a float")
        if not math.isfinite(reward):  # it would turn every advantage and loss NaN
            raise HostEnvError(f"{where} returned reward {reward!r}; it must be finite")
        if not isinstance(done, bool | np.bool_):
            raise HostEnvError(f"{where} returned done {done!r}; it must be a bool")
        return state, reply, float(reward), bool(done)

    def env_turn(
        self, states: list[Any], sampled: Any, over: np.ndarray, turn: int, vocab_size: int
    ) -> TurnOutput:
        """The env's answers to one sampled turn (``sampled`` on the host, each [R, B]), the
        same rules as the one-program rollout's ``play_turn``, reply ids below
        ``vocab_size``; ``states`` updated in place."""
        tokens, log_probs, real = (np.asarray(part).T for part in sampled)
        eos = ((tokens == self.settings.eos_id) & real).any(axis=1)
        stepped = ~over & (eos | real.all(axis=1))
        width = self.layout.reply_len
        reply = np.full((self.batch_size, width), self.settings.pad_id, np.int32)
        reply_mask = np.zeros((self.batch_size, width), bool)
        reward = np.zeros(self.batch_size, np.float32)
        done = np.zeros(self.batch_size, bool)
        for row in np.flatnonzero(stepped):
            response = tokens[row][real[row]].tolist()
            stepped_row = self.step(states[row], response, turn, row, vocab_size)
            states[row], ids, reward[row], done[row] = stepped_row
            reply[row, : len(ids)], reply_mask[row, : len(ids)] = ids, True
        return TurnOutput(tokens, log_probs, real, reply, reply_mask, reward, stepped, done)

    def __call__(self, params: Any, key: jax.Array) -> Episodes:
        """The episodes (see the class); not jittable: the env runs in Python between calls."""
        if any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves((params, key))):
            raise TypeError(
                f"text env {self.name} is a Python env, stepped on the host: call its rollout "
                "(or the episode trainer's step) outside jax.jit, jax.vmap and jax.grad"
            )
        layout, groups = self.layout, self.batch_size // self.group_size
        keys, resets = turns.rollout_keys(key, layout.max_turns, layout.turn_len, groups)
        states, prompt = self.reset(resets)
        over = np.zeros(self.batch_size, bool)
        outputs: list[TurnOutput] = []
        for turn in range(self.layout.max_turns):
            if turn == 0:
                carry, sampled = self.first_turn(params, prompt, keys[0])
                vocab_size = carry.logits.shape[-1]  # the model's, from its logits' width
                self.check_prompt(prompt, vocab_size)
            elif over.all():
                outputs.append(self.empty_turn())
                continue
            else:
                reply = Tokens(jnp.asarray(outputs[-1].reply), jnp.asarray(outputs[-1].reply_mask))
                carry = carry._replace(over=jnp.asarray(over))
                carry, sampled = self.next_turn(params, carry, reply, jnp.int32(turn), keys[turn])
            output = self.env_turn(states, jax.device_get(sampled), over, turn, vocab_size)
            active = ~over
            over = over | output.terminated | (active & ~output.stepped)
            outputs.append(output)
        stacked = TurnOutput(*(jnp.asarray(np.stack(part)) for part in zip(*outputs, strict=True)))
        return turns.assemble(prompt, stacked)

    def empty_turn(self) -> TurnOutput:
        """A turn no episode plays: what the one-program rollout writes for it."""
        shape = (self.batch_size, self.layout.turn_len)
        reply_shape = (self.batch_size, self.layout.reply_len)
        none = np.zeros(self.batch_size, bool)
        return TurnOutput(
            np.full(shape, self.settings.pad_id, np.int32),
            np.zeros(shape, np.float32),
            np.zeros(shape, bool),
            np.full(reply_shape, self.settings.pad_id, np.int32),
            np.zeros(reply_shape, bool),
            np.zeros(self.batch_size, np.float32),
            none,
            none,
        )


def rollout_host_episodes(
    model: KVCacheHook | PolicyApply,
    params: Any,
    env: Any,
    key: jax.Array,
    batch_size: int,
    settings: EpisodeSettings,
    group_size: int = 1,
    env_name: str | None = None,
) -> Episodes:
    """One call of a ``HostRollout`` (which compiles its pieces; build one to reuse them)."""
    rollout = HostRollout(model, env, batch_size, settings, group_size, env_name)
    return rollout(params, key)
