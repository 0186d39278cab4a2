"""PPO, GRPO and RLOO of ``ppojax.rlhf`` on the sorting and the reversal task, all measured.

    python benchmarks/rlhf.py [--seed 0] [--steps 200] [--out benchmarks/results]

1. Sorting (learned reward model, gold only logged): SFT and the Bradley-Terry reward model
   once, then PPO (beta 0.1), GRPO and RLOO (8 samples per prompt, KL in the loss, beta 0.1),
   each with 64 responses per step; PPO also vmapped over beta in {0, 0.01, 0.1, 1}.
2. Reversal (verifiable reward: the checker is the gold score): SFT, then the same three.
3. LoRA (rank 4 on every dense kernel of the transformer) against full fine-tuning: bytes of
   the train state, XLA's memory plan of one step, seconds per step.
Gold / checker scores of the final policies on 1024 held-out prompts; tokens/s of each run
(sampled response tokens, run time after compilation). Writes ``<out>/rlhf.json`` + ``.png``.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import shlex
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from machine import machine_description

from ppojax.rlhf import RLHFConfig, make_trainer, run_steps, sample_cached, tree_bytes
from ppojax.rlhf.model import zero_value_head
from ppojax.rlhf.reward import reward_model
from ppojax.rlhf.tasks.digits import EOS, PAD, DigitTask
from ppojax.rlhf.tasks.reversal import checker, reversal_sft
from ppojax.rlhf.tasks.sorting import (
    SORTING,
    RewardModelConfig,
    gold,
    sorting_sft,
    train_reward_model,
)

ROWS = 64  # responses per step: 64 prompts x 1 (PPO) or 8 prompts x 8 (GRPO, RLOO)
GROUP = 8
BETAS = (0.0, 0.01, 0.1, 1.0)
EVAL_PROMPTS = 1024
LORA_TARGETS = ("qkv", "out", "mlp_in", "mlp_out", "lm_head")
CURVES = ("objective/scores", "objective/kl")


def timed(fn, *args):
    """(result, seconds) of ``fn(*args)``, waiting for every array to be ready."""
    start = time.perf_counter()
    result = jax.block_until_ready(fn(*args))
    return result, time.perf_counter() - start


def rlhf_config(task: DigitTask, algorithm: str, **changes) -> RLHFConfig:
    """PPO: KL per token in the reward; GRPO / RLOO: 8 samples per prompt, k3 KL in the loss
    for GRPO (its paper's choice), in the reward for RLOO (its paper's)."""
    settings = dict(pad_id=PAD, eos_id=EOS, response_len=task.response_len, kl_coef=0.1)
    settings.update(algorithm=algorithm, learning_rate=3e-4)
    if algorithm != "ppo":
        settings.update(group_size=GROUP)
    if algorithm == "grpo":
        settings.update(kl_in="loss", kl_estimator="k3", loss_aggregation="grpo")
    return RLHFConfig(**{**settings, **changes})


def build(task: DigitTask, config: RLHFConfig, rewards: list, sft: dict, key: jax.Array):
    """Trainer, initial state (critic: a copy of the SFT model, value head at 0) and prompts."""
    lm = task.model()
    critic = lm.critic_apply if config.needs_critic else None
    trainer = make_trainer(config, lm.policy_apply, rewards, critic, kv_cache=lm.kv_cache)
    state = trainer.init(sft, key, zero_value_head(sft) if config.needs_critic else None)
    prompts = ROWS // config.group_size

    def prompt_fn(prompt_key: jax.Array):
        return task.prompts(prompt_key, prompts)

    return trainer, state, prompt_fn


def train(trainer, state, prompt_fn, key: jax.Array, steps: int) -> dict:
    """``steps`` steps in one compiled call: compile and run time apart, tokens/s, metrics."""

    def run(state, key):
        return run_steps(trainer, state, prompt_fn, key, steps)

    start = time.perf_counter()
    compiled = jax.jit(run).lower(state, key).compile()
    compile_s = time.perf_counter() - start
    (state, metrics), run_s = timed(compiled, state, key)
    tokens = float(np.sum(metrics["completions/mean_length"])) * ROWS
    return {
        "state": state,
        "metrics": {name: np.asarray(values) for name, values in metrics.items()},
        "compile_s": round(compile_s, 2),
        "run_s": round(run_s, 2),
        "response_tokens_per_s": round(tokens / run_s, 1),
    }


def evaluate(task: DigitTask, score_fn, params: dict, key: jax.Array) -> dict:
    """Mean score (gold or checker) of ``params`` on EVAL_PROMPTS fresh prompts, temperature
    1, and the fraction of distinct responses."""
    lm = task.model()
    options = dict(response_len=task.response_len, temperature=1.0, pad_id=PAD, eos_id=EOS)

    def run(key):
        prompt_key, sample_key = jax.random.split(key)
        prompts, mask = task.prompts(prompt_key, EVAL_PROMPTS)
        samples = sample_cached(lm.kv_cache, params, prompts, mask, sample_key, **options)
        return samples.tokens, score_fn(prompts, mask, samples.tokens, samples.mask)

    tokens, scores = jax.jit(run)(key)
    distinct = len({row.tobytes() for row in np.asarray(tokens)}) / EVAL_PROMPTS
    return {"score": round(float(scores.mean()), 4), "distinct": round(distinct, 3)}


def tail(values: np.ndarray) -> float:
    """Mean of the last 10% of a curve."""
    return round(float(np.mean(values[-max(1, len(values) // 10) :])), 4)


def summary(run: dict, evaluation: dict, score_name: str) -> dict:
    """What the JSON keeps of one run: timings, final metrics, evaluation, curves."""
    metrics = run["metrics"]
    series = {
        name: [round(float(v), 4) for v in metrics[name]]
        for name in (*CURVES, f"rewards/{score_name}/mean")
    }
    return {
        "compile_s": run["compile_s"],
        "run_s": run["run_s"],
        "response_tokens_per_s": run["response_tokens_per_s"],
        f"{score_name}_last_10pct": tail(metrics[f"rewards/{score_name}/mean"]),
        "kl_last_10pct": tail(metrics["objective/kl"]),
        "eval": evaluation,
        "curves": series,
    }


def sorting_stage(seed: int, steps: int, log) -> dict:
    """SFT, reward model, then PPO / GRPO / RLOO and the PPO beta sweep on sorting."""
    task = SORTING
    sft_key, rm_key, init_key, train_key, eval_key = jax.random.split(jax.random.key(seed), 5)
    (sft, sft_loss), sft_s = timed(jax.jit(sorting_sft, static_argnums=0), task, sft_key)
    rm_train = jax.jit(train_reward_model, static_argnums=(0, 1))
    (rm, rm_metrics), rm_s = timed(rm_train, task, RewardModelConfig(), sft, rm_key)
    log(f"sorting: SFT {sft_s:.1f} s, reward model {rm_s:.1f} s")
    rewards = [reward_model(task.model().critic_apply, rm), gold]
    result = {
        "sft": {
            "seconds": round(sft_s, 2),
            "final_loss": round(float(sft_loss[-1]), 4),
            "eval": evaluate(task, gold, sft, eval_key),
        },
        "reward_model": {
            "seconds": round(rm_s, 2),
            "held_out_accuracy": round(float(rm_metrics["held_out_accuracy"]), 4),
        },
    }
    for algorithm in ("ppo", "grpo", "rloo"):
        config = rlhf_config(task, algorithm, reward_weights=(1.0, 0.0))
        trainer, state, prompt_fn = build(task, config, rewards, sft, init_key)
        run = train(trainer, state, prompt_fn, train_key, steps)
        policy = run["state"].params["policy"]
        result[algorithm] = summary(run, evaluate(task, gold, policy, eval_key), "gold")
        log(f"sorting {algorithm}: {json.dumps(result[algorithm]['eval'])}, {run['run_s']} s")
    result["ppo_beta_sweep"] = beta_sweep(task, rewards, sft, init_key, train_key, eval_key, steps)
    return result


def beta_sweep(task, rewards, sft, init_key, train_key, eval_key, steps: int) -> dict:
    """PPO vmapped over BETAS in one compiled call: final KL and gold against beta."""
    config = rlhf_config(task, "ppo", reward_weights=(1.0, 0.0))
    trainer, state, prompt_fn = build(task, config, rewards, sft, init_key)

    def run(beta):
        return run_steps(trainer, state.replace(kl_coef=beta), prompt_fn, train_key, steps)

    (states, metrics), seconds = timed(jax.jit(jax.vmap(run)), jnp.asarray(BETAS))
    sweep = {"seconds (compile included)": round(seconds, 2)}
    for index, beta in enumerate(BETAS):
        policy = jax.tree.map(lambda x, i=index: x[i], states.params["policy"])
        sweep[str(beta)] = {
            "gold_last_10pct": tail(np.asarray(metrics["rewards/gold/mean"][index])),
            "reward_model_last_10pct": tail(
                np.asarray(metrics["rewards/reward_model_score/mean"][index])
            ),
            "kl_last_10pct": tail(np.asarray(metrics["objective/kl"][index])),
            "eval": evaluate(task, gold, policy, eval_key),
            "kl_curve": [round(float(v), 4) for v in metrics["objective/kl"][index]],
        }
    return sweep


def reversal_stage(seed: int, steps: int, log) -> dict:
    """SFT, then PPO / GRPO / RLOO against the checker."""
    task = DigitTask()
    sft_key, init_key, train_key, eval_key = jax.random.split(jax.random.key(seed + 1), 4)
    (sft, sft_loss), sft_s = timed(jax.jit(reversal_sft, static_argnums=0), task, sft_key)
    result = {
        "sft": {
            "seconds": round(sft_s, 2),
            "final_loss": round(float(sft_loss[-1]), 4),
            "eval": evaluate(task, checker, sft, eval_key),
        }
    }
    log(f"reversal: SFT {sft_s:.1f} s, {json.dumps(result['sft']['eval'])}")
    for algorithm in ("ppo", "grpo", "rloo"):
        trainer, state, prompt_fn = build(
            task, rlhf_config(task, algorithm), [checker], sft, init_key
        )
        run = train(trainer, state, prompt_fn, train_key, steps)
        policy = run["state"].params["policy"]
        result[algorithm] = summary(run, evaluate(task, checker, policy, eval_key), "checker")
        log(f"reversal {algorithm}: {json.dumps(result[algorithm]['eval'])}, {run['run_s']} s")
    return result


def lora_stage(seed: int, repeats: int = 10) -> dict:
    """LoRA (rank 4) against full fine-tuning of PPO (its critic a full copy) and GRPO (no
    critic) on sorting: state bytes, XLA's memory plan of one compiled step, median seconds
    per step over ``repeats`` steps."""
    task = SORTING
    lm = task.model()
    params = lm.init(jax.random.key(seed))
    rewards = [gold]
    result = {}
    variants = {"full": {}, "lora": dict(lora_rank=4, lora_targets=LORA_TARGETS)}
    for (name, changes), algorithm in itertools.product(variants.items(), ("ppo", "grpo")):
        config = rlhf_config(task, algorithm, **changes)
        trainer, state, prompt_fn = build(task, config, rewards, params, jax.random.key(1))
        prompts, mask = prompt_fn(jax.random.key(2))
        compiled = jax.jit(trainer.step).lower(state, prompts, mask, jax.random.key(3)).compile()
        memory = compiled.memory_analysis()
        times = [
            timed(compiled, state, prompts, mask, jax.random.key(i))[1] for i in range(repeats)
        ]
        trained = state.params["policy"]
        result[f"{algorithm}_{name}"] = {
            "train_state_bytes": tree_bytes(state),
            "trained_policy_bytes": tree_bytes(trained),
            "reference_bytes": tree_bytes(state.reference),
            "xla_temp_bytes": int(memory.temp_size_in_bytes),
            "xla_argument_bytes": int(memory.argument_size_in_bytes),
            "seconds_per_step_median": round(float(np.median(times)), 4),
        }
    return result


def plot(path: Path, document: dict) -> None:
    """Rows: sorting, reversal, the beta sweep; columns: gold / checker score and KL."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(3, 2, figsize=(11, 10))
    for row, (task, score) in enumerate((("sorting", "gold"), ("reversal", "checker"))):
        if task not in document:  # a stage that did not finish: its panels stay empty
            continue
        for algorithm in ("ppo", "grpo", "rloo"):
            curves = document[task][algorithm]["curves"]
            axes[row, 0].plot(curves[f"rewards/{score}/mean"], label=algorithm)
            axes[row, 1].plot(curves["objective/kl"], label=algorithm)
        axes[row, 0].set_title(f"{task}: {score} score (training batches)")
        axes[row, 1].set_title(f"{task}: KL to the reference")
    sweep = document.get("sorting", {}).get("ppo_beta_sweep")
    if sweep is not None:
        for beta in BETAS:
            axes[2, 1].plot(sweep[str(beta)]["kl_curve"], label=f"beta {beta:g}")
        golds = [sweep[str(beta)]["eval"]["score"] for beta in BETAS]
        axes[2, 0].bar([f"{beta:g}" for beta in BETAS], golds)
    axes[2, 0].set_title("sorting PPO: held-out gold against beta")
    axes[2, 1].set_title("sorting PPO: KL against step, per beta")
    for axis in axes.ravel():
        axis.grid(alpha=0.3)
        if axis is not axes[2, 0] and axis.lines:
            axis.set_xlabel("step")
            axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=200, help="RL steps of every run (200)")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Run the three stages, write rlhf.json and rlhf.png, print the headline numbers."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    load_before, began = os.getloadavg(), time.perf_counter()
    document = {
        "benchmark": "ppojax.rlhf: PPO, GRPO, RLOO on sorting and reversal; LoRA memory",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": shlex.join(["python", "benchmarks/rlhf.py", *(argv or sys.argv[1:])]),
        "settings": {
            "steps": args.steps,
            "responses_per_step": ROWS,
            "group_size": GROUP,
            "betas": BETAS,
            "eval_prompts": EVAL_PROMPTS,
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stages = (
        ("lora", lambda: lora_stage(args.seed)),
        ("reversal", lambda: reversal_stage(args.seed, args.steps, print)),
        ("sorting", lambda: sorting_stage(args.seed, args.steps, print)),
    )
    for name, stage in stages:  # the JSON is written after each, so a crash keeps the rest
        document[name] = stage()
        # Other processes share these cores; the load average says how much timings suffered.
        document["machine"] = machine_description()
        document["machine"]["load_average_1_5_15_min"] = {
            "start": load_before,
            "end": os.getloadavg(),
        }
        document["wall_s"] = round(time.perf_counter() - began, 1)
        (args.out / "rlhf.json").write_text(json.dumps(document, indent=2) + "\n")
    plot(args.out / "rlhf.png", document)
    print(json.dumps(document["lora"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
