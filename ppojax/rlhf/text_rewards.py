"""Rewards on text: ``reward(prompts: list[str], responses: list[str], **columns) ->
list[float]``, and the adapter that puts one inside the jitted RLHF step.

``columns`` are the prompt file's other fields for the scored rows (an ``answer`` field, for
example), as TRL passes dataset columns. A function receives only those it takes: a
parameter of that name, or all of them through ``**kwargs``; ``reward(prompts, responses)``
works too.

``text_reward(fn, tokenizer, data)`` turns it into the token-array contract of
``make_trainer``, ``(prompts, prompt_mask, responses, response_mask) -> [B]``, through
``jax.pure_callback``. The callback finds each row's text and columns by its prompt tokens:
the real (mask 1) prompt ids are looked up in a table built once from ``data``, so the
trainer passes nothing beyond the four arrays, repeated groups and any batch drawn from
``data`` resolve alike, and two rows with the same prompt tokens but other columns are an
error when the table is built. The cost: each step copies the prompts [B, P] and responses
[B, R] to the host, decodes each response up to its EOS, runs the Python reward and copies
[B] floats back; the device waits for the host meanwhile (one synchronization per step and
reward function).
"""

from __future__ import annotations

import inspect
import math
import numbers
import re
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.rlhf.data import PromptData

TextReward = Callable[..., Sequence[float]]


def fn_name(fn: Callable[..., Any]) -> str:
    """A reward's name for messages and metrics."""
    return getattr(fn, "__name__", None) or repr(fn)


def columns_taken(fn: TextReward, columns: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
    """The columns ``fn`` takes: all of them with ``**kwargs``, else those its parameters
    name (besides the first two, the prompts and responses)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return dict(columns)
    names = {p.name for p in parameters[2:]}
    return {name: values for name, values in columns.items() if name in names}


def fn_location(fn: Callable[..., Any], error: BaseException) -> str:
    """``fn``'s FILE:LINE for ``error``: the last line of its file in the traceback (where it
    raised), else its ``def`` (a wrong return); "" for a callable without code."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    frames = traceback.extract_tb(error.__traceback__)
    lines = [frame.lineno for frame in frames if frame.filename == code.co_filename]
    return f"{code.co_filename}:{lines[-1] if lines else code.co_firstlineno}"


class RewardFailure(NamedTuple):
    """A text reward's error inside the compiled step: the function, what it raised (or the
    ``ValueError`` its return gave) and its FILE:LINE (``fn_location``)."""

    fn: TextReward
    error: Exception
    where: str


def as_rewards(fn: TextReward, values: Any, count: int) -> np.ndarray:
    """float32 [count] of ``fn``'s output; ``ValueError`` naming ``fn`` for a wrong length, a
    non-number, NaN or an infinity."""
    name = fn_name(fn)
    values = list(np.asarray(values).ravel()) if hasattr(values, "shape") else values
    if not isinstance(values, Sequence) or isinstance(values, (str, bytes)):
        raise ValueError(f"text reward {name} returned {type(values).__name__}; return a list.")
    if len(values) != count:
        raise ValueError(
            f"text reward {name} returned {len(values)} rewards for {count} responses; "
            "return one float per response."
        )
    for index, value in enumerate(values):
        if not isinstance(value, numbers.Real):
            raise ValueError(
                f"text reward {name} returned {value!r} at position {index}, not a number."
            )
        if not math.isfinite(value):  # inf too: its advantage is NaN, and every update skipped
            shown = "NaN" if math.isnan(value) else repr(float(value))
            raise ValueError(f"text reward {name} returned {shown} at position {index}.")
    return np.asarray(values, np.float32)


def call_text_reward(
    fn: TextReward,
    prompts: Sequence[str],
    responses: Sequence[str],
    columns: Mapping[str, Sequence[Any]] | None = None,
) -> np.ndarray:
    """``fn``'s rewards float32 [B] on the host, given the columns it takes; checked."""
    kwargs = columns_taken(fn, columns or {})
    values = fn(list(prompts), list(responses), **{k: list(v) for k, v in kwargs.items()})
    return as_rewards(fn, values, len(responses))


def prompt_table(data: PromptData | Sequence[PromptData]) -> dict[tuple[int, ...], tuple]:
    """Real prompt ids -> (text, {column: value}) for every row; ``ValueError`` for two rows
    with the same ids and different text or columns."""
    table: dict[tuple[int, ...], tuple] = {}
    for part in (data,) if isinstance(data, PromptData) else data:
        tokens, mask = np.asarray(part.tokens), np.asarray(part.mask, bool)
        for row in range(len(part)):
            key = tuple(int(i) for i in tokens[row][mask[row]])
            entry = (part.prompts[row], {n: v[row] for n, v in part.columns.items()})
            if table.setdefault(key, entry) != entry:
                raise ValueError(
                    f"prompts {table[key][0]!r} and {entry[0]!r} have the same tokens but "
                    "different columns; a text reward could not tell them apart."
                )
    return table


def decode_responses(tokenizer: Any, responses: np.ndarray, mask: np.ndarray) -> list[str]:
    """Each response's text: its real tokens (up to and including EOS), special tokens
    skipped (as TRL's ``batch_decode(skip_special_tokens=True)``)."""
    return [
        tokenizer.decode(row[keep], skip_special_tokens=True)
        for row, keep in zip(responses, mask.astype(bool), strict=True)
    ]


def text_reward(
    fn: TextReward,
    tokenizer: Any,
    data: PromptData | Sequence[PromptData],
    failures: list[RewardFailure] | None = None,
) -> Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]:
    """A ``make_trainer`` reward ``(prompts, prompt_mask, responses, response_mask) -> [B]``
    running ``fn`` on decoded text through ``jax.pure_callback`` (see the module for how rows
    are found and what it costs). ``data``: every ``PromptData`` whose prompts it will see
    (the training and held-out parts). Works under ``vmap`` (rows of every batch at once).

    An error of ``fn`` (or a wrong return) raises inside the callback, which XLA reports as a
    long runtime error. With a ``failures`` list it is appended there instead and the rewards
    are NaN (from then on for every call, ``fn`` no longer called), so the host that trains
    can stop at that step with one line: the step's updates are skipped by the divergence
    guard, and its ``rewards/<name>/mean`` is NaN, which no checked reward gives."""
    table = prompt_table(data)

    def host(prompts, prompt_mask, responses, response_mask) -> np.ndarray:
        if failures is None:
            return rewards_on_host(prompts, prompt_mask, responses, response_mask)
        if not failures:
            try:
                return rewards_on_host(prompts, prompt_mask, responses, response_mask)
            except Exception as error:
                failures.append(RewardFailure(fn, error, fn_location(fn, error)))
        return np.full(responses.shape[:-1], np.nan, np.float32)

    def rewards_on_host(prompts, prompt_mask, responses, response_mask) -> np.ndarray:
        lead = responses.shape[:-1]
        prompts = np.asarray(prompts).reshape(-1, prompts.shape[-1])
        prompt_mask = np.asarray(prompt_mask, bool).reshape(prompts.shape)
        responses = np.asarray(responses).reshape(-1, responses.shape[-1])
        entries = []
        for row, keep in zip(prompts, prompt_mask, strict=True):
            key = tuple(int(i) for i in row[keep])
            if key not in table:
                raise ValueError(
                    f"text reward {fn_name(fn)}: a prompt ({tokenizer.decode(list(key))!r}) "
                    "is not in the data given to text_reward; pass every PromptData it sees."
                )
            entries.append(table[key])
        texts = decode_responses(
            tokenizer, responses, np.asarray(response_mask).reshape(responses.shape)
        )
        names = entries[0][1].keys()
        columns = {name: [entry[1][name] for entry in entries] for name in names}
        rewards = call_text_reward(fn, [entry[0] for entry in entries], texts, columns)
        return rewards.reshape(lead)

    def reward(prompts, prompt_mask, responses, response_mask):
        shape = jax.ShapeDtypeStruct(responses.shape[:-1], jnp.float32)
        return jax.pure_callback(
            host, shape, prompts, prompt_mask, responses, response_mask, vmap_method="broadcast_all"
        )

    reward.__name__ = fn_name(fn)
    return reward


# The built-in rewards.

NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
GSM8K = re.compile(r"####\s*(\S+)")


def extract_answer(text: str) -> str | None:
    """The answer in ``text``: what follows GSM8K's ``####`` if present, else the last number;
    commas, a leading ``$`` and a trailing ``.`` removed. None when there is neither."""
    marked = GSM8K.search(text)
    if marked:
        found = marked.group(1)
    else:
        numbers_found = NUMBER.findall(text)
        if not numbers_found:
            return None
        found = numbers_found[-1]
    return found.replace(",", "").lstrip("$").rstrip(".")


def same_answer(found: str | None, expected: str | None) -> bool:
    """Equal as numbers when both parse as numbers, else as strings."""
    if found is None or expected is None:
        return False
    try:
        return float(found) == float(expected)
    except ValueError:
        return found == expected


def exact_match(prompts: list[str], responses: list[str], answer: list[str]) -> list[float]:
    """1.0 where the response's answer (``extract_answer``: ``#### 42``, else the last number)
    equals the ``answer`` column's (a bare ``42`` or a GSM8K solution ending in ``#### 42``)."""
    return [
        float(same_answer(extract_answer(response), extract_answer(str(expected))))
        for response, expected in zip(responses, answer, strict=True)
    ]


def regex_reward(pattern: str, *, full: bool = True, name: str = "regex_format") -> TextReward:
    """1.0 for a response (stripped of surrounding whitespace) that ``pattern`` matches in
    full (``full``) or anywhere, else 0.0; ``.`` matches newlines."""
    compiled = re.compile(pattern, re.DOTALL)
    match = compiled.fullmatch if full else compiled.search

    def format_reward(prompts: list[str], responses: list[str]) -> list[float]:
        return [float(match(response.strip()) is not None) for response in responses]

    format_reward.__name__ = name
    return format_reward


def length_penalty(limit: int, *, name: str = "length_penalty") -> TextReward:
    """0 for responses of at most ``limit`` characters, else -(length - limit) / limit."""
    if not isinstance(limit, int) or limit < 1:
        raise ValueError(f"length_penalty(limit={limit!r}): limit must be an int >= 1.")

    def penalty(prompts: list[str], responses: list[str]) -> list[float]:
        return [-max(0, len(response) - limit) / limit for response in responses]

    penalty.__name__ = name
    return penalty
