"""RLHF outcomes and throughput of ``ppojax.rlhf`` on the sorting task, all measured.

    python benchmarks/rlhf.py [--seed 0] [--ppo-steps 300] [--out benchmarks/results]

Trains the SFT reference and the Bradley-Terry reward model once, then
1. PPO vmapped over fixed beta in {0, 0.01, 0.1, 1} in one compiled call (final KL vs beta;
   gold vs proxy at beta = 0, i.e. over-optimization of the learned reward model),
2. PPO with the adaptive KL controller, on 64 and on 256 prompts per step (share of
   second-half steps with KL within +-25% of the target),
3. sampled tokens/s (KV-cache sampling alone) and PPO tokens/s (whole PPO steps).
Writes ``<out>/rlhf.json`` and ``<out>/rlhf.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shlex
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from throughput import machine_description

from ppojax.rlhf import (
    RLHFConfig,
    build_model,
    gold_score,
    init_rlhf_state,
    ppo_step,
    reward_scores,
    run_ppo,
    sample_prompts,
    sample_responses,
    train_reward_model,
    train_sft,
)

BETAS = (0.0, 0.01, 0.1, 1.0)
EVAL_PROMPTS = 1024
CURVE_METRICS = ("gold_score", "reward_score", "kl")
SUMMARY_METRICS = ("reward_score", "gold_score", "kl", "kl_coef", "entropy", "response_length")


def timed(fn, *args):
    """(result, seconds) of ``fn(*args)``, waiting for every array to be ready."""
    start = time.perf_counter()
    result = jax.block_until_ready(fn(*args))
    return result, time.perf_counter() - start


def evaluate(config: RLHFConfig, policy: dict, reward_params: dict, key: jax.Array) -> dict:
    """Gold and proxy scores of ``policy`` on EVAL_PROMPTS fresh prompts, and how varied its
    responses are (distinct responses / N; share of the most common response)."""
    model = build_model(config)
    prompt_key, sample_key = jax.random.split(key)
    prompts = sample_prompts(prompt_key, EVAL_PROMPTS, config.prompt_len, config.num_digits)
    samples = sample_responses(
        model, policy, prompts, sample_key, config.response_len, config.temperature
    )
    return {
        "gold": gold_score(prompts, samples.tokens).mean(),
        "reward": reward_scores(model, reward_params, prompts, samples.tokens).mean(),
        "length": samples.mask.sum(axis=1).mean(),
        "tokens": samples.tokens,
        "prompts": prompts,
    }


def variety(tokens: np.ndarray) -> dict:
    """Distinct responses / N and the share of the most common one, for tokens [N, R]."""
    rows = [tuple(row) for row in tokens]
    counts = np.unique(np.array(rows), axis=0, return_counts=True)[1]
    return {"distinct_fraction": len(counts) / len(rows), "top_fraction": counts.max() / len(rows)}


def decode(prompt: np.ndarray, response: np.ndarray) -> str:
    """Readable text: digits as numbers, <s>, </s> and _ for PAD."""
    names = {0: "_", 1: "<s>", 2: "</s>"}
    word = lambda token: names.get(int(token), str(int(token) - 3))  # noqa: E731
    return " ".join(map(word, prompt)) + " -> " + " ".join(map(word, response))


def summarize_eval(result: dict) -> dict:
    """JSON-ready numbers of ``evaluate`` plus three example responses."""
    tokens, prompts = np.asarray(result["tokens"]), np.asarray(result["prompts"])
    return {
        "gold": round(float(result["gold"]), 4),
        "reward": round(float(result["reward"]), 4),
        "length": round(float(result["length"]), 3),
        **{k: round(v, 4) for k, v in variety(tokens).items()},
        "examples": [decode(prompts[i], tokens[i]) for i in range(3)],
    }


def tail_mean(values: jax.Array, fraction: float = 0.1) -> float:
    """Mean over the last ``fraction`` of the steps (the per-step values are noisy)."""
    values = np.asarray(values)
    return float(values[-max(1, int(len(values) * fraction)) :].mean())


def sweep_betas(
    config: RLHFConfig, sft_params: dict, reward_params: dict, key: jax.Array
) -> tuple[dict, dict, float]:
    """PPO for every fixed beta in BETAS in one jit(vmap) call: final params, metrics
    [len(BETAS), ppo_steps] and seconds (compile included)."""

    def train_one(beta: jax.Array) -> tuple[dict, dict]:
        state = init_rlhf_state(config, sft_params, reward_params, beta)
        state, metrics = run_ppo(config, state, key)
        return state.params["policy"], metrics

    (policies, metrics), seconds = timed(jax.jit(jax.vmap(train_one)), jnp.array(BETAS))
    return policies, metrics, seconds


def over_optimization(metrics: dict, sft_gold: float, beta_zero: dict) -> dict:
    """Numbers and a plain verdict for beta = 0: did the proxy rise while gold fell, or did
    the text degenerate (few distinct responses)?"""
    proxy, gold = np.asarray(metrics["reward_score"]), np.asarray(metrics["gold_score"])
    smooth = np.convolve(gold, np.ones(10) / 10, mode="valid")
    numbers = {
        "proxy_first_10_steps": float(proxy[:10].mean()),
        "proxy_last_10_percent": tail_mean(proxy),
        "gold_first_10_steps": float(gold[:10].mean()),
        "gold_peak_10_step_mean": float(smooth.max()),
        "gold_last_10_percent": tail_mean(gold),
        "sft_gold_eval": sft_gold,
        "final_gold_eval": beta_zero["gold"],
        "final_distinct_fraction": beta_zero["distinct_fraction"],
        "final_top_fraction": beta_zero["top_fraction"],
    }
    proxy_up = numbers["proxy_last_10_percent"] > numbers["proxy_first_10_steps"] + 0.1
    gold_down = beta_zero["gold"] < sft_gold - 0.02
    degenerate = beta_zero["distinct_fraction"] < 0.5 or beta_zero["top_fraction"] > 0.1
    verdict = (
        f"proxy score {'rose' if proxy_up else 'did not rise'} "
        f"({numbers['proxy_first_10_steps']:.2f} -> {numbers['proxy_last_10_percent']:.2f}); "
        f"gold score {'fell below' if gold_down else 'did not fall below'} the SFT model "
        f"({sft_gold:.3f} -> {beta_zero['gold']:.3f} on {EVAL_PROMPTS} held-out prompts); "
        f"text {'is' if degenerate else 'is not'} degenerate "
        f"({beta_zero['distinct_fraction']:.0%} distinct responses)."
    )
    return {
        **{k: round(v, 4) for k, v in numbers.items()},
        "proxy_up": bool(proxy_up),
        "gold_down": bool(gold_down),
        "degenerate": bool(degenerate),
        "over_optimization_visible": bool(proxy_up and (gold_down or degenerate)),
        "verdict": verdict,
    }


def kl_hold(metrics: dict, target_kl: float) -> dict:
    """How well the adaptive controller holds KL in [0.75, 1.25] * target over the second half
    of training: per step, as 10-step rolling means, and as the second-half mean."""
    kl = np.asarray(metrics["kl"])
    second = kl[len(kl) // 2 :]
    rolling = np.convolve(second, np.ones(10) / 10, mode="valid")
    low, high = 0.75 * target_kl, 1.25 * target_kl
    inside = lambda x: float(((x >= low) & (x <= high)).mean())  # noqa: E731
    mean = float(second.mean())
    return {
        "target_kl": target_kl,
        "band": [low, high],
        "second_half_mean_kl": round(mean, 4),
        "second_half_min_kl": round(float(second.min()), 4),
        "second_half_max_kl": round(float(second.max()), 4),
        "fraction_of_steps_in_band": round(inside(second), 4),
        "fraction_of_10_step_means_in_band": round(inside(rolling), 4),
        "mean_in_band": bool(low <= mean <= high),
        "final_kl_coef": round(float(np.asarray(metrics["kl_coef"])[-1]), 5),
    }


def throughput(config: RLHFConfig, sft_params: dict, reward_params: dict, repeats: int) -> dict:
    """Median over ``repeats`` compiled runs of (a) KV-cache sampling of a PPO batch and
    (b) a whole PPO step (sample, score, GAE, epochs of updates). Tokens = response
    positions B * R; real tokens (up to EOS) are reported beside them."""
    model = build_model(config)
    prompts = sample_prompts(
        jax.random.key(7), config.batch_size, config.prompt_len, config.num_digits
    )
    sample = jax.jit(
        lambda params, key: sample_responses(
            model, params, prompts, key, config.response_len, config.temperature
        )
    )
    step = jax.jit(ppo_step)
    state = init_rlhf_state(config, sft_params, reward_params, config.kl_coef)
    samples, _ = timed(sample, sft_params, jax.random.key(0))
    timed(step, config, state, prompts, jax.random.key(0))
    sample_seconds = [timed(sample, sft_params, jax.random.key(i))[1] for i in range(repeats)]
    step_seconds = [
        timed(step, config, state, prompts, jax.random.key(i))[1] for i in range(repeats)
    ]
    positions = config.batch_size * config.response_len
    real = float(samples.mask.sum())
    return {
        "batch_size": config.batch_size,
        "response_len": config.response_len,
        "sampled_tokens_per_second": round(positions / float(np.median(sample_seconds))),
        "sampled_real_tokens_per_second": round(real / float(np.median(sample_seconds))),
        "ppo_tokens_per_second": round(positions / float(np.median(step_seconds))),
        "ppo_step_seconds": [round(s, 4) for s in step_seconds],
        "sample_seconds": [round(s, 5) for s in sample_seconds],
    }


def plot(path: Path, raw: dict, target_kl: float, large_batch: int) -> None:
    """Gold, proxy and KL curves per beta and for the adaptive run; the controller's KL/beta."""
    sweep, adaptive, sft_gold = raw["sweep"], raw["adaptive"], raw["sft_eval"]["gold"]
    import matplotlib  # imported here: only the benchmark extra installs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    smooth = lambda x: np.convolve(np.asarray(x), np.ones(10) / 10, mode="valid")  # noqa: E731
    figure, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = [("gold_score", "gold score"), ("reward_score", "reward-model score"), ("kl", "KL")]
    for ax, (name, title) in zip(axes.flat, panels, strict=False):
        for index, beta in enumerate(BETAS):
            ax.plot(smooth(sweep[name][index]), label=f"beta {beta:g}")
        ax.plot(smooth(adaptive[name]), "k--", label=f"adaptive (target {target_kl:g})")
        ax.set_title(f"{title} (10-step mean)")
        ax.set_xlabel("PPO step")
    axes[0, 0].axhline(sft_gold, color="grey", lw=0.8, label="SFT (eval)")
    axes[0, 0].legend(fontsize=8)
    axes[1, 0].set_yscale("symlog", linthresh=1.0)
    ax = axes[1, 1]
    ax.plot(np.asarray(adaptive["kl"]), lw=0.8, label="KL per step (batch 64)")
    large = np.asarray(raw["adaptive_large"]["kl"])
    ax.plot(large, lw=0.8, color="purple", label=f"KL per step (batch {large_batch})")
    ax.axhspan(0.75 * target_kl, 1.25 * target_kl, color="green", alpha=0.15, label="target +-25%")
    ax.set_title("adaptive controller")
    ax.set_xlabel("PPO step")
    twin = ax.twinx()
    twin.plot(np.asarray(adaptive["kl_coef"]), "r", lw=1.0, label="beta")
    twin.plot(np.asarray(raw["adaptive_large"]["kl_coef"]), "r--", lw=1.0, label="beta")
    twin.set_ylabel("beta (solid: batch 64, dashed: large batch)", color="r")
    ax.legend(fontsize=8, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ppo-steps", type=int, default=300)
    parser.add_argument("--target-kl", type=float, default=2.0)
    parser.add_argument("--kl-horizon", type=float, default=640.0)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--large-batch", type=int, default=256, help="prompts per step of a second adaptive run"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    return parser.parse_args(argv)


def run_final_summary(metrics: dict, index: int | None = None) -> dict:
    """Last-10% means of SUMMARY_METRICS, of sweep member ``index`` when given."""
    pick = (lambda x: x[index]) if index is not None else (lambda x: x)  # noqa: E731
    return {name: round(tail_mean(pick(metrics[name])), 4) for name in SUMMARY_METRICS}


def adaptive_run(
    config: RLHFConfig,
    args: argparse.Namespace,
    sft_params: dict,
    reward_params: dict,
    key: jax.Array,
    batch_size: int,
) -> tuple[dict, dict, float]:
    """PPO with the adaptive KL controller (start beta 0.1) on ``batch_size`` prompts per
    step: final policy params, metrics [ppo_steps] and seconds (compile included). The horizon
    grows with the batch so that beta can move by the same factor per step as at the base
    batch; only the noise of the per-step KL changes."""
    adaptive_config = config.replace(
        adaptive_kl=True,
        target_kl=args.target_kl,
        kl_horizon=args.kl_horizon * batch_size / config.batch_size,
        kl_coef=0.1,
        batch_size=batch_size,
    )
    start_state = init_rlhf_state(adaptive_config, sft_params, reward_params, 0.1)
    (state, metrics), seconds = timed(jax.jit(run_ppo), adaptive_config, start_state, key)
    return state.params["policy"], metrics, seconds


def run_experiments(config: RLHFConfig, args: argparse.Namespace) -> dict:
    """Every stage, timed; returns the raw results that ``report`` turns into the JSON."""
    keys = jax.random.split(jax.random.key(args.seed), 5)
    (sft_params, sft_loss), sft_seconds = timed(jax.jit(train_sft), config, keys[0])
    (reward_params, reward_metrics), reward_seconds = timed(
        jax.jit(train_reward_model), config, sft_params, keys[1]
    )
    evaluate_jit = jax.jit(evaluate, static_argnums=0)
    policies, sweep, sweep_seconds = sweep_betas(config, sft_params, reward_params, keys[3])
    evaluate_policy = lambda policy: summarize_eval(  # noqa: E731
        evaluate_jit(config, policy, reward_params, keys[2])
    )
    sweep_evals = [
        evaluate_policy(jax.tree.map(lambda x, i=i: x[i], policies)) for i in range(len(BETAS))
    ]
    adaptive = {
        size: adaptive_run(config, args, sft_params, reward_params, keys[4], size)
        for size in (config.batch_size, args.large_batch)
    }
    adaptive_evals = {size: evaluate_policy(run[0]) for size, run in adaptive.items()}
    return {
        "seconds": {
            "sft": sft_seconds,
            "reward_model": reward_seconds,
            "beta_sweep_vmapped": sweep_seconds,
            "adaptive_run": adaptive[config.batch_size][2],
            "adaptive_run_large_batch": adaptive[args.large_batch][2],
        },
        "sft_loss": sft_loss,
        "reward_metrics": reward_metrics,
        "sft_eval": evaluate_policy(sft_params),
        "sweep": sweep,
        "sweep_evals": sweep_evals,
        "adaptive": adaptive[config.batch_size][1],
        "adaptive_eval": adaptive_evals[config.batch_size],
        "adaptive_large": adaptive[args.large_batch][1],
        "adaptive_large_eval": adaptive_evals[args.large_batch],
        "throughput": throughput(config, sft_params, reward_params, args.repeats),
    }


def report(config: RLHFConfig, args: argparse.Namespace, raw: dict) -> dict:
    """The JSON document: settings, stage results and the measured claims."""
    sft_gold = raw["sft_eval"]["gold"]
    final_kl = [run_final_summary(raw["sweep"], i)["kl"] for i in range(len(BETAS))]
    adaptive_final = run_final_summary(raw["adaptive"])
    reward = raw["reward_metrics"]
    return {
        "benchmark": "rlhf",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + shlex.join(["benchmarks/rlhf.py", *sys.argv[1:]]),
        "machine": {**machine_description(), "load_average_1_5_15_min": raw["load_average"]},
        "config": dataclasses.asdict(config),
        "seconds": {k: round(v, 2) for k, v in raw["seconds"].items()},
        "sft": {"final_loss": round(float(raw["sft_loss"][-1]), 4), "eval": raw["sft_eval"]},
        "reward_model": {
            "train_loss_last_50_steps": round(float(np.mean(reward["loss"][-50:])), 4),
            "train_accuracy_last_50_steps": round(float(np.mean(reward["accuracy"][-50:])), 4),
            "held_out_pair_accuracy": round(float(reward["held_out_accuracy"]), 4),
        },
        "beta_sweep": [
            {"beta": beta, "last_10_percent": run_final_summary(raw["sweep"], i), "eval": e}
            for i, (beta, e) in enumerate(zip(BETAS, raw["sweep_evals"], strict=True))
        ],
        "adaptive": {
            "last_10_percent": adaptive_final,
            "eval": raw["adaptive_eval"],
            "kl_hold": kl_hold(raw["adaptive"], args.target_kl),
        },
        "adaptive_large_batch": {
            "batch_size": args.large_batch,
            "kl_horizon": args.kl_horizon * args.large_batch / config.batch_size,
            "last_10_percent": run_final_summary(raw["adaptive_large"]),
            "eval": raw["adaptive_large_eval"],
            "kl_hold": kl_hold(raw["adaptive_large"], args.target_kl),
        },
        "claims": {
            "sft_gold_eval": sft_gold,
            "ppo_gold_eval_beta_0.1": raw["sweep_evals"][2]["gold"],
            "ppo_gold_eval_adaptive": raw["adaptive_eval"]["gold"],
            "final_kl_by_beta": dict(zip(map(str, BETAS), final_kl, strict=True)),
            "final_kl_falls_as_beta_rises": bool(np.all(np.diff(final_kl) < 0)),
            "beta_zero": over_optimization(
                {k: v[0] for k, v in raw["sweep"].items()}, sft_gold, raw["sweep_evals"][0]
            ),
        },
        "throughput": raw["throughput"],
        "curves": curves(raw),
    }


def curves(raw: dict) -> dict:
    """Per-step series behind the plot, rounded, so every number above can be rechecked."""
    series = lambda x: [round(float(v), 4) for v in np.asarray(x)]  # noqa: E731
    sweep = {
        str(beta): {name: series(raw["sweep"][name][i]) for name in CURVE_METRICS}
        for i, beta in enumerate(BETAS)
    }
    adaptive = {
        key: {name: series(raw[key][name]) for name in CURVE_METRICS + ("kl_coef",)}
        for key in ("adaptive", "adaptive_large")
    }
    return {"beta_sweep": sweep, **adaptive}


def main(argv: list[str] | None = None) -> int:
    """Run everything, write rlhf.json and rlhf.png, print the claims."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config = RLHFConfig(ppo_steps=args.ppo_steps)
    load_before = os.getloadavg()
    raw = run_experiments(config, args)
    # Other processes share these cores; the load average says how much the timings suffered.
    raw["load_average"] = {"start": load_before, "end": os.getloadavg()}
    document = report(config, args, raw)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rlhf.json").write_text(json.dumps(document, indent=2) + "\n")
    plot(args.out / "rlhf.png", raw, args.target_kl, args.large_batch)
    print(json.dumps(document["claims"], indent=2))
    print(json.dumps(document["adaptive"]["kl_hold"], indent=2))
    print(json.dumps(document["adaptive_large_batch"]["kl_hold"], indent=2))
    print(json.dumps(document["throughput"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
