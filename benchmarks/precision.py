"""Mixed precision measured: GRPO on the reversal task with the built-in transformer in
float32, in bf16 with float32 master weights (the default for a bf16 model), and in bf16 with
a bf16-only state (``master_weights=False``), at a learning rate low enough that the bf16-only
state loses most of its updates.

    python benchmarks/precision.py [--steps 400] [--learning-rate 3e-5] [--seed 0]
    python benchmarks/precision.py --table     # docs/rlhf.md's table, from the result file

One SFT (float32) starts all three; each run's reward curve (the checker's mean score per
step) and the share of the policy's matrix entries its training moved. Writes
``benchmarks/results/precision.json`` and ``.png``; docs/rlhf.md's table reads the JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import numpy as np
from common import command_line, machine, moving_mean, now, pyplot, versions, write_json
from rlhf import GROUP, ROWS, rlhf_config

from ppojax.engine import precision
from ppojax.rlhf import make_trainer, run_steps
from ppojax.rlhf.models.transformer import transformer
from ppojax.rlhf.tasks.digits import DigitTask
from ppojax.rlhf.tasks.reversal import checker, reversal_sft

RUNS = {  # name: (model dtype, master weights)
    "float32": ("float32", True),
    "bf16, float32 masters": ("bfloat16", True),
    "bf16 only": ("bfloat16", False),
}


def moved_share(before: dict, after: dict) -> float:
    """The share of the policy's matrix entries that differ (compared in float32)."""
    pairs = [
        (np.asarray(a, np.float32), np.asarray(b, np.float32))
        for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after), strict=True)
        if a.ndim == 2
    ]
    return float(np.mean(np.concatenate([np.ravel(a != b) for a, b in pairs])))


def run(task: DigitTask, sft: dict, dtype: str, master: bool, lr: float, steps: int, seed: int):
    lm = transformer(
        task.vocab_size,
        task.prompt_width + task.response_len,
        task.d_model,
        task.num_heads,
        task.num_layers,
        dtype=dtype,
    )
    config = rlhf_config(task, "grpo", learning_rate=lr, master_weights=master)
    trainer = make_trainer(config, lm.policy_apply, [checker], kv_cache=lm.kv_cache)
    init_key, train_key = jax.random.split(jax.random.key(seed + 7))
    state = trainer.init(precision.cast(sft, dtype), init_key)

    def prompt_fn(key):
        return task.prompts(key, ROWS // GROUP)

    start = time.perf_counter()
    new, metrics = jax.jit(lambda s, k: run_steps(trainer, s, prompt_fn, k, steps))(
        state, train_key
    )
    scores = np.asarray(metrics["rewards/checker/mean"])
    seconds = time.perf_counter() - start
    before = precision.cast(sft, dtype)
    return {
        "dtype": dtype,
        "master_weights": master,
        "score_first_10": round(float(scores[:10].mean()), 4),
        "score_last_10": round(float(scores[-10:].mean()), 4),
        "policy_entries_moved": round(moved_share(before, new.params["policy"]), 4),
        "seconds (compile included)": round(seconds, 1),
        "curve": [round(float(v), 4) for v in scores],
    }


def plot(result: dict, path: Path) -> None:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, entry in result["runs"].items():
        ax.plot(*moving_mean(entry["curve"], 10), label=name)
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("checker score (10-step mean)")
    ax.set_title(f"reversal, lr {result['settings']['learning_rate']:g}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def table(result: dict) -> str:
    """docs/rlhf.md's table of the result file."""
    lines = [
        "| run | state | compute | first 10 steps | last 10 steps | policy entries moved |",
        "|---|---|---|---|---|---|",
    ]
    for name, entry in result["runs"].items():
        state = "float32" if entry["master_weights"] else entry["dtype"]
        lines.append(
            f"| {name} | {state} | {entry['dtype']} | {entry['score_first_10']:.3f} | "
            f"{entry['score_last_10']:.3f} | {100 * entry['policy_entries_moved']:.1f}% |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--learning-rate", type=float, default=3e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--table", action="store_true", help="print the docs' table and exit")
    args = parser.parse_args()
    if args.table:
        print(table(json.loads((args.out / "precision.json").read_text())))
        return
    task = DigitTask()
    sft, _ = jax.jit(reversal_sft, static_argnums=0)(task, jax.random.key(args.seed + 1))
    result = {
        "date": now(),
        "command": command_line(__file__, sys.argv[1:]),
        "machine": machine(),
        "versions": versions(),
        "settings": {
            "task": "reversal",
            "algorithm": "grpo",
            "steps": args.steps,
            "learning_rate": args.learning_rate,
            "responses_per_step": ROWS,
            "group_size": GROUP,
            "seed": args.seed,
        },
        "runs": {},
    }
    for name, (dtype, master) in RUNS.items():
        entry = run(task, sft, dtype, master, args.learning_rate, args.steps, args.seed)
        result["runs"][name] = entry
        shown = {k: v for k, v in entry.items() if k != "curve"}
        print(name, shown, flush=True)
    write_json(args.out / "precision.json", result)
    plot(result, args.out / "precision.png")


if __name__ == "__main__":
    main()
