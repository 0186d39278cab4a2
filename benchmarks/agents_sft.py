"""SFT on a few scripted demonstrations, then GRPO (or PPO with a critic), for both agent
envs, from models made from nothing: does RL raise held-out success over SFT and shorten
episodes?

    python benchmarks/agents_sft.py                    # results/agents_sft.json and .png
    python benchmarks/agents_sft.py --algorithm ppo    # results/agents_sft_ppo.json and .png
    python benchmarks/agents_sft.py --seeds 1 --guessing-steps 20 --calculator-steps 5 \\
        --out /tmp/agents_sft.json                     # a quick look
    python benchmarks/agents_sft.py --plot-only        # redraw the plot from the JSON
    python benchmarks/agents_sft.py --table            # both result files as docs/rlhf.md's table

For each env and each seed a transformer (d_model 64, 4 heads, 2 layers) starts from random
weights, is trained by ``post.demos.train_on_demos`` on a few episodes a scripted policy
played (``post.demos.play_demos``; ``--guessing-demos``, ``--calculator-demos``; one set
for every seed, the seed sets the initialisation, the SFT batches and the RL steps), then
by ``make_episode_trainer`` (GRPO in groups of 8, or PPO: one episode per start, token-level
GAE with a critic that starts as a copy of the SFT model, value head included, and trains alone
for the first ``--critic-warmup`` steps; the reference is the SFT model). Held-out episodes, drawn
from a key that neither the demos nor training use, are sampled at temperature 1 after SFT
and after RL: success rate and turns.

- guessing: ``NumberGuessing(10 values, 4 turns)``; the script guesses uniformly among the
  numbers the replies leave possible, which wins about 3/4 of the games in about 3.1 turns
  (the exact odds, by recursion over the interval left, are in the JSON); binary search wins
  all of them in 2.9 turns on average.
  The seeds run vmapped, SFT, evaluation and RL in one compiled call.
- calculator: ``Calculator(3 digits)``, at most 3 turns; the script calls the tool on the
  prompt's sum and answers its reply: it wins every episode in 2 turns. The env runs on the
  host, so the seeds' RL runs one after another (their SFT is vmapped).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
from common import (
    RESULTS,
    add_size_flags,
    markdown_table,
    moving_mean,
    pyplot,
    record,
    rounded,
    with_size_flags,
    write_json,
)

from ppojax.rlhf import RLHFConfig
from ppojax.rlhf.core.episode_trainer import make_episode_trainer
from ppojax.rlhf.core.episodes import rollout_episodes
from ppojax.rlhf.core.host_rollout import HostRollout
from ppojax.rlhf.core.turns import EpisodeLayout
from ppojax.rlhf.envs import calculator as calc
from ppojax.rlhf.envs import guessing as g
from ppojax.rlhf.models.transformer import transformer
from ppojax.rlhf.post import demos as d

RESULT = RESULTS / "agents_sft.json"
RESULT_PPO = RESULTS / "agents_sft_ppo.json"


@dataclasses.dataclass(frozen=True)
class Sizes:
    """The data, the model and each stage's steps (both envs share them unless named)."""

    guessing_demos: int = 64
    calculator_demos: int = 192
    sft_steps: int = 300
    sft_batch: int = 32
    sft_lr: float = 1e-3
    episodes: int = 64  # per RL step
    group_size: int = 8
    rl_lr: float = 3e-4
    guessing_steps: int = 200
    calculator_steps: int = 100
    held_out: int = 512
    d_model: int = 64
    heads: int = 4
    layers: int = 2
    critic_warmup: int = 10  # PPO only


@dataclasses.dataclass(frozen=True)
class Task:
    """One env, its scripted policy and its episode shape."""

    name: str
    env: Any
    script: d.Script
    vocab_size: int
    pad_id: int
    eos_id: int
    turn_len: int
    max_turns: int


TASKS = {
    "guessing": Task(
        "guessing", g.NumberGuessing(10, 4), d.consistent_guesser(10), g.VOCAB_SIZE, g.PAD,
        g.EOS, 2, 4,
    ),
    "calculator": Task(
        "calculator", calc.Calculator(3), d.tool_then_answer, calc.VOCAB_SIZE, calc.PAD,
        calc.EOS, 9, 3,
    ),
}  # fmt: skip


def build(task: Task, sizes: Sizes, algorithm: str) -> tuple[Any, Any]:
    """The model and the GRPO or PPO trainer of ``task``."""
    ppo = algorithm == "ppo"
    config = RLHFConfig(
        pad_id=task.pad_id,
        eos_id=task.eos_id,
        response_len=task.turn_len,
        algorithm=algorithm,
        group_size=1 if ppo else sizes.group_size,
        critic_warmup_steps=sizes.critic_warmup if ppo else 0,
        update_epochs=1,
        num_minibatches=1,
        learning_rate=sizes.rl_lr,
        kl_coef=0.0,
    )
    env = task.env
    length = EpisodeLayout(env.prompt_len, task.turn_len, env.reply_len, task.max_turns).length
    lm = transformer(task.vocab_size, length, sizes.d_model, sizes.heads, sizes.layers)
    trainer = make_episode_trainer(
        config, lm.policy_apply, env, sizes.episodes, task.max_turns, kv_cache=lm.kv_cache,
        critic_apply=lm.critic_apply if ppo else None,
    )  # fmt: skip
    return lm, trainer


def init_state(trainer: Any, params: Any, key: jax.Array) -> Any:
    """RL's first state from the SFT params; PPO's critic starts as a copy of them."""
    critic = params if trainer.config.needs_critic else None
    return trainer.init(params, key, critic)


def scores(episodes: Any) -> dict[str, jax.Array]:
    """Success rate and mean turns of a batch of episodes."""
    return {
        "success": (episodes.rewards.sum(axis=1) > 0).mean(),
        "turns": episodes.num_turns.mean(),
    }


def keys(seeds: int) -> dict[str, jax.Array]:
    """Apart from each other: the demos', the held-out episodes', and one per seed."""
    demo_key, held_key, seeds_key = jax.random.split(jax.random.key(0), 3)
    return {"demos": demo_key, "held_out": held_key, "seeds": jax.random.split(seeds_key, seeds)}


def run_guessing(
    task: Task, sizes: Sizes, algorithm: str, demos: Any, all_keys: dict
) -> dict[str, Any]:
    """The seeds vmapped in one compiled call: SFT, held-out, RL, held-out."""
    lm, trainer = build(task, sizes, algorithm)

    def evaluate(params):
        return scores(
            rollout_episodes(
                lm.kv_cache, params, task.env, all_keys["held_out"], sizes.held_out,
                trainer.settings,
            )
        )  # fmt: skip

    def one_seed(key):
        init_key, sft_key, rl_key = jax.random.split(key, 3)
        params, sft_loss = d.train_on_demos(
            lm.policy_apply, lm.init(init_key), demos, sft_key, steps=sizes.sft_steps,
            batch_size=sizes.sft_batch, learning_rate=sizes.sft_lr,
        )  # fmt: skip
        after_sft = evaluate(params)
        state = init_state(trainer, params, init_key)
        steps = jax.random.split(rl_key, sizes.guessing_steps)
        state, metrics = jax.lax.scan(trainer.step, state, steps)
        curves = {"success": metrics["episodes/return"], "turns": metrics["episodes/turns"]}
        return sft_loss, after_sft, evaluate(state.params["policy"]), curves

    sft_loss, after_sft, after_rl, curves = jax.jit(jax.vmap(one_seed))(all_keys["seeds"])
    return {"sft_loss": sft_loss, "sft": after_sft, "rl": after_rl, "curves": curves}


def run_calculator(
    task: Task, sizes: Sizes, algorithm: str, demos: Any, all_keys: dict
) -> dict[str, Any]:
    """SFT vmapped over the seeds; then each seed's held-out scores and RL on the host."""
    lm, trainer = build(task, sizes, algorithm)
    split = jax.vmap(lambda key: jax.random.split(key, 3))(all_keys["seeds"])

    def sft(init_key, sft_key):
        return d.train_on_demos(
            lm.policy_apply, lm.init(init_key), demos, sft_key, steps=sizes.sft_steps,
            batch_size=sizes.sft_batch, learning_rate=sizes.sft_lr,
        )  # fmt: skip

    sft_params, sft_loss = jax.jit(jax.vmap(sft))(split[:, 0], split[:, 1])
    held_out = HostRollout(lm.kv_cache, task.env, sizes.held_out, trainer.settings)
    rows: dict[str, list] = {"sft": [], "rl": [], "curves": []}
    for seed in range(split.shape[0]):
        params = jax.tree.map(lambda leaf, s=seed: leaf[s], sft_params)
        rows["sft"].append(scores(held_out(params, all_keys["held_out"])))
        state = init_state(trainer, params, split[seed, 0])
        curve = []
        for step_key in jax.random.split(split[seed, 2], sizes.calculator_steps):
            state, metrics = trainer.step(state, step_key)
            curve.append((metrics["episodes/return"], metrics["episodes/turns"]))
        rows["rl"].append(scores(held_out(state.params["policy"], all_keys["held_out"])))
        rows["curves"].append(np.asarray(curve))
    stack = {k: jax.tree.map(lambda *v: np.stack(v), *rows[k]) for k in ("sft", "rl")}
    curves = np.stack(rows["curves"])  # [seeds, steps, 2]
    return {
        "sft_loss": sft_loss,
        **stack,
        "curves": {"success": curves[..., 0], "turns": curves[..., 1]},
    }


def consistent_guessing(values: int, turns: int) -> tuple[float, float]:
    """Exact (success rate, mean turns) of the guessing script on ``values`` numbers left and
    ``turns`` turns: a uniform guess among them, then the same on the side the reply names."""
    if values == 0 or turns == 0:
        return 0.0, 0.0
    win, spent = 1.0 / values, 1.0
    for guess in range(values):
        for left in (guess, values - 1 - guess):
            if left:
                more_win, more_turns = consistent_guessing(left, turns - 1)
                win += left / values**2 * more_win
                spent += left / values**2 * more_turns
    return win, spent


def binary_search_turns(values: int) -> float:
    """Mean turns of binary search (the middle, rounded down) on ``values`` uniform numbers."""
    if values == 0:
        return 0.0
    below, above = (values - 1) // 2, values - 1 - (values - 1) // 2
    return 1.0 + (below * binary_search_turns(below) + above * binary_search_turns(above)) / values


def listed(values: Any) -> list:
    return [rounded(v) for v in np.asarray(values).reshape(-1)]


def summary(task: Task, sizes: Sizes, demos: Any, out: dict, seconds: float) -> dict[str, Any]:
    """The JSON section of one env."""
    demo_scores = scores(demos)
    return {
        "env": repr(task.env) if task.name == "guessing" else "Calculator(num_digits=3)",
        "turn_len": task.turn_len,
        "max_turns": task.max_turns,
        "demos": {
            "count": int(demos.tokens.shape[0]),
            "success": rounded(demo_scores["success"]),
            "turns": rounded(demo_scores["turns"]),
        },
        "held_out": {
            stage: {name: listed(values) for name, values in out[stage].items()}
            for stage in ("sft", "rl")
        },
        "mean": {
            stage: {name: rounded(np.mean(values)) for name, values in out[stage].items()}
            for stage in ("sft", "rl")
        },
        "sft_loss_first_last": [
            [rounded(row[0]), rounded(row[-1])] for row in np.asarray(out["sft_loss"])
        ],
        "rl_curves": {name: np.asarray(v).round(4).tolist() for name, v in out["curves"].items()},
        "wall_seconds_with_compile": rounded(seconds, 1),
    }


def plot(result: dict[str, Any], path: Path) -> None:
    algorithm = result.get("algorithm", "grpo").upper()
    plt = pyplot()

    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    for row, name in zip(axes, ("guessing", "calculator"), strict=True):
        part = result[name]
        for ax, metric in zip(row, ("success", "turns"), strict=True):
            for seed, curve in enumerate(part["rl_curves"][metric]):
                steps, means = moving_mean(curve, max(1, len(curve) // 20))
                (line,) = ax.plot(steps, means, label=f"seed {seed}")
                ends = [part["held_out"]["sft"][metric][seed], part["held_out"]["rl"][metric][seed]]
                ax.plot([0, len(curve)], ends, "o", color=line.get_color())
            ax.set_title(f"{name}: {metric}", fontsize=10)
            ax.set_xlabel(f"{algorithm} step")
        row[0].set_ylabel("success rate")
        row[1].set_ylabel("turns per episode")
        row[0].legend(fontsize=8)
    fig.suptitle(
        f"SFT on scripted demos, then {algorithm}, from random weights on CPU\n"
        "lines: training episodes (moving mean); dots: held-out after SFT (step 0) and after RL",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run(
    seeds: int, sizes: Sizes, algorithm: str, envs: list[str], out: Path, argv: list[str]
) -> dict:
    all_keys = keys(seeds)
    result: dict[str, Any] = {
        "benchmark": "agents_sft",
        **record(__file__, argv),
        "algorithm": algorithm,
        "sizes": dataclasses.asdict(sizes),
        "evaluation": f"{sizes.held_out} held-out episodes per seed, sampled at temperature 1, "
        "from a key apart from the demos' and training's; the same episodes for every seed",
    }
    runners = {"guessing": run_guessing, "calculator": run_calculator}
    result["guessing_yardsticks"] = {
        "consistent_random_guess": [rounded(v) for v in consistent_guessing(10, 4)],
        "binary_search": [1.0, rounded(binary_search_turns(10))],
        "as": "[success rate, mean turns] over uniform secrets",
    }
    for name in envs:
        task = TASKS[name]
        started = time.perf_counter()
        _, trainer = build(task, sizes, algorithm)
        count = getattr(sizes, f"{name}_demos")
        demos = d.play_demos(task.env, task.script, all_keys["demos"], count, trainer.settings)
        outcome = jax.device_get(runners[name](task, sizes, algorithm, demos, all_keys))
        result[name] = summary(task, sizes, demos, outcome, time.perf_counter() - started)
        print(name, result[name]["mean"], flush=True)
    write_json(out, result)
    if set(envs) == set(TASKS):
        plot(result, out.with_suffix(".png"))
    return result


def table(grpo: dict[str, Any], ppo: dict[str, Any] | None) -> str:
    """Held-out success and turns per env and seed: after SFT, after SFT + GRPO and, where the
    PPO file is there, after SFT + PPO (the two runs share their SFT: same keys and demos)."""
    algorithms = [("GRPO", grpo)] + ([("PPO", ppo)] if ppo else [])
    header = ["env", "seed"]
    for metric in ("success", "turns"):
        header += [f"{metric} after SFT"] + [f"SFT + {name}" for name, _ in algorithms]
    rows = []
    for env in TASKS:
        sft = grpo[env]["held_out"]["sft"]
        for other_name, other in algorithms[1:]:
            if other[env]["held_out"]["sft"] != sft:
                raise ValueError(f"{env}: the {other_name} run's SFT differs from GRPO's")
        for seed in range(len(sft["success"])):
            row = [env, seed]
            for metric, digits in (("success", 3), ("turns", 2)):
                row.append(f"{sft[metric][seed]:.{digits}f}")
                row += [
                    f"{r[env]['held_out']['rl'][metric][seed]:.{digits}f}" for _, r in algorithms
                ]
            rows.append(row)
    return markdown_table(header, rows)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--envs", nargs="+", choices=list(TASKS), default=list(TASKS))
    parser.add_argument("--algorithm", choices=("grpo", "ppo"), default="grpo")
    parser.add_argument(
        "--out", type=Path, help="the JSON file, .png beside it (default: results/agents_sft.json, "
        "with --algorithm ppo agents_sft_ppo.json)",
    )  # fmt: skip
    parser.add_argument("--plot-only", action="store_true", help="redraw the plot from --out")
    parser.add_argument("--table", action="store_true", help="print the results as markdown")
    add_size_flags(parser, Sizes)
    args = parser.parse_args(argv)
    if args.table:
        ppo = json.loads(RESULT_PPO.read_text()) if RESULT_PPO.exists() else None
        print(table(json.loads(RESULT.read_text()), ppo))
        return
    args.out = args.out or (RESULT_PPO if args.algorithm == "ppo" else RESULT)
    if args.plot_only:
        plot(json.loads(args.out.read_text()), args.out.with_suffix(".png"))
        return
    sizes = with_size_flags(Sizes(), args)
    run(args.seeds, sizes, args.algorithm, args.envs, args.out, argv)


if __name__ == "__main__":
    main()
