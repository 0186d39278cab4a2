"""Folders written by ``save_pretrained`` load in transformers and compute what ppojax computes.

Needs torch and transformers beside ppojax, so it runs outside CI:

    python3 -m venv /tmp/hfvenv && /tmp/hfvenv/bin/pip install torch transformers -e .
    /tmp/hfvenv/bin/python benchmarks/hf_reload.py

For each tiny checkpoint of tests/fixtures/hf (Llama, Mistral, Qwen2, Qwen3, Gemma 2 and 3,
GPT-2): load it
with ``from_pretrained``, move every parameter by random noise (so a save that wrote the
original tensors back would be caught), save the result with ``save_pretrained``, and load
that folder with transformers' ``AutoModelForCausalLM`` and ``AutoTokenizer``. Compared: the
float32 logits at the real tokens of a left-padded batch, the greedy continuations (8 tokens),
and the encodings of a few strings. Writes benchmarks/results/hf_reload.json.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch
import transformers
from common import RESULTS, ROOT, record, write_json

from ppojax.rlhf import from_pretrained, generate, save_pretrained

FIXTURES = ROOT / "tests" / "fixtures" / "hf"
RESULT = RESULTS / "hf_reload.json"
NAMES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gpt2")
STRINGS = ["hello world", "the lazy dog jumps", "héllo 你好 🙂 café"]
NEW_TOKENS = 8


def left_padded(ids: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    length = max(map(len, ids))
    tokens = np.full((len(ids), length), pad_id, np.int64)
    mask = np.zeros((len(ids), length), bool)
    for row, sequence in enumerate(ids):
        tokens[row, length - len(sequence) :] = sequence
        mask[row, length - len(sequence) :] = True
    return tokens, mask


def check(name: str, out: Path) -> dict:
    lm = from_pretrained(FIXTURES / name)
    keys = iter(jax.random.split(jax.random.key(0), len(jax.tree.leaves(lm.params))))
    moved = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(next(keys), x.shape), lm.params)
    folder = save_pretrained(lm, moved, out / name)

    ids = [lm.tokenizer.encode(text) for text in STRINGS]
    tokens, mask = left_padded(ids, lm.tokenizer.pad_id)
    ours = np.asarray(lm.policy_apply(moved, jnp.asarray(tokens), jnp.asarray(mask)))
    greedy = generate(
        lm,
        moved,
        jnp.asarray(tokens),
        jnp.asarray(mask),
        jax.random.key(1),
        NEW_TOKENS,
        temperature=0.0,
    )

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    with torch.no_grad():
        # positions count real tokens, as generate() and ppojax number them (a forward call
        # would otherwise number the padding too, which moves GPT-2's learned positions)
        positions = torch.tensor(np.maximum(mask.cumsum(-1) - 1, 0))
        theirs = model(
            input_ids=torch.tensor(tokens),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            position_ids=positions,
        ).logits.numpy()
        their_greedy = model.generate(
            input_ids=torch.tensor(tokens),
            attention_mask=torch.tensor(mask.astype(np.int64)),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=lm.tokenizer.pad_id,
        )[:, tokens.shape[1] :].numpy()
    # transformers stops a row at EOS and pads after it, as generate does here; a row that
    # stopped early comes back shorter when every row did
    their_greedy = np.pad(
        their_greedy,
        ((0, 0), (0, NEW_TOKENS - their_greedy.shape[1])),
        constant_values=lm.tokenizer.pad_id,
    )
    difference = np.abs(ours - theirs)[mask]
    return {
        "max_abs_logit_difference": float(difference.max()),
        "logit_scale": float(np.abs(theirs[mask]).max()),
        "greedy_equal": bool((np.asarray(greedy) == their_greedy).all()),
        "encodings_equal": all(
            tokenizer.encode(text) == lm.tokenizer.encode(text) for text in STRINGS
        ),
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        report = {name: check(name, Path(out)) for name in NAMES}
    for name, row in report.items():
        print(name, row)
    result = {
        "benchmark": "hf_reload",
        **record(__file__, sys.argv[1:], "torch", "transformers"),
        "models": report,
    }
    write_json(RESULT, result)
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()
