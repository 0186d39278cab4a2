"""A sum too long to do by heart, and a calculator to call: a Python text env with a tool
(id "calculator"), stepped on the host (``host``).

The env draws two numbers of ``num_digits`` digits each (no leading zero, any size: Python
ints). The prompt is the text "a+b". Each turn the model writes text and ends it; the env
reads the turn's text, surrounding whitespace ignored:

    "x+y="  a tool call (x, y of 1 to num_digits digits): the reply is the tool's text,
            tool("x+y"); the calculator's tool ``add`` returns the sum's digits
    "n"     digits only: the answer; reward 1 if n = a + b, else 0, and the episode is over
    else    the reply "?"

So the model that calls the tool with the prompt's sum and copies the reply wins in two turns.
A tool is any function of text that returns text; one that raises or returns another type
stops the rollout with an error naming the tool (and where it is defined), the env, the turn
and the episode.

The rules are on text (``reset_text``, ``step_text``), in two sets of tokens:

- its own characters (``Calculator``'s ``reset`` and ``step``): PAD, BOS, EOS, then
  "0123456789+=?"; the prompt is BOS then "a+b", a turn ends at EOS;
- a model's tokenizer and chat template (``calculator(num_digits, chat=ChatFormat(...))``, a
  ``host.ChatEnv``): "a+b" is the user's message, a turn ends at the template's end-of-turn
  token, and the replies are written as the template writes a tool's (``chat``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import NamedTuple

import jax
import numpy as np

from ppojax.rlhf.envs.chat import ChatFormat
from ppojax.rlhf.envs.host import ChatEnv, PythonTextEnv, ToolError, call_tool

PAD = 0
BOS = 1
EOS = 2
CHARS = "0123456789+=?"
FIRST_CHAR = 3
VOCAB_SIZE = FIRST_CHAR + len(CHARS)
UNKNOWN = "\N{REPLACEMENT CHARACTER}"  # what an id outside CHARS decodes to


def encode(text: str) -> list[int]:
    """The ids of ``text``; a ``ValueError`` for a character outside CHARS."""
    unknown = sorted(set(text) - set(CHARS))
    if unknown:
        raise ValueError(f"the calculator's tokens spell {CHARS!r} only, not {unknown}")
    return [FIRST_CHAR + CHARS.index(char) for char in text]


def decode(ids: list[int]) -> str:
    """The text of ``ids`` before the first EOS (ids outside CHARS read as U+FFFD)."""
    text = []
    for i in ids:
        if i == EOS:
            break
        index = i - FIRST_CHAR
        text.append(CHARS[index] if 0 <= index < len(CHARS) else UNKNOWN)
    return "".join(text)


def add(expression: str) -> str:
    """The calculator's tool: "x+y" (decimal digits) -> the digits of x + y."""
    left, right = expression.split("+")
    return str(int(left) + int(right))


class Sum(NamedTuple):
    """An episode's state: the two numbers."""

    a: int
    b: int


class Calculator(PythonTextEnv):
    """The env of the module: sums of two ``num_digits``-digit numbers, ``tool`` (named
    ``tool_name`` in errors) answering calls."""

    # The vocabulary a model for this env needs: the character tokens above.
    vocab_size = VOCAB_SIZE
    pad_id = PAD
    eos_id = EOS
    # A success is a right answer: the return it brings.
    success_return = 1.0

    def __init__(
        self,
        num_digits: int = 6,
        tool: Callable[[str], str] = add,
        tool_name: str = "add",
    ) -> None:
        if not isinstance(num_digits, int) or isinstance(num_digits, bool) or num_digits < 1:
            raise ValueError(f"Calculator.num_digits must be an int >= 1, got {num_digits!r}")
        self.num_digits, self.tool, self.tool_name = num_digits, tool, tool_name
        self.prompt_len = 2 * num_digits + 2  # BOS, a, "+", b
        self.reply_len = num_digits + 1  # a sum of two calls' operands
        self.call = re.compile(rf"(\d{{1,{num_digits}}})\+(\d{{1,{num_digits}}})=")

    def reset_text(self, key: jax.Array) -> tuple[Sum, str]:
        """Two numbers drawn from ``key``; the prompt's text "a+b"."""
        rng = np.random.default_rng(np.asarray(jax.random.key_data(key)).tolist())
        a, b = (self.draw(rng) for _ in range(2))
        return Sum(a, b), f"{a}+{b}"

    def reset(self, key: jax.Array) -> tuple[Sum, list[int]]:
        """``reset_text`` in the calculator's characters: BOS "a+b"."""
        state, text = self.reset_text(key)
        return state, [BOS, *encode(text)]

    def draw(self, rng: np.random.Generator) -> int:
        digits = [int(rng.integers(1, 10)), *rng.integers(0, 10, self.num_digits - 1)]
        return int("".join(str(d) for d in digits))

    def step_text(self, state: Sum, text: str) -> tuple[Sum, str, float, bool]:
        """The reply to a turn's text (see the module), its reward and whether the episode is
        over."""
        text = text.strip()
        if self.call.fullmatch(text):
            result = call_tool(self.tool_name, self.tool, text[:-1])
            if len(result) > self.num_digits + 1:
                raise ToolError(
                    f"tool {self.tool_name!r} returned {len(result)} characters, more than the "
                    f"sum of two {self.num_digits}-digit numbers has, {self.num_digits + 1} "
                    f"(input {text[:-1]!r})"
                )
            return state, result, 0.0, False
        if text.isdecimal():
            return state, "", float(int(text) == state.a + state.b), True
        return state, "?", 0.0, False

    def step(self, state: Sum, response: list[int]) -> tuple[Sum, list[int], float, bool]:
        """``step_text`` in the calculator's characters."""
        state, reply, reward, done = self.step_text(state, decode(response))
        try:
            ids = encode(reply)
        except ValueError as error:  # only a tool's result can hold other characters
            raise ToolError(f"tool {self.tool_name!r} returned {reply!r}: {error}") from None
        return state, ids, reward, done

    def through_chat(self, chat: ChatFormat) -> ChatEnv:
        """This env in a model's tokens, through ``chat`` (see the module); its widths hold
        the longest prompt and reply at a token per byte."""
        prompt_len, reply_len = chat.widths(2 * self.num_digits + 1, self.num_digits + 1)
        return ChatEnv(self, chat, prompt_len, reply_len)


def calculator(num_digits: int = 6, chat: ChatFormat | None = None) -> Calculator | ChatEnv:
    """The "calculator" id's factory: in the calculator's characters, or through ``chat``."""
    env = Calculator(num_digits)
    return env if chat is None else env.through_chat(chat)
