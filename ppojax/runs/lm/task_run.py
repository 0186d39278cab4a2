"""``ppojax rlhf``'s task form (or ``python -m ppojax.rlhf``): train on a digit task into a run
folder. Its model form, a Hugging Face model on a prompt file, trains through ``ppojax rlhf
--model`` (``ppojax.cli.text``); ``ppojax.cli.rlhf`` tells the two apart.

    ppojax rlhf --task sorting --algorithm ppo --kl-coef 0.1 --steps 200
    ppojax rlhf --task reversal --algorithm grpo --group-size 8 --steps 100
    ppojax rlhf --resume runs/rlhf-reversal-grpo-<time>

The sorting task trains an SFT model and a reward model first, then RL against the reward
model (its gold score logged with weight 0); the reversal task trains SFT, then RL against
its checker. Every RLHFConfig field is an option (``--kl-in loss``,
``--lora-targets c_attn,c_proj``); the run folder is described in ``ppojax.runs.lm.run``.
This module is the application: it is the one place that imports both the library and the
tasks.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax

from ppojax.rlhf.core.config import add_config_flags
from ppojax.rlhf.core.episode_trainer import make_trainer
from ppojax.rlhf.models.transformer import zero_value_head
from ppojax.rlhf.post.reward_model import reward_model
from ppojax.rlhf.tasks.digits import EOS, PAD, DigitTask
from ppojax.rlhf.tasks.reversal import checker, reversal_sft
from ppojax.rlhf.tasks.sorting import SORTING, RewardModelConfig, gold, sorting_sft
from ppojax.rlhf.tasks.sorting import train_reward_model as train_sorting_rm
from ppojax.runs import folder
from ppojax.runs.lm.run import load_frozen, save_frozen, train_run
from ppojax.runs.lm.settings import add_folder_flags, config_dict, given_fields, rlhf_config
from ppojax.runs.lock import run_lock
from ppojax.runs.loop import RunDiverged
from ppojax.runtime import cache

# Fields the task fixes: the vocabulary and the answer's length are the task's.
TASK_FIELDS = ("pad_id", "eos_id", "response_len")
# The flags config.json's "run" keeps as they were given, in this order.
RUN_FLAGS = ("task", "steps", "batch_size", "seed", "checkpoint_every", "rm_steps")
SMALL = dict(
    num_digits=6,
    min_digits=2,
    max_digits=4,
    response_len=5,
    d_model=16,
    num_heads=2,
    num_layers=1,
    sft_steps=4,
    sft_batch_size=8,
)


def build_parser() -> argparse.ArgumentParser:
    """The run's options plus one option per RLHFConfig field (unset: the default)."""
    parser = argparse.ArgumentParser(
        prog="ppojax rlhf",
        description="PPO, GRPO or RLOO on a digit task, into a run folder (the task form).",
        epilog="The model form trains a Hugging Face folder on a prompt file instead: ppojax "
        "rlhf --model FOLDER --prompts FILE.jsonl --reward MODULE:FUNCTION (and/or "
        "--reward-model FOLDER); ppojax rlhf --model FOLDER --help lists its options, ppojax "
        "rlhf --help both forms'.",
    )
    parser.add_argument("--task", choices=("sorting", "reversal"), default="sorting")
    parser.add_argument("--steps", type=int, default=200, help="RL steps (200)")
    parser.add_argument("--batch-size", type=int, default=64, help="prompts per step (64)")
    parser.add_argument("--seed", type=int, default=0)
    add_folder_flags(parser)
    parser.add_argument("--sft-steps", type=int, help="the task's SFT steps")
    parser.add_argument("--rm-steps", type=int, default=600, help="sorting: reward-model steps")
    parser.add_argument("--small", action="store_true", help="a tiny task and model (tests)")
    add_config_flags(parser, TASK_FIELDS)
    return parser


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Everything a run folder's config.json holds, from fresh command-line arguments."""
    task = DigitTask(**SMALL) if args.small else SORTING if args.task == "sorting" else DigitTask()
    if args.sft_steps is not None:
        task = task.replace(sft_steps=args.sft_steps)
    chosen = given_fields(args, TASK_FIELDS)
    if args.task == "sorting" and chosen.get("reward_weights") is None:
        chosen["reward_weights"] = (1.0, 0.0)  # the reward model; gold is only logged
    config = rlhf_config(chosen, pad_id=PAD, eos_id=EOS, response_len=task.response_len)
    run = {name: getattr(args, name) for name in RUN_FLAGS}
    return {"rlhf": config_dict(config), "task": config_dict(task), "run": run}


def frozen_params(settings: dict[str, Any], run_dir: Path, resume: bool) -> dict[str, Any]:
    """The SFT params (policy start and reference) and, for sorting, the reward model's:
    trained and saved into the run folder, or read back from it on resume."""
    task, run = DigitTask(**settings["task"]), settings["run"]
    sft_key, rm_key = jax.random.split(jax.random.key(run["seed"]))
    names = ("sft", "reward") if run["task"] == "sorting" else ("sft",)
    if resume:
        shapes = jax.eval_shape(task.model().init, sft_key)
        return load_frozen(run_dir, {name: shapes for name in names})
    sft = reversal_sft if run["task"] == "reversal" else sorting_sft
    frozen = {"sft": jax.jit(sft, static_argnums=0)(task, sft_key)[0]}
    if run["task"] == "sorting":
        stage = RewardModelConfig(steps=run["rm_steps"], batch_size=run["batch_size"])
        train = jax.jit(train_sorting_rm, static_argnums=(0, 1))
        frozen["reward"], metrics = train(task, stage, frozen["sft"], rm_key)
        print(f"reward model: held-out pair accuracy {float(metrics['held_out_accuracy']):.3f}")
    save_frozen(run_dir, frozen)
    return frozen


def prepare(settings: dict[str, Any], frozen: dict[str, Any]):
    """The trainer, its state at step 0 and the prompt source of a run's settings."""
    task, run = DigitTask(**settings["task"]), settings["run"]
    config = rlhf_config(settings["rlhf"])
    lm = task.model()
    if run["task"] == "sorting":
        rewards = [reward_model(lm.critic_apply, frozen["reward"]), gold]
    else:
        rewards = [checker]
    critic = lm.critic_apply if config.needs_critic else None
    trainer = make_trainer(config, lm.policy_apply, rewards, critic, kv_cache=lm.kv_cache)
    critic_params = zero_value_head(frozen["sft"]) if config.needs_critic else None
    init_key = jax.random.fold_in(jax.random.key(run["seed"]), 1)
    state = trainer.init(frozen["sft"], init_key, critic_params)

    def prompt_fn(key: jax.Array):
        return task.prompts(key, run["batch_size"])

    return trainer, state, prompt_fn


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, make or reopen the run folder, train, print where it went. A Hugging
    Face folder (``--model``) trains through ``ppojax rlhf`` (``ppojax.cli.text``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(word == "--model" or word.startswith("--model=") for word in argv):
        raise ValueError("a model folder trains through the command line: ppojax rlhf --model")
    args = build_parser().parse_args(argv)
    if not args.no_compile_cache and not cache.disabled_by_environment():
        cache.enable_compile_cache()
    with contextlib.ExitStack() as stack:  # this process the folder's one writer till done
        if args.resume is not None:
            run_dir = args.resume
            folder.require_run_folder(run_dir)
            stack.enter_context(run_lock(run_dir))  # before a resume reads anything
            settings = folder.read_json(run_dir / folder.CONFIG_FILE)
        else:
            settings = settings_from_args(args)
            name = f"rlhf-{args.task}-{settings['rlhf']['algorithm']}"
            run_dir = folder.new_run_dir(args.out, name)
            stack.enter_context(run_lock(run_dir))
            folder.write_json(run_dir / folder.CONFIG_FILE, settings)
        try:
            return train(settings, run_dir, args)
        except RunDiverged as error:  # ppojax train's code for a run that never recovered
            sys.stderr.write(f"ppojax rlhf: error: {error}\n")
            return 3


def train(settings: dict[str, Any], run_dir: Path, args: argparse.Namespace) -> int:
    """Train the run folder ``run_dir`` of ``settings`` (its frozen inputs made or read back),
    then print where it went."""
    frozen = frozen_params(settings, run_dir, args.resume is not None)
    trainer, state, prompt_fn = prepare(settings, frozen)
    run = settings["run"]
    key = jax.random.fold_in(jax.random.key(run["seed"]), 2)
    _, metrics = train_run(
        run_dir,
        trainer,
        state,
        prompt_fn,
        key,
        num_steps=run["steps"],
        chunk=run["checkpoint_every"],
        resume=args.resume is not None,
        progress=not args.no_progress,
        seed=run["seed"],
    )
    last = {name: float(values[-1]) for name, values in metrics.items()}
    print(f"run folder: {run_dir}")
    print(
        f"step {run['steps']}: score {last['objective/scores']:.3f}, KL {last['objective/kl']:.2f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
