"""Text prompts as device arrays: JSONL files, lists of strings or ``datasets`` splits.

    data = load_prompts("prompts.jsonl", tokenizer, chat=True, max_len=64)
    train, held_out = split_held_out(data, held_out=0.1)
    (prompts, prompt_mask), rows = draw_batch(train, key, 16)  # inside jit

A ``PromptData`` is a pytree whose leaves are the left-padded token ids [N, P] and mask
[N, P]; the prompt texts and the file's other fields (``columns``, for text rewards) stay on
the host as the pytree's static part, compared by identity. So it can be an argument of a
jitted function (another ``PromptData`` compiles again) or be closed over (its arrays become
constants of the program). ``draw_batch`` takes rows from the device arrays with no host
round trip.
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

OVERFLOW = ("truncate", "drop", "error")


def read_jsonl_lines(path: str | Path, fields: Sequence[str]) -> list[tuple[str, dict]]:
    """("<path>, line <n>", object) for each non-blank line of a JSON-lines file; each object
    must hold every name of ``fields`` as a string. ``ValueError`` naming the file and line
    for bad JSON, a line that is not an object, a missing or non-string field, and for a
    file without rows."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist; give a JSON-lines file.")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}, line {number}: not valid JSON ({error.msg}).") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}, line {number}: expected a JSON object, got {line!r}.")
        check_fields(row, fields, f"{path}, line {number}")
        rows.append((f"{path}, line {number}", row))
    if not rows:
        raise ValueError(f"{path} is empty: it needs one JSON object per line.")
    return rows


def read_jsonl(path: str | Path, fields: Sequence[str]) -> list[dict[str, Any]]:
    """The objects of a JSON-lines file, checked as ``read_jsonl_lines`` checks them."""
    return [row for _, row in read_jsonl_lines(path, fields)]


def check_fields(row: Mapping[str, Any], fields: Sequence[str], where: str) -> None:
    """``ValueError`` naming ``where`` and the field when one is missing or not a string."""
    for name in fields:
        if name not in row:
            raise ValueError(f"{where}: no field {name!r} (fields: {sorted(row)}).")
        if not isinstance(row[name], str):
            raise ValueError(
                f"{where}: field {name!r} must be a string, got {type(row[name]).__name__}."
            )


def labelled_rows(source: Any, fields: Sequence[str]) -> list[tuple[str, dict]]:
    """(where, row) for each row of a JSONL path, a list of strings (one field only), a list
    of dicts or a ``datasets`` split (any iterable of dicts); each row holds ``fields`` as
    strings. ``where`` names the line or row for error messages."""
    if isinstance(source, (str, Path)):
        return read_jsonl_lines(source, fields)
    rows = list(source)
    if not rows:
        raise ValueError("no rows: the list or split is empty.")
    if len(fields) == 1 and all(isinstance(row, str) for row in rows):
        return [(f"row {index + 1}", {fields[0]: row}) for index, row in enumerate(rows)]
    labelled = []
    for index, row in enumerate(rows):
        if not isinstance(row, Mapping):
            raise ValueError(f"row {index + 1}: expected a dict, got {row!r}.")
        check_fields(row, fields, f"row {index + 1}")
        labelled.append((f"row {index + 1}", dict(row)))
    return labelled


def hf_split(path: str, split: str, **kwargs: Any) -> Any:
    """``datasets.load_dataset(path, split=split, **kwargs)``, imported only here."""
    try:
        import datasets
    except ImportError:
        raise ImportError(
            "Loading a Hugging Face dataset needs the `datasets` package: pip install datasets "
            "(or export the split to JSON lines and give the file)."
        ) from None
    return datasets.load_dataset(path, split=split, **kwargs)


def encode_text(tokenizer: Any, text: str, chat: bool) -> list[int]:
    """Token ids of a prompt. With ``chat`` the text goes through the chat template with the
    generation prompt, then is encoded without adding special tokens (the template writes
    them), as transformers' ``apply_chat_template(tokenize=True)``."""
    if not chat:
        return list(tokenizer.encode(text))
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    return encode_plain(tokenizer, rendered)


def encode_plain(tokenizer: Any, text: str) -> list[int]:
    """Token ids of ``text`` with no special tokens added (a completion, a rendered chat)."""
    return list(tokenizer.encode(text, add_special_tokens=False))


def left_pad(sequences: Sequence[Sequence[int]], width: int, pad_id: int) -> np.ndarray:
    """int32 [N, width], each sequence at the right end, pad_id before it."""
    out = np.full((len(sequences), width), pad_id, np.int32)
    for row, ids in enumerate(sequences):
        if ids:
            out[row, width - len(ids) :] = ids
    return out


def right_pad(sequences: Sequence[Sequence[int]], width: int, pad_id: int) -> np.ndarray:
    """int32 [N, width], each sequence at the left end, pad_id after it."""
    out = np.full((len(sequences), width), pad_id, np.int32)
    for row, ids in enumerate(sequences):
        out[row, : len(ids)] = ids
    return out


class Fitted(NamedTuple):
    """Prompts cut to fit: the kept rows' ids, their indices in the input, and the counts."""

    ids: list[list[int]]
    kept: list[int]
    truncated: int
    dropped: int


# What fit's error suggests (the command line says its own flag instead).
TOO_LONG_FIX = "raise max_len or pass overflow='truncate' or 'drop'."


def fit(
    ids: list[list[int]], max_len: int | None, overflow: str, labels: Sequence[str] = ()
) -> Fitted:
    """Prompts longer than ``max_len`` tokens truncated on the left (the end, where the
    question and the generation prompt are, stays), dropped, or an error naming the row
    (its ``labels`` entry, else ``row <n>``, 1-based)."""
    if overflow not in OVERFLOW:
        raise ValueError(f"overflow={overflow!r} must be one of {OVERFLOW}.")
    if max_len is None:
        return Fitted(ids, list(range(len(ids))), 0, 0)
    kept, out, truncated = [], [], 0
    for index, row in enumerate(ids):
        if len(row) > max_len:
            if overflow == "error":
                where = labels[index] if labels else f"row {index + 1}"
                raise ValueError(
                    f"{where}: the prompt has {len(row)} tokens, more than max_len={max_len}; "
                    f"{TOO_LONG_FIX}"
                )
            if overflow == "drop":
                continue
            row, truncated = row[len(row) - max_len :], truncated + 1
        kept.append(index)
        out.append(row)
    if not out:
        raise ValueError(f"every prompt is longer than max_len={max_len} and was dropped.")
    return Fitted(out, kept, truncated, len(ids) - len(out))


class HostPart:
    """What stays on the host, compared by identity so a ``PromptData`` can cross jit."""

    def __init__(self, prompts: tuple[str, ...], columns: dict[str, tuple]) -> None:
        self.prompts = prompts
        self.columns = columns


@jax.tree_util.register_pytree_node_class
@dataclasses.dataclass(frozen=True, eq=False)
class PromptData:
    """Prompts as arrays: ``tokens`` [N, P] int32 left-padded with pad_id, ``mask`` [N, P];
    on the host, each row's prompt text (before any chat template) and ``columns`` (the
    other fields, name -> a value per row); how many prompts were truncated or dropped."""

    tokens: jax.Array
    mask: jax.Array
    host: HostPart
    truncated: int = 0
    dropped: int = 0

    @property
    def prompts(self) -> tuple[str, ...]:
        return self.host.prompts

    @property
    def columns(self) -> dict[str, tuple]:
        return self.host.columns

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def tree_flatten(self) -> tuple[tuple[jax.Array, jax.Array], tuple]:
        return (self.tokens, self.mask), (self.host, self.truncated, self.dropped)

    @classmethod
    def tree_unflatten(cls, aux: tuple, children: Iterable[jax.Array]) -> PromptData:
        return cls(*children, *aux)


def load_prompts(
    source: Any,
    tokenizer: Any,
    *,
    field: str = "prompt",
    columns: Sequence[str] | None = None,
    chat: bool = False,
    max_len: int | None = None,
    overflow: str = "truncate",
    pad_id: int | None = None,
) -> PromptData:
    """Prompts from ``source`` (a JSONL path, a list of strings or of dicts, a ``datasets``
    split; ``field`` names the prompt) as a ``PromptData``. ``columns``: the other fields
    kept for text rewards (None: every field of the first row). ``chat``: each prompt as a
    user message through the tokenizer's chat template. Prompts over ``max_len`` tokens are
    truncated on the left, dropped or rejected (``overflow``); a warning gives the count."""
    labelled = labelled_rows(source, (field,))
    rows = [row for _, row in labelled]
    names = [name for name in rows[0] if name != field] if columns is None else list(columns)
    for where, row in labelled:
        missing = [name for name in names if name not in row]
        if missing:
            raise ValueError(f"{where}: no field {missing[0]!r} (a column of the prompts).")
    ids = [encode_text(tokenizer, row[field], chat) for row in rows]
    fitted = fit(ids, max_len, overflow, [where for where, _ in labelled])
    if fitted.truncated or fitted.dropped:
        warnings.warn(
            f"{fitted.truncated} prompts truncated and {fitted.dropped} dropped at "
            f"max_len={max_len} tokens.",
            stacklevel=2,
        )
    kept = [rows[index] for index in fitted.kept]
    width = max_len or max(len(ids) for ids in fitted.ids)
    pad = tokenizer.pad_id if pad_id is None else pad_id
    tokens = left_pad(fitted.ids, width, pad)
    mask = left_pad([[1] * len(ids) for ids in fitted.ids], width, 0).astype(bool)
    host = HostPart(
        tuple(row[field] for row in kept),
        {name: tuple(row[name] for row in kept) for name in names},
    )
    return PromptData(
        jnp.asarray(tokens), jnp.asarray(mask), host, fitted.truncated, fitted.dropped
    )


def split_held_out(data: Any, held_out: int | float, seed: int = 0) -> tuple[Any, Any]:
    """(train, held-out) rows of ``data`` (a ``PromptData``, or any pytree of [N, ...] arrays
    such as a ``PairData``), shuffled by ``seed``; ``held_out`` is a count or a fraction in
    (0, 1). Both parts keep at least one row, each in its original order."""
    count = leading_rows(data)
    size = round(held_out * count) if isinstance(held_out, float) else held_out
    if not 0 < size < count:
        raise ValueError(
            f"held_out={held_out!r} leaves {count - size} of {count} rows for training; "
            "give a count or fraction that leaves at least one in each part."
        )
    order = np.random.default_rng(seed).permutation(count)
    return take_rows(data, np.sort(order[size:])), take_rows(data, np.sort(order[:size]))


def take_rows(data: Any, rows: np.ndarray) -> Any:
    """The given rows (host indices) of a ``PromptData``, arrays and host lists alike, or of
    every leaf of a pytree of [N, ...] arrays."""
    if not isinstance(data, PromptData):
        return jax.tree.map(lambda leaf: leaf[rows], data)
    host = HostPart(
        tuple(data.prompts[i] for i in rows),
        {name: tuple(values[i] for i in rows) for name, values in data.columns.items()},
    )
    return PromptData(data.tokens[rows], data.mask[rows], host, 0, 0)


def leading_rows(data: Any) -> int:
    """N, the leading axis every array leaf of ``data`` shares."""
    sizes = {leaf.shape[0] for leaf in jax.tree.leaves(data)}
    if len(sizes) != 1:
        raise ValueError(f"the arrays of the data differ in their number of rows: {sizes}.")
    return sizes.pop()


def draw_batch(data: Any, key: jax.Array, batch_size: int) -> tuple[Any, jax.Array]:
    """``batch_size`` distinct rows, uniformly at random, of any pytree of [N, ...] arrays (a
    ``PromptData``, a ``PairData``): (its arrays at those rows, the rows [B] int32). For a
    ``PromptData`` the arrays are (tokens [B, P], mask [B, P]). Pure and jittable."""
    count = leading_rows(data)
    if not 0 < batch_size <= count:
        raise ValueError(f"batch_size={batch_size} must be in [1, {count}], the rows of the data.")
    rows = jax.random.permutation(key, count)[:batch_size]
    arrays = (data.tokens, data.mask) if isinstance(data, PromptData) else data
    return jax.tree.map(lambda leaf: leaf[rows], arrays), rows


class Encoding(NamedTuple):
    """How examples become tokens: the prompt through the chat template (``chat``), and what
    an example over ``max_len`` prompt or ``max_response_len`` response tokens meets
    (``overflow``)."""

    chat: bool = False
    max_len: int | None = None
    max_response_len: int | None = None
    overflow: str = "truncate"


def fit_example(
    prompt: list[int], responses: list[list[int]], limits: tuple, where: str, overflow: str
) -> tuple[list[int], list[list[int]], bool] | None:
    """One example within (max_len, max_response_len): (prompt, responses, whether they were
    cut: the prompt on the left, responses on the right), None (dropped) or an error naming
    ``where``."""
    max_len, max_response_len = limits
    long_prompt = max_len is not None and len(prompt) > max_len
    long_response = max_response_len is not None and max(map(len, responses)) > max_response_len
    if not (long_prompt or long_response):
        return prompt, responses, False
    if overflow == "error":
        raise ValueError(
            f"{where}: {len(prompt)} prompt and {max(map(len, responses))} response tokens, "
            f"over max_len={max_len} / max_response_len={max_response_len}; raise them or "
            "pass overflow='truncate' or 'drop'."
        )
    if overflow == "drop":
        return None
    prompt = prompt[len(prompt) - max_len :] if long_prompt else prompt
    return prompt, [r[:max_response_len] if long_response else r for r in responses], True


def encode_examples(
    labelled: list[tuple[str, dict]], tokenizer: Any, fields: Sequence[str], encoding: Encoding
) -> tuple[jax.Array, ...]:
    """Device arrays of (where, row) examples whose ``fields`` are a prompt and one or more
    responses (SFT completions, preference pairs): ``prompts`` [N, P] left-padded as
    ``load_prompts`` encodes them, ``prompt_mask`` [N, P], then per response field its tokens
    [N, R] (the text's ids, no special tokens added, then the tokenizer's EOS; right-padded
    with pad_id) and mask [N, R] (True on the text and its EOS), one R for all fields.
    Examples over the limits are cut, dropped or rejected (``overflow``); a warning gives the
    count."""
    chat, max_len, max_response_len, overflow = encoding
    if overflow not in OVERFLOW:
        raise ValueError(f"overflow={overflow!r} must be one of {OVERFLOW}.")
    limits, eos = (max_len, max_response_len), tokenizer.eos_id
    prompt_field, response_fields = fields[0], fields[1:]
    prompts, responses, truncated = [], [], 0
    for where, row in labelled:
        prompt = encode_text(tokenizer, row[prompt_field], chat)
        answers = [encode_plain(tokenizer, row[name]) + [eos] for name in response_fields]
        fitted = fit_example(prompt, answers, limits, where, overflow)
        if fitted is not None:
            prompts.append(fitted[0])
            responses.append(fitted[1])
            truncated += fitted[2]
    if not prompts:
        raise ValueError("every example is over the length limits and was dropped.")
    dropped = len(labelled) - len(prompts)
    if truncated or dropped:
        warnings.warn(
            f"{truncated} examples truncated and {dropped} dropped at max_len={max_len}, "
            f"max_response_len={max_response_len} tokens.",
            stacklevel=2,
        )
    width = max_len or max(map(len, prompts))
    pad = tokenizer.pad_id
    # one width for every response field, so chosen and rejected stack into one batch
    length = max_response_len or max(len(r) for answers in responses for r in answers)
    columns = []
    for index in range(len(response_fields)):
        ids = [answers[index] for answers in responses]
        mask = right_pad([[1] * len(r) for r in ids], length, 0).astype(bool)
        columns += [right_pad(ids, length, pad), mask]
    prompt_mask = left_pad([[1] * len(p) for p in prompts], width, 0).astype(bool)
    return tuple(map(jnp.asarray, (left_pad(prompts, width, pad), prompt_mask, *columns)))
