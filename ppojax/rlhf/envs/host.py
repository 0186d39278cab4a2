"""Text environments and tools written in plain Python, run on the host between compiled turns.

A ``PythonTextEnv`` has the interface of a JAX text env (``env``) on Python values, one
episode per call:

    state, prompt = env.reset(key)       # prompt: a list of at most prompt_len token ids
    state, reply, reward, done = env.step(state, response)
    # response: the turn's token ids (a list; its EOS included when emitted);
    # reply: a list of at most reply_len ids; reward: a float; done: a bool

The trainer plays such an env through ``ppojax.rlhf.core.host_rollout.HostRollout``
(``rollout_episodes`` picks it), a compiled call per turn and the env stepped here on the
host. What the env raises or returns wrongly (an id past the model's vocabulary, a reward not
finite, at any turn) becomes a ``HostEnvError`` naming the env, the turn and the episode, and
for what it raised, the file and line of the env's code that raised (``env_raised_at``).

``ChatEnv(env, chat, prompt_len, reply_len)`` is a Python env over text, its tokens a model's
own (``chat`` a ``chat.ChatFormat``), its success the text env's (``success``,
``success_return``): ``env.reset_text(key)`` gives the state and the prompt (a
str, one user message, or a list of messages); ``env.step_text(state, text)`` gets the decoded
text of the model's turn (before its end-of-turn token) and returns the state, the reply text,
the reward and ``done``. The prompt and each reply go through the chat template
(``ChatFormat.prompt_ids``, ``reply_ids``: the template's text between the model's end-of-turn
and the next assistant header, the reply inside it in the ``tool`` role or the ``user`` one).
A final reply (``done``) is not rendered: the episode ends at the model's end-of-turn. Its
cost beyond a token env's: a decode of each turn, and a render of the conversation so far and
an encode of the piece for each reply, on the host.

A tool is a function of text that returns text, called through ``call_tool``: what it raises
stops the rollout (no reply stands in for it), as a ``ToolError`` naming the tool, the file
and line it is defined at, the line that raised and the input; so does a result not a str.
"""

from __future__ import annotations

import functools
import inspect
import sysconfig
import traceback
from typing import Any, NamedTuple

import jax

from ppojax.rlhf.envs.chat import ChatFormat, assistant


class HostEnvError(RuntimeError):
    """A Python text env (or a tool it calls) that raised or returned something wrong."""


class ToolError(Exception):
    """A tool (a function of text that returns text) that raised or returned a non-str."""


def defined_at(tool: Any) -> str:
    """Where a tool is defined, as ``' (defined at FILE:LINE)'``, for a Python function, a
    partial of one or an object whose class defines ``__call__``; empty for a builtin."""
    func = inspect.unwrap(tool)
    while isinstance(func, functools.partial):
        func = func.func
    code = getattr(func, "__code__", None) or getattr(type(func).__call__, "__code__", None)
    return f" (defined at {code.co_filename}:{code.co_firstlineno})" if code else ""


def raised_at(error: BaseException) -> str:
    """The line that raised ``error`` below its catcher, as ``' at FILE:LINE'``; empty where
    that is the catcher's own line (a builtin tool)."""
    frames = traceback.extract_tb(error.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if len(frames) > 1 else ""


# Python's own and installed packages' code: not where an env's bug is.
LIBRARY_DIRS = tuple(
    {sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")}
)


def env_raised_at(error: BaseException) -> str:
    """Where the env's code raised ``error``, as ``' at FILE:LINE'``: the innermost frame
    below its catcher outside Python's and installed packages' code and outside this module
    (the ``ChatEnv`` wrapper), else the innermost; empty where there is none, or for a
    ``ToolError``, which names the tool's own line."""
    if isinstance(error, ToolError):
        return ""
    frames = traceback.extract_tb(error.__traceback__)[1:]
    own = [
        frame
        for frame in frames
        if not frame.filename.startswith(LIBRARY_DIRS) and frame.filename != __file__
    ]
    frame = (own or frames or [None])[-1]
    return f" at {frame.filename}:{frame.lineno}" if frame else ""


def call_tool(name: str, tool: Any, text: str) -> str:
    """``tool(text)``, which must be a str; a ``ToolError`` naming the tool, where it is
    defined, the line that raised and its input for anything it raises or another type."""
    try:
        result = tool(text)
    except Exception as error:
        raise ToolError(
            f"tool {name!r}{defined_at(tool)} raised {type(error).__name__}{raised_at(error)}: "
            f"{error} (input {text!r})"
        ) from error
    if not isinstance(result, str):
        raise ToolError(
            f"tool {name!r}{defined_at(tool)} returned {type(result).__name__}, not str "
            f"(input {text!r})"
        )
    return result


class PythonTextEnv:
    """The base of a text env in plain Python (see the module); subclasses set
    ``prompt_len`` and ``reply_len`` and write ``reset`` and ``step``."""

    runs_on_host = True
    prompt_len: int
    reply_len: int

    def reset(self, key: jax.Array) -> tuple[Any, list[int]]:
        raise NotImplementedError

    def step(self, state: Any, response: list[int]) -> tuple[Any, list[int], float, bool]:
        raise NotImplementedError


class ChatState(NamedTuple):
    """A ``ChatEnv`` episode's state: the text env's own and the conversation so far."""

    inner: Any
    messages: tuple[dict[str, Any], ...]


class ChatEnv(PythonTextEnv):
    """The text env ``env`` (``reset_text``, ``step_text``) through ``chat``'s template, in
    ``prompt_len`` and ``reply_len`` tokens (see the module); the model's turns end at
    ``eos_id``, the template's end-of-turn."""

    def __init__(self, env: Any, chat: ChatFormat, prompt_len: int, reply_len: int) -> None:
        self.env, self.chat = env, chat
        self.prompt_len, self.reply_len = prompt_len, reply_len
        self.eos_id = chat.eot_id
        self.env_name = f"{type(env).__name__} (chat template)"
        for name in ("success", "success_return"):  # the text env's own rule of success
            if getattr(env, name, None) is not None:
                setattr(self, name, getattr(env, name))

    def reset(self, key: jax.Array) -> tuple[ChatState, list[int]]:
        """The text env's state and prompt, the prompt rendered up to the first assistant
        header."""
        inner, prompt = self.env.reset_text(key)
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        messages = tuple(dict(message) for message in prompt)
        return ChatState(inner, messages), self.chat.prompt_ids(messages)

    def step(
        self, state: ChatState, response: list[int]
    ) -> tuple[ChatState, list[int], float, bool]:
        """The text env's step on the turn's text; its reply rendered after the turn."""
        text, ended = self.chat.turn_text(response)
        inner, reply, reward, done = self.env.step_text(state.inner, text)
        if not isinstance(reply, str):
            raise TypeError(f"step_text() must return its reply as str, got {type(reply).__name__}")
        messages = (*state.messages, assistant(text))
        if done:
            return ChatState(inner, messages), [], reward, done
        ids = self.chat.reply_ids(messages, reply, ended)
        if len(ids) > self.reply_len:
            raise ValueError(
                f"the reply {reply!r:.60} takes {len(ids)} tokens through the chat template, "
                f"more than the env's reply_len {self.reply_len}"
            )
        messages = (*messages, {"role": self.chat.reply_role, "content": reply})
        return ChatState(inner, messages), ids, reward, done


def runs_on_host(env: Any) -> bool:
    """Whether ``env`` is a Python env, stepped on the host."""
    return bool(getattr(env, "runs_on_host", False))
