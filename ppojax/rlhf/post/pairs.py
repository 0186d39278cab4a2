"""Chosen/rejected pairs, what DPO and a Bradley-Terry reward model learn from: the data as
arrays, read from JSON lines or a list of dicts, and the metrics both report on a pair.

    pairs = load_pairs("pairs.jsonl", lm.tokenizer)  # fields prompt, chosen, rejected
    batch, _ = draw_batch(pairs, key, 8)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from ppojax.rlhf.core.sampling import Sequences
from ppojax.rlhf.data import Encoding, encode_examples, labelled_rows

PAIR_FIELDS = ("prompt", "chosen", "rejected")


class PairData(NamedTuple):
    """Preference pairs as arrays: ``prompts`` [N, P] left-padded and ``prompt_mask``; the
    chosen and rejected responses [N, R] right-padded with pad_id, each with its mask (True
    on the text and its EOS)."""

    prompts: jax.Array
    prompt_mask: jax.Array
    chosen: jax.Array
    chosen_mask: jax.Array
    rejected: jax.Array
    rejected_mask: jax.Array

    @property
    def chosen_sequences(self) -> Sequences:
        return Sequences(self.prompts, self.prompt_mask, self.chosen, self.chosen_mask)

    @property
    def rejected_sequences(self) -> Sequences:
        return Sequences(self.prompts, self.prompt_mask, self.rejected, self.rejected_mask)


def load_pairs(
    source: Any,
    tokenizer: Any,
    *,
    fields: tuple[str, str, str] = PAIR_FIELDS,
    chat: bool = False,
    max_len: int | None = None,
    max_response_len: int | None = None,
    overflow: str = "truncate",
) -> PairData:
    """Pairs from a JSONL path or a list of dicts with the (prompt, chosen, rejected)
    ``fields``; ``ValueError`` naming the line for identical chosen and rejected texts (they
    carry no preference). Encoding and length limits as ``data.encode_examples``."""
    labelled = labelled_rows(source, fields)
    _, chosen, rejected = fields
    for where, row in labelled:
        if row[chosen] == row[rejected]:
            raise ValueError(
                f"{where}: {chosen!r} and {rejected!r} are the same text; a pair must differ."
            )
    encoding = Encoding(chat, max_len, max_response_len, overflow)
    return PairData(*encode_examples(labelled, tokenizer, fields, encoding))


def preference_metrics(chosen: jax.Array, rejected: jax.Array) -> dict[str, jax.Array]:
    """TRL's names: the implicit rewards' means, their margin and how often chosen wins."""
    return {
        "rewards/chosen": chosen.mean(),
        "rewards/rejected": rejected.mean(),
        "rewards/margins": (chosen - rejected).mean(),
        "rewards/accuracies": (chosen > rejected).mean(),
    }
