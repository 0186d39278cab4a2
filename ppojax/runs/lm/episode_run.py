"""``ppojax rlhf``'s episode form: the built-in transformer, from random weights, or a Hugging
Face folder (``--model``), trained with GRPO, RLOO or PPO on multi-turn episodes of a text env
(``ppojax.rlhf.envs``) into a run folder.

    ppojax rlhf --env guessing --env-arg num_values=4 --turns 2 --steps 300
    ppojax rlhf --env calculator --env-arg num_digits=1 --turns 2 --turn-len 4 --algorithm ppo
    ppojax rlhf --resume runs/rlhf-guessing-grpo-<time> [--steps 600]
    ppojax rlhf --env-module my_env.py --env mine --sft-steps 200 --steps 100
    ppojax rlhf --env calculator --model path/to/Qwen2.5-0.5B-Instruct --turn-len 16

A JAX env plays inside the compiled chunks of ``ppojax.runs.loop``; a Python env (the
calculator) is stepped on the host (``HostRollout``), the loop calling the step once per step.
Everything the command can check is checked before the run folder is made
(``episode_checks``). An episode the env never ends stops at ``--turns`` turns or
``--token-budget`` tokens, counted in ``episodes/truncated``. The run folder is the RLHF one
(``ppojax.runs.lm.run``); summary.json adds the held-out success, return, turns and
truncated share of ``--eval-episodes`` episodes at step 0, after SFT (``--sft-steps``,
``episode_sft``) and after training, success by the env's own rule (``env.success_rule``).
``--env-module`` imports a module that registers text envs; config.json keeps it for
``--resume``. The flags and the settings they make are ``episode_settings``'s, the env, model
and trainer made from the settings ``episode_setup``'s; this module trains and reports.

With ``--model FOLDER`` the env is one over text (its factory takes ``chat``, a
``ChatFormat``, and returns a ``ChatEnv``: the calculator's does), built through the folder's
tokenizer and chat template; the policy (and PPO's critic, with a value head at 0) starts
from the folder's weights, in ``--dtype``, and the trained policy is saved as a Hugging Face
folder in ``final/``. config.json keeps the folder's absolute path (``model.folder``) for
``--resume``. A JAX token env has no text form: ``--model`` with one is refused.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ppojax.rlhf.core.episode_trainer import EpisodeTrainer
from ppojax.rlhf.core.episodes import EnvOutputError, check_env_faults, rollout_episodes
from ppojax.rlhf.core.host_rollout import HostRollout
from ppojax.rlhf.core.trainer import RLHFState, policy_params_fn
from ppojax.rlhf.envs.env import success_rule
from ppojax.rlhf.envs.host import HostEnvError, runs_on_host
from ppojax.runs import folder
from ppojax.runs.lm import episode_sft
from ppojax.runs.lm.episode_settings import (
    build_parser,
    check_counts,
    check_resume_flags,
    resumed_settings,
    settings_from_args,
)
from ppojax.runs.lm.episode_setup import Prepared, prepare
from ppojax.runs.lm.run import PLOT_FILE, write_loop_summary
from ppojax.runs.lock import run_lock
from ppojax.runs.loop import RunDiverged, never_recovered, train_loop
from ppojax.runs.options import RunOptions
from ppojax.runs.plots import plot_metrics
from ppojax.runtime import cache

BAR_METRICS = ("episodes/return", "episodes/turns")


def episode_step(trainer: EpisodeTrainer):
    """``step(frozen, state, key)`` of ``train_loop``: one trainer step, with
    ``episodes/truncated``, the share of episodes a turn or token budget ended."""

    def step(frozen: Any, state: RLHFState, key: jax.Array):
        state, metrics = trainer.step(state, key)
        return state, {**metrics, "episodes/truncated": 1.0 - metrics["episodes/terminated"]}

    return step


def evaluator(
    prepared: Prepared, count: int, greedy: bool = False
) -> Callable[[Any, jax.Array], dict[str, float]]:
    """``evaluate(params, key)``: ``count`` episodes of the policy ``params`` from ``key``
    (compiled once for every call), argmax tokens with ``greedy``: the share of successes as
    the env defines them (``success``, its rule in ``success_rule``: ``env.success_rule``),
    the mean return and turns, the share truncated."""
    env, lm = prepared.env, prepared.lm
    rule = success_rule(env)
    settings = dataclasses.replace(prepared.trainer.settings, greedy=greedy)
    if runs_on_host(env):
        play = HostRollout(lm.kv_cache, env, count, settings)
    else:
        rollout = functools.partial(
            rollout_episodes, lm.kv_cache, env=env, batch_size=count, settings=settings
        )
        play = jax.jit(lambda params, key: rollout(params, key=key))

    def evaluate(params: Any, key: jax.Array) -> dict[str, float]:
        episodes = play(params, key)
        rewards, terminated = np.asarray(episodes.rewards), np.asarray(episodes.terminated)
        returns, turns = rewards.sum(axis=1), np.asarray(episodes.num_turns)
        return {
            "episodes": count,
            "success": round(float(np.mean(rule.judge(rewards, turns, terminated))), 4),
            "success_rule": rule.says,
            "return": round(float(np.mean(returns)), 4),
            "turns": round(float(np.mean(turns)), 4),
            "truncated": round(float(np.mean(~terminated)), 4),
            "greedy": greedy,
        }

    return evaluate


def train(
    settings: dict[str, Any], prepared: Prepared, run_dir: Path, args: Any, demos: Any = None
) -> int:
    """Train the run folder ``run_dir`` to its steps through ``train_loop`` (after SFT on
    ``demos`` when the settings ask for it: ``episode_sft``), write curves.png and, unless the
    run diverged (``RunDiverged``), summary.json with the held-out episodes at step 0, after
    SFT and at the end."""
    run, episodes = settings["run"], settings["episodes"]
    seed_key = jax.random.key(run["seed"])
    # a folder from before --eval-greedy sampled its held-out episodes
    evaluate = evaluator(prepared, episodes["eval_episodes"], episodes.get("eval_greedy", False))
    eval_key = jax.random.fold_in(seed_key, 3)  # apart from init (1) and training (2)
    config = prepared.trainer.config
    policy = policy_params_fn(config, prepared.state.reference)  # LoRA: merged
    held_out = {"held_out_start": evaluate(policy(prepared.state.params), eval_key)}
    if settings.get("sft"):  # a folder from before --sft-steps has none
        prepared, record = episode_sft.trained_before_rl(
            settings, prepared, run_dir, demos, lambda params: evaluate(params, eval_key)
        )
        held_out["held_out_sft"] = record["held_out"]
    result = train_steps(settings, prepared, run_dir, args, jax.random.fold_in(seed_key, 2))
    names = ("episodes/return", "episodes/turns", "episodes/truncated", "objective/kl")
    plot_metrics(run_dir / PLOT_FILE, result.metrics, names)
    diverged = never_recovered(result.metrics)
    if diverged is not None:
        raise RunDiverged(diverged.replace("No final/ is written: its", "Its"))
    policy = policy_params_fn(config, result.state.reference)  # a resumed run's own reference
    held_out["held_out"] = evaluate(policy(result.state.params), eval_key)
    if "folder" in settings["model"]:  # a --model run: the trained policy as an HF folder
        from ppojax.engine import precision
        from ppojax.runs.lm.jobs import model_dtype
        from ppojax.runs.lm.text_run import save_final

        trained = precision.cast(policy(result.state.params), model_dtype(prepared.lm))
        save_final(prepared.lm, trained, run_dir)
    write_loop_summary(run_dir, result, **held_out)
    print(f"run folder: {run_dir}")
    if "folder" in settings["model"]:
        print(f"final model: {run_dir / 'final'}")
    print_held_out(held_out, run["steps"])
    return 0


def train_steps(
    settings: dict[str, Any], prepared: Prepared, run_dir: Path, args: Any, key: jax.Array
) -> Any:
    """The RL steps of ``run_dir`` through ``train_loop`` from ``key``, each chunk's env output
    checked (``check_env_faults``) before its checkpoint is written."""
    run = settings["run"]
    env_name, vocab_size = repr(settings["env"]["id"]), prepared.lm.config.vocab_size

    def check_env_output(first: int, state: Any, metrics: dict[str, np.ndarray]) -> None:
        # before the chunk is kept: its checkpoint would hold what the env's output did
        check_env_faults(metrics, env_name, vocab_size, first)

    options = RunOptions(
        progress=not args.no_progress,
        checkpoint_every=run["checkpoint_every"],
        keep_checkpoints=None,
    )
    return train_loop(
        run_dir,
        episode_step(prepared.trainer),
        prepared.state,
        None,
        key,
        options,
        num_steps=run["steps"],
        resume=args.resume is not None,
        seed=run["seed"],
        bar_metrics=BAR_METRICS,
        host_steps=runs_on_host(prepared.env),
        checks=(check_env_output,),
    )


def print_held_out(held_out: dict[str, dict[str, Any]], steps: int) -> None:
    """The held-out table: success (by the env's rule, said), mean return and turns at step
    0, after SFT (when it ran) and at ``steps``."""
    end = held_out["held_out"]
    played = "argmax" if end["greedy"] else "sampled"
    print(
        f"held-out success ({end['success_rule']}), mean return and turns of "
        f"{end['episodes']} episodes ({played}):"
    )
    labels = {"held_out_start": "step 0", "held_out_sft": "after SFT", "held_out": f"step {steps}"}
    for part, label in labels.items():
        if part in held_out:
            row = held_out[part]
            print(
                f"  {label:<11} success {row['success']:.3f}  return {row['return']:.3f}  "
                f"turns {row['turns']:.2f}"
            )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, check everything, make or reopen the run folder and train. Bad input
    is a ``ValueError`` (the caller prints it, exit status 2) raised before the folder is
    made; an env failing during training (a Python env at once, a JAX env's bad ids or
    rewards at the end of the chunk, ``check_env_faults``), one line and 2 (the folder kept
    at its last checkpoint); a run that diverged and never recovered, one line and 3."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if not args.no_compile_cache and not cache.disabled_by_environment():
        cache.enable_compile_cache()
    demos = None
    with contextlib.ExitStack() as stack:  # this process the folder's one writer till done
        if args.resume is not None:
            run_dir = args.resume
            folder.require_run_folder(run_dir)
            check_resume_flags(run_dir, argv)
            check_counts(args)
            stack.enter_context(run_lock(run_dir))  # before a resume reads anything
            settings = resumed_settings(run_dir, args.steps)
            prepared = prepare(settings)
            if settings.get("sft") and not episode_sft.sft_done(run_dir):
                # the SFT is trained again: its demonstrations checked before a write
                demos = episode_sft.demonstrations(settings, prepared)
        else:
            settings = settings_from_args(args)
            prepared = prepare(settings)
            if settings["sft"]:  # played now: a script that fails makes no folder
                demos = episode_sft.demonstrations(settings, prepared)
            name = f"rlhf-{settings['env']['id']}-{settings['rlhf']['algorithm']}"
            run_dir = folder.new_run_dir(args.out, name)
            stack.enter_context(run_lock(run_dir))
        folder.write_json(run_dir / folder.CONFIG_FILE, settings)
        try:
            return train(settings, prepared, run_dir, args, demos)
        except (HostEnvError, EnvOutputError) as error:
            sys.stderr.write(
                f"ppojax rlhf: error: {error}; the run stopped there, {run_dir} keeps its last "
                f"checkpoint: fix the env, then continue with --resume {run_dir}\n"
            )
            return 2
        except RunDiverged as error:
            sys.stderr.write(f"ppojax rlhf: error: {error}\n")
            return 3


if __name__ == "__main__":
    raise SystemExit(main())
