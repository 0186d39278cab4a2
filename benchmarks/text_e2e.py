"""Post-training on text end to end, offline: a Llama-architecture model made from nothing
learns two-digit addition ('What is 12+7?' -> '19') by SFT, then GRPO with the exact-match
reward and, apart, DPO on pairs it sampled itself both raise its held-out accuracy.

    python benchmarks/text_e2e.py                      # 4 seeds: results/text_e2e.json, .png
    /tmp/hfvenv/bin/python benchmarks/text_e2e.py      # the same, plus transformers' reload
    python benchmarks/text_e2e.py --seeds 1 --out /tmp/e2e.json   # one seed, elsewhere
    python benchmarks/text_e2e.py --plot-only          # redraw text_e2e.png from the JSON

Each seed, every step through the public API or the ``ppojax`` commands:

1. a Hugging Face folder: a character-level tokenizer (``tokenizers``) and a randomly
   initialised 2-layer Llama (config.json, model.safetensors);
2. ``ppojax sft`` on the training problems, stopped early so that greedy held-out accuracy
   lands between 0 and 1 (RL has room to raise it);
3. ``from_pretrained`` of the SFT folder: greedy held-out accuracy (``generate`` at
   temperature 0, scored by ``exact_match``);
4. ``ppojax rlhf --algorithm grpo --reward ppojax.rlhf.text_rewards:exact_match`` from the
   SFT folder;
5. ``ppojax dpo`` from the SFT folder on pairs sampled from it (temperature 1) on training
   prompts and labelled by ``exact_match``: a correct response chosen, a wrong one rejected;
6. each final folder (``final/`` of the run) loaded back and scored on the same held-out
   problems, which no stage trains on; where torch and transformers import, transformers
   loads the GRPO and DPO folders and its greedy answers are compared token by token.

The held-out problems (256 of the 10,000 sums a+b, 0 <= a, b <= 99) are the same for every
seed; the seed sets the initialisation, the SFT batches, the samples and the RL steps.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from common import RESULTS, add_size_flags, moving_mean, pyplot, record, with_size_flags, write_json
from tokenizers import Tokenizer, decoders, models

from ppojax.cli import main as ppojax_main
from ppojax.rlhf import exact_match, from_pretrained, generate, load_prompts
from ppojax.rlhf.models import Decoder, read_config
from ppojax.rlhf.models.weights import save_params

RESULT = RESULTS / "text_e2e.json"
SPECIAL = ("<pad>", "<s>", "</s>", "<unk>")
CHARS = "0123456789+? Whatis"
RESPONSE_LEN = 5  # "198" and EOS, with one to spare
STAGES = ("sft", "grpo", "dpo")


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The model, the data and each stage's steps."""

    hidden: int = 128
    layers: int = 2
    heads: int = 4
    intermediate: int = 256
    held_out: int = 256
    sft_steps: int = 450
    sft_batch: int = 64
    sft_lr: float = 1e-3
    grpo_steps: int = 100
    grpo_batch: int = 32
    group_size: int = 8
    grpo_lr: float = 2e-4
    kl_coef: float = 0.01
    dpo_prompts: int = 1024  # training prompts sampled for pairs
    dpo_samples: int = 4  # responses per prompt
    dpo_steps: int = 100
    dpo_batch: int = 32
    dpo_lr: float = 3e-5
    dpo_beta: float = 1.0
    # a prompt with no correct sample pairs the answer (chosen) with a wrong sample: only
    # for the CI test, whose untrained model samples no correct answer
    gold_fallback: bool = False


# The CI test's sizes: every stage runs, nothing is expected to learn.
TOY = Sizes(
    hidden=32,
    layers=1,
    heads=2,
    intermediate=64,
    held_out=16,
    sft_steps=4,
    sft_batch=8,
    grpo_steps=2,
    grpo_batch=4,
    group_size=2,
    dpo_prompts=32,
    dpo_samples=2,
    dpo_steps=2,
    dpo_batch=2,
    gold_fallback=True,
)


def problems(held_out: int) -> tuple[list[dict], list[dict]]:
    """(training, held-out) rows {"prompt", "answer"} of every a+b, 0 <= a, b <= 99, split
    by a fixed shuffle (the same for every seed)."""
    rows = [
        {"prompt": f"What is {a}+{b}?", "answer": str(a + b)}
        for a in range(100)
        for b in range(100)
    ]
    order = np.random.default_rng(0).permutation(len(rows))
    shuffled = [rows[i] for i in order]
    return shuffled[held_out:], shuffled[:held_out]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def write_tokenizer(out: Path) -> int:
    """A character-level tokenizer (BPE with no merges) in ``out``; its vocabulary size."""
    vocab = {token: index for index, token in enumerate([*SPECIAL, *CHARS])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.add_special_tokens(list(SPECIAL))
    tokenizer.decoder = decoders.Fuse()
    tokenizer.save(str(out / "tokenizer.json"))
    settings = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "pad_token": "<pad>",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 32,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2) + "\n")
    return len(vocab)


def make_model(out: Path, sizes: Sizes, seed: int) -> Path:
    """A Hugging Face Llama folder in ``out``: the tokenizer, config.json and random params."""
    out.mkdir(parents=True, exist_ok=True)
    vocab_size = write_tokenizer(out)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": sizes.hidden,
        "intermediate_size": sizes.intermediate,
        "num_hidden_layers": sizes.layers,
        "num_attention_heads": sizes.heads,
        "num_key_value_heads": sizes.heads,
        "head_dim": sizes.hidden // sizes.heads,
        "hidden_act": "silu",
        "max_position_embeddings": 32,
        "rms_norm_eps": 1e-6,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "pad_token_id": SPECIAL.index("<pad>"),
        "bos_token_id": SPECIAL.index("<s>"),
        "eos_token_id": SPECIAL.index("</s>"),
        "dtype": "float32",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokens = jnp.zeros((1, 1), jnp.int32)
    params = Decoder(read_config(out)).init(jax.random.key(seed), tokens, jnp.ones((1, 1), bool))
    save_params(params["params"], read_config(out), out / "model.safetensors")
    return out


def command(argv: list[str], out: Path) -> Path:
    """``ppojax <argv> --out out``; the run folder it made."""
    status = ppojax_main([*argv, "--out", str(out), "--no-progress"])
    if status != 0:
        raise RuntimeError(f"ppojax {shlex.join(argv)} exited with status {status}")
    (run_dir,) = [path for path in out.iterdir() if path.is_dir()]
    return run_dir


class Answers:
    """Responses of the model folders that share ``model``'s architecture and tokenizer,
    through one compiled ``generate`` per batch shape and temperature."""

    def __init__(self, model: Path) -> None:
        self.lm = from_pretrained(model)
        self.generate = jax.jit(functools.partial(generate, self.lm), static_argnums=(4, 5))

    def respond(
        self, model: Path, prompts: list[str], key: jax.Array, temperature: float
    ) -> tuple[np.ndarray, list[str]]:
        """The response ids [N, RESPONSE_LEN] of the folder ``model`` and their text."""
        tokenizer = self.lm.tokenizer
        params = from_pretrained(model).params
        data = load_prompts(prompts, tokenizer, pad_id=tokenizer.pad_id)
        ids = self.generate(params, data.tokens, data.mask, key, RESPONSE_LEN, temperature)
        ids = np.asarray(ids)
        return ids, [tokenizer.decode(row, skip_special_tokens=True) for row in ids]

    def greedy(self, model: Path, rows: list[dict]) -> tuple[np.ndarray, list[str], np.ndarray]:
        """Greedy response ids and text for ``rows``' prompts, and each one's exact match."""
        ids, texts = self.respond(model, [r["prompt"] for r in rows], jax.random.key(0), 0.0)
        return ids, texts, np.asarray(exact_match([], texts, [r["answer"] for r in rows]))

    def pairs(
        self, model: Path, rows: list[dict], samples: int, seed: int, gold_fallback: bool = False
    ) -> list[dict]:
        """One {"prompt", "chosen", "rejected"} per prompt of ``rows`` whose ``samples``
        responses (temperature 1) hold a correct one and a wrong one, as ``exact_match``
        says (with ``gold_fallback``, the answer stands in for a missing correct one)."""
        prompts = [row["prompt"] for row in rows for _ in range(samples)]
        _, texts = self.respond(model, prompts, jax.random.key(seed), 1.0)
        scores = exact_match([], texts, [row["answer"] for row in rows for _ in range(samples)])
        pairs = []
        for index, row in enumerate(rows):
            group = range(index * samples, (index + 1) * samples)
            right = [texts[i] for i in group if scores[i] == 1.0]
            wrong = [texts[i] for i in group if scores[i] == 0.0 and texts[i] not in right]
            if gold_fallback and not right:
                right = [row["answer"]]
                wrong = [text for text in wrong if text != row["answer"]]
            if right and wrong:
                pairs.append({"prompt": row["prompt"], "chosen": right[0], "rejected": wrong[0]})
        return pairs


def run_seed(seed: int, sizes: Sizes, root: Path) -> dict[str, Any]:
    """The whole pipeline for one seed in ``root``: accuracies, pair counts, times, folders."""
    root.mkdir(parents=True, exist_ok=True)
    train, held = problems(sizes.held_out)
    sft_file = write_jsonl(
        root / "sft.jsonl", [{"prompt": r["prompt"], "completion": r["answer"]} for r in train]
    )
    prompt_file = write_jsonl(root / "prompts.jsonl", train)
    write_jsonl(root / "held_out.jsonl", held)
    seconds: dict[str, float] = {}

    start = time.perf_counter()
    init = make_model(root / "init", sizes, seed)
    common = ["--seed", str(seed)]
    sft_dir = command(
        ["sft", "--model", str(init), "--data", str(sft_file), *common]
        + ["--steps", str(sizes.sft_steps), "--batch-size", str(sizes.sft_batch)]
        + ["--learning-rate", str(sizes.sft_lr), "--checkpoint-every", str(sizes.sft_steps)],
        root / "sft",
    )
    seconds["sft"] = time.perf_counter() - start

    start = time.perf_counter()
    grpo_dir = command(
        ["rlhf", "--model", str(sft_dir / "final"), "--prompts", str(prompt_file), *common]
        + ["--reward", "ppojax.rlhf.text_rewards:exact_match", "--algorithm", "grpo"]
        + ["--group-size", str(sizes.group_size), "--response-len", str(RESPONSE_LEN)]
        + ["--num-minibatches", "1", "--update-epochs", "1", "--kl-in", "loss"]
        + ["--kl-coef", str(sizes.kl_coef), "--learning-rate", str(sizes.grpo_lr)]
        + ["--steps", str(sizes.grpo_steps), "--batch-size", str(sizes.grpo_batch)]
        + ["--checkpoint-every", str(sizes.grpo_steps)],
        root / "grpo",
    )
    seconds["grpo"] = time.perf_counter() - start

    start = time.perf_counter()
    answers = Answers(sft_dir / "final")
    pairs = answers.pairs(
        sft_dir / "final", train[: sizes.dpo_prompts], sizes.dpo_samples, seed, sizes.gold_fallback
    )
    if len(pairs) < sizes.dpo_batch:
        raise RuntimeError(f"{len(pairs)} sampled pairs, fewer than a DPO batch: train SFT longer")
    pair_file = write_jsonl(root / "pairs.jsonl", pairs)
    dpo_dir = command(
        ["dpo", "--model", str(sft_dir / "final"), "--pairs", str(pair_file), *common]
        + ["--loss", "sigmoid", "--beta", str(sizes.dpo_beta)]
        + ["--learning-rate", str(sizes.dpo_lr), "--steps", str(sizes.dpo_steps)]
        + ["--batch-size", str(sizes.dpo_batch), "--checkpoint-every", str(sizes.dpo_steps)],
        root / "dpo",
    )
    seconds["dpo"] = time.perf_counter() - start

    finals = {"sft": sft_dir / "final", "grpo": grpo_dir / "final", "dpo": dpo_dir / "final"}
    greedy = {stage: answers.greedy(path, held) for stage, path in finals.items()}
    return {
        "seed": seed,
        "accuracy": {stage: float(greedy[stage][2].mean()) for stage in STAGES},
        "dpo_pairs": len(pairs),
        "seconds": {stage: round(value, 1) for stage, value in seconds.items()},
        "grpo_scores": [float(row["objective/scores"]) for row in read_metrics(grpo_dir)],
        "examples": {
            stage: [[row["prompt"], greedy[stage][1][i]] for i, row in enumerate(held[:4])]
            for stage in STAGES
        },
        "folders": {stage: str(path) for stage, path in finals.items()},
        "greedy_ids": {stage: greedy[stage][0] for stage in STAGES},
    }


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    import csv

    with open(run_dir / "metrics.csv", newline="") as file:
        return list(csv.DictReader(file))


def transformers_reload(model: Path, rows: list[dict], ours: np.ndarray) -> dict[str, Any] | None:
    """transformers' greedy answers from the folder ``model`` against ppojax's ``ours``;
    None where torch or transformers does not import."""
    try:
        import torch
        import transformers
    except ImportError:
        return None
    loaded = transformers.AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model)
    encoded = [tokenizer.encode(row["prompt"]) for row in rows]
    width = max(map(len, encoded))
    pad = tokenizer.pad_token_id
    tokens = torch.tensor([[pad] * (width - len(ids)) + ids for ids in encoded])
    mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in encoded])
    with torch.no_grad():
        out = loaded.generate(
            input_ids=tokens,
            attention_mask=mask,
            max_new_tokens=RESPONSE_LEN,
            do_sample=False,
            pad_token_id=pad,
        )[:, width:].numpy()
    theirs = np.pad(out, ((0, 0), (0, RESPONSE_LEN - out.shape[1])), constant_values=pad)
    own = from_pretrained(model).tokenizer
    return {
        "greedy_equal_rows": int((theirs == ours).all(axis=1).sum()),
        "rows": len(rows),
        "encodings_equal": all(
            ids == own.encode(row["prompt"]) for ids, row in zip(encoded, rows, strict=True)
        ),
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }


def plot(result: dict[str, Any], path: Path) -> None:
    plt = pyplot()

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for row in result["seeds"]:
        left.plot(range(3), [row["accuracy"][s] for s in STAGES], "o-", label=f"seed {row['seed']}")
        scores = row["grpo_scores"]
        right.plot(*moving_mean(scores, max(1, len(scores) // 15)), label=f"seed {row['seed']}")
    left.set_xticks(range(3), ["SFT", "SFT + GRPO", "SFT + DPO"])
    left.set_ylabel(f"greedy accuracy, {result['sizes']['held_out']} held-out sums")
    left.set_ylim(0, 1)
    left.legend()
    right.set_xlabel("GRPO step")
    right.set_ylabel("exact-match reward of the samples")
    right.set_title("GRPO, moving mean", fontsize=10)
    right.legend()
    fig.suptitle("Two-digit addition, a 2-layer Llama from scratch on CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(seeds: list[int], sizes: Sizes, work: Path, out: Path, argv: list[str]) -> dict:
    """Every seed in ``work``; the result written to ``out`` (JSON) and its plot beside it."""
    rows, reloads = [], {}
    _, held = problems(sizes.held_out)
    for seed in seeds:
        row = run_seed(seed, sizes, work / f"seed{seed}")
        for stage in ("grpo", "dpo"):
            check = transformers_reload(Path(row["folders"][stage]), held, row["greedy_ids"][stage])
            if check is not None:
                reloads[f"seed{seed}/{stage}"] = check
        del row["greedy_ids"], row["folders"]
        rows.append(row)
        print(f"seed {seed}: " + ", ".join(f"{s} {row['accuracy'][s]:.3f}" for s in STAGES))
    mean = {s: float(np.mean([row["accuracy"][s] for row in rows])) for s in STAGES}
    result = {
        "benchmark": "text_e2e",
        **record(__file__, argv),
        "task": "a+b for 0 <= a, b <= 99, prompt 'What is a+b?', answer the sum; greedy "
        "held-out accuracy, scored by ppojax.rlhf.text_rewards.exact_match",
        "sizes": dataclasses.asdict(sizes),
        "mean_accuracy": mean,
        "grpo_gain_over_sft": mean["grpo"] - mean["sft"],
        "dpo_gain_over_sft": mean["dpo"] - mean["sft"],
        "seeds": rows,
        "transformers_reload": reloads or "not run: torch or transformers does not import",
    }
    write_json(out, result)
    plot(result, out.with_suffix(".png"))
    print(f"mean: {mean}; wrote {out} and {out.with_suffix('.png')}")
    return result


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4, help="seeds 0..N-1 (4)")
    parser.add_argument("--out", type=Path, default=RESULT, help="the JSON file; .png beside it")
    parser.add_argument("--work", type=Path, help="keep the run folders here (a temp folder)")
    parser.add_argument("--toy", action="store_true", help="the CI test's sizes")
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from --out")
    add_size_flags(parser, Sizes)
    args = parser.parse_args(argv)
    if args.plot_only:
        plot(json.loads(args.out.read_text()), args.out.with_suffix(".png"))
        return
    sizes = with_size_flags(TOY if args.toy else Sizes(), args)
    seeds = list(range(args.seeds))
    if args.work is not None:
        run(seeds, sizes, args.work, args.out, argv)
        return
    with tempfile.TemporaryDirectory() as work:
        run(seeds, sizes, Path(work), args.out, argv)


if __name__ == "__main__":
    main()
