"""ppojax.rlhf measured: PPO against a learned reward model, PPO/GRPO/RLOO, LoRA's memory.

    python benchmarks/rlhf.py [--parts lora,reversal,sorting] [--seed 0] [--steps 200]
                              [--seeds 4] [--sorting-steps 300] [--out benchmarks/results]

1. Sorting (a learned reward model; the gold score only watches): for each of ``--seeds``
   seeds, SFT and a Bradley-Terry reward model (``RewardModelConfig``'s defaults), then PPO
   against the reward model at beta 0 and 0.1, 64 responses per step, seeds x betas vmapped
   in one compiled call. Held-out gold per seed of SFT and of each PPO policy; curves (mean
   over seeds) of gold, reward-model score and KL per step.
2. Reversal (a verifiable reward: the checker is the gold score): SFT, then PPO (beta 0.1),
   GRPO and RLOO (8 samples per prompt, KL in the loss, beta 0.1), 64 responses per step.
3. LoRA (rank 4 on every dense kernel of the transformer) against full fine-tuning: bytes of
   the train state, XLA's memory plan of one step, seconds per step.
Scores of final policies on 1024 held-out prompts; tokens/s of each reversal run. Each part
carries its own record (date, command, machine, wall time); a run of some ``--parts`` keeps
the others' entries in ``<out>/rlhf.json``. Writes ``<out>/rlhf.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import os
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from common import command_line, machine, now, pyplot, timed, versions, write_json

from ppojax.rlhf import (
    RLHFConfig,
    SamplingSettings,
    make_trainer,
    run_steps,
    sample_responses,
    tree_bytes,
)
from ppojax.rlhf.models.transformer import zero_value_head
from ppojax.rlhf.post.reward_model import reward_model
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
SORTING_BETAS = (0.0, 0.1)  # no KL leash against the proxy, and the usual one
PARTS = ("lora", "reversal", "sorting")
LEGACY = ("date", "command", "settings", "machine", "wall_s", "load_average_1_5_15_min")
EVAL_PROMPTS = 1024
LORA_TARGETS = ("c_attn", "c_proj", "c_fc", "lm_head")
CURVES = ("objective/scores", "objective/kl")


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


def build_trainer(task: DigitTask, config: RLHFConfig, rewards: list, sft: dict, key: jax.Array):
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


@functools.partial(jax.jit, static_argnums=(0, 1))
def eval_samples(task: DigitTask, score_fn, params: dict, key: jax.Array):
    """Responses [EVAL_PROMPTS, R] of ``params`` at temperature 1 and their scores; one
    compile per task and score, whatever the params (each seed's policy reuses it)."""
    settings = SamplingSettings(task.response_len, temperature=1.0, pad_id=PAD, eos_id=EOS)
    prompt_key, sample_key = jax.random.split(key)
    prompts, mask = task.prompts(prompt_key, EVAL_PROMPTS)
    samples = sample_responses(task.model().kv_cache, params, prompts, mask, sample_key, settings)
    return samples.tokens, score_fn(prompts, mask, samples.tokens, samples.mask)


def evaluate(task: DigitTask, score_fn, params: dict, key: jax.Array) -> dict:
    """Mean score (gold or checker) of ``params`` on EVAL_PROMPTS fresh prompts, temperature
    1, and the fraction of distinct responses."""
    tokens, scores = eval_samples(task, score_fn, params, key)
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


def sorting_stage(seeds: int, steps: int, log) -> dict:
    """For each of ``seeds`` seeds (vmapped): SFT, the reward model, then PPO against it at
    each of SORTING_BETAS, all seeds x betas in one compiled call; gold only watches."""
    task, config = SORTING, RewardModelConfig()
    keys = jax.vmap(lambda seed: jax.random.split(jax.random.key(seed), 5))(jnp.arange(seeds))
    sft_keys, rm_keys, init_keys, train_keys, eval_keys = (keys[:, i] for i in range(5))
    sft_fn = jax.jit(jax.vmap(functools.partial(sorting_sft, task)))
    (sft, sft_loss), sft_s = timed(sft_fn, sft_keys)
    rm_fn = jax.jit(jax.vmap(functools.partial(train_reward_model, task, config), (0, 0)))
    (rm, rm_metrics), rm_s = timed(rm_fn, sft, rm_keys)
    log(f"sorting: SFT {sft_s:.1f} s, reward model {rm_s:.1f} s ({seeds} seeds)")
    sft_gold = [evaluate(task, gold, pick(sft, s), eval_keys[s]) for s in range(seeds)]
    betas = jnp.asarray(SORTING_BETAS)

    def per_seed(sft, rm, init_key, train_key):
        rewards = [reward_model(task.model().critic_apply, rm), gold]
        rl = rlhf_config(task, "ppo", reward_weights=(1.0, 0.0))
        trainer, state, prompt_fn = build_trainer(task, rl, rewards, sft, init_key)

        def per_beta(beta):
            return run_steps(trainer, state.replace(kl_coef=beta), prompt_fn, train_key, steps)

        return jax.vmap(per_beta)(betas)

    (states, metrics), ppo_s = timed(jax.jit(jax.vmap(per_seed)), sft, rm, init_keys, train_keys)
    log(f"sorting: PPO {ppo_s:.1f} s ({seeds} seeds x {len(SORTING_BETAS)} betas)")
    accuracy = [round(float(a), 4) for a in rm_metrics["held_out_accuracy"]]
    result = {
        "settings": {
            "seeds": list(range(seeds)),
            "steps": steps,
            "responses_per_step": ROWS,
            "betas": SORTING_BETAS,
            "eval_prompts": EVAL_PROMPTS,
            "reward_model": dataclasses.asdict(config),
        },
        "sft": {
            "seconds": round(sft_s, 2),
            "final_loss_per_seed": [round(float(x), 4) for x in sft_loss[:, -1]],
            "gold_per_seed": [e["score"] for e in sft_gold],
            "gold_mean": mean([e["score"] for e in sft_gold]),
        },
        "reward_model": {
            "seconds": round(rm_s, 2),
            "held_out_accuracy_per_seed": accuracy,
            "held_out_accuracy_mean": mean(accuracy),
        },
        "ppo": {"seconds (compile included)": round(ppo_s, 2)},
    }
    for b, beta in enumerate(SORTING_BETAS):
        result["ppo"][str(beta)] = beta_summary(task, states, metrics, b, eval_keys, sft_gold)
        log(f"sorting PPO beta {beta}: {json.dumps(result['ppo'][str(beta)]['eval_gold_mean'])}")
    return result


def pick(tree, *index):
    """The slice ``index`` of every leaf of a stacked pytree."""
    return jax.tree.map(lambda x: x[index], tree)


def mean(values) -> float:
    return round(float(np.mean(values)), 4)


def beta_summary(task, states, metrics, b: int, eval_keys, sft_gold: list) -> dict:
    """Per-seed held-out gold of the PPO policies at beta index ``b``, their gain over SFT,
    and the curves (mean over seeds) of gold, reward-model score and KL per step."""
    seeds = len(sft_gold)
    evals = [
        evaluate(task, gold, pick(states.params["policy"], s, b), eval_keys[s])
        for s in range(seeds)
    ]
    names = {
        "gold": "rewards/gold/mean",
        "reward_model_score": "rewards/reward_model_score/mean",
        "kl": "objective/kl",
    }
    curves = {key: np.asarray(metrics[name][:, b]) for key, name in names.items()}
    gains = [e["score"] - s["score"] for e, s in zip(evals, sft_gold, strict=True)]
    return {
        "eval_gold_per_seed": [e["score"] for e in evals],
        "eval_gold_mean": mean([e["score"] for e in evals]),
        "gain_over_sft_per_seed": [round(g, 4) for g in gains],
        "gain_over_sft_mean": mean(gains),
        "distinct_per_seed": [e["distinct"] for e in evals],
        **{f"{key}_last_10pct_per_seed": [tail(c) for c in curve] for key, curve in curves.items()},
        "curves_mean_over_seeds": {
            key: [round(float(v), 4) for v in curve.mean(axis=0)] for key, curve in curves.items()
        },
    }


def reversal_stage(seed: int, steps: int, log) -> dict:
    """SFT, then PPO / GRPO / RLOO against the checker."""
    task = DigitTask()
    sft_key, init_key, train_key, eval_key = jax.random.split(jax.random.key(seed + 1), 4)
    (sft, sft_loss), sft_s = timed(jax.jit(reversal_sft, static_argnums=0), task, sft_key)
    result = {
        "settings": {
            "seed": seed,
            "steps": steps,
            "responses_per_step": ROWS,
            "group_size": GROUP,
            "eval_prompts": EVAL_PROMPTS,
        },
        "sft": {
            "seconds": round(sft_s, 2),
            "final_loss": round(float(sft_loss[-1]), 4),
            "eval": evaluate(task, checker, sft, eval_key),
        },
    }
    log(f"reversal: SFT {sft_s:.1f} s, {json.dumps(result['sft']['eval'])}")
    for algorithm in ("ppo", "grpo", "rloo"):
        trainer, state, prompt_fn = build_trainer(
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
        trainer, state, prompt_fn = build_trainer(task, config, rewards, params, jax.random.key(1))
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
    """Reversal: checker score and KL per algorithm. Sorting (mean over seeds): gold and
    reward-model score per step at each beta, KL per step, held-out gold per seed."""
    plt = pyplot()

    figure, axes = plt.subplots(3, 2, figsize=(11, 10))
    if "reversal" in document:  # a part that did not run: its panels stay empty
        for algorithm in ("ppo", "grpo", "rloo"):
            curves = document["reversal"][algorithm]["curves"]
            axes[0, 0].plot(curves["rewards/checker/mean"], label=algorithm)
            axes[0, 1].plot(curves["objective/kl"], label=algorithm)
    axes[0, 0].set_title("reversal: checker score (training batches)")
    axes[0, 1].set_title("reversal: KL to the reference")
    sorting = document.get("sorting")
    if sorting is not None:
        plot_sorting(axes, sorting)
    for axis in axes.ravel():
        axis.grid(alpha=0.3)
        if axis is not axes[2, 1] and axis.lines:
            axis.set_xlabel("step")
            axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def plot_sorting(axes, sorting: dict) -> None:
    """Rows 1 and 2 of the figure: the sorting PPO runs against the learned reward model."""
    seeds = len(sorting["settings"]["seeds"])
    sft_gold = sorting["sft"]["gold_mean"]
    labels, golds = ["SFT"], [sorting["sft"]["gold_per_seed"]]
    for beta in sorting["settings"]["betas"]:
        run = sorting["ppo"][str(beta)]
        curves = run["curves_mean_over_seeds"]
        axes[1, 0].plot(curves["gold"], label=f"beta {beta:g}")
        axes[1, 1].plot(curves["reward_model_score"], label=f"beta {beta:g}")
        axes[2, 0].plot(curves["kl"], label=f"beta {beta:g}")
        labels.append(f"PPO beta {beta:g}")
        golds.append(run["eval_gold_per_seed"])
    axes[1, 0].axhline(sft_gold, color="gray", linestyle="--", label="SFT (held out)")
    axes[1, 0].set_title(f"sorting PPO: gold score, mean of {seeds} seeds")
    axes[1, 1].set_title("sorting PPO: learned reward-model score")
    axes[2, 0].set_title("sorting PPO: KL to the reference")
    axes[2, 1].bar(labels, [np.mean(g) for g in golds], alpha=0.6)
    for index, values in enumerate(golds):
        axes[2, 1].scatter([index] * len(values), values, color="black", s=12, zorder=3)
    axes[2, 1].set_title("sorting: held-out gold (bar: mean, dots: seeds)")


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0, help="reversal and LoRA's seed")
    parser.add_argument("--steps", type=int, default=200, help="RL steps of reversal (200)")
    parser.add_argument("--seeds", type=int, default=4, help="sorting's seeds, vmapped (4)")
    parser.add_argument(
        "--sorting-steps", type=int, default=300, help="RL steps of sorting's PPO (300)"
    )
    parser.add_argument(
        "--parts",
        default=",".join(PARTS),
        help="comma-separated subset of lora,reversal,sorting; the others' results already "
        "in <out>/rlhf.json are kept",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args(argv)
    args.parts = args.parts.split(",")
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        parser.error(f"--parts: unknown {sorted(unknown)}; choose from {PARTS}")
    return args


def run_record(command: str, began: float, load_before: tuple) -> dict:
    """When, where and how a part ran: its own record, so merged parts stay traceable."""
    where = machine()
    # Other processes share these cores; the load average says how much timings suffered.
    where["load_average_1_5_15_min"] = {"start": load_before, "end": os.getloadavg()}
    return {
        "date": now(),
        "command": command,
        "machine": where,
        "versions": versions(),
        "wall_s": round(time.perf_counter() - began, 1),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the chosen parts, merge them into rlhf.json, redraw rlhf.png."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = command_line(__file__, sys.argv[1:] if argv is None else argv)
    path = args.out / "rlhf.json"
    document = json.loads(path.read_text()) if path.exists() else {}
    document["benchmark"] = "ppojax.rlhf: PPO, GRPO, RLOO on reversal; PPO on sorting against "
    document["benchmark"] += "a learned reward model, over seeds and beta; LoRA memory"
    # A file written before the record moved into each part: its parts keep the old record.
    legacy = {k: document.pop(k) for k in LEGACY if k in document}
    for name in PARTS if legacy.get("command") else ():
        if name in document and "run" not in document[name]:
            document[name]["run"] = legacy
    args.out.mkdir(parents=True, exist_ok=True)
    stages = {
        "lora": lambda: lora_stage(args.seed),
        "reversal": lambda: reversal_stage(args.seed, args.steps, print),
        "sorting": lambda: sorting_stage(args.seeds, args.sorting_steps, print),
    }
    for name in args.parts:  # the JSON is written after each, so a crash keeps the rest
        load_before, began = os.getloadavg(), time.perf_counter()
        document[name] = {"run": None, **stages[name]()}
        document[name]["run"] = run_record(command, began, load_before)
        write_json(path, document)
    plot(args.out / "rlhf.png", document)
    if "sorting" in args.parts:
        print(json.dumps({k: document["sorting"][k] for k in ("sft", "reward_model")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
