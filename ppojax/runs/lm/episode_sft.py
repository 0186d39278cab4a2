"""SFT on a text env's demonstrations before RL, for ``ppojax rlhf --env ID --sft-steps N``:
the env's script (``demos.env_script``) plays ``--sft-demos`` episodes, or the episodes of
``--sft-demos-file`` are replayed against the env (``episode_demos``), checked before the run
folder is made; in the folder, ``train_on_demos`` trains the model from random weights on
them, and RL starts from the SFT weights, the SFT model its reference.

The folder's config.json keeps the SFT settings (``sft``) and sft.json the SFT's loss curve
and held-out episodes after it. A ``--resume`` of a folder with a checkpoint goes on from
it; one without (stopped before its first chunk was kept) plays the same demonstrations and
trains the same SFT again: every key comes from the seed.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import Any

import jax

from ppojax.rlhf.core.trainer import policy_params_fn
from ppojax.rlhf.core.turns import Episodes
from ppojax.rlhf.models.transformer import zero_value_head
from ppojax.rlhf.post.demos import env_script, play_demos, train_on_demos
from ppojax.runs import folder
from ppojax.runs.lm import episode_demos

SFT_FILE = "sft.json"
# Each SFT flag's default when --sft-steps is given (benchmarks/agents_sft.py's batch and
# learning rate).
DEFAULTS = {"demos": 256, "batch_size": 32, "learning_rate": 1e-3}
# The keys of the demonstrations and of the SFT batches, folded into the seed's key, apart
# from the run's init (1), training (2) and held-out episodes (3).
DEMO_KEY, SFT_KEY = 4, 5


def add_sft_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sft-steps",
        type=int,
        default=0,
        help="SFT steps on the env's demonstrations before RL (0: none); the env plays them "
        "with its demonstrate() script (the built-in envs have one), or --sft-demos-file's",
    )
    parser.add_argument(
        "--sft-demos", type=int, help=f"demonstration episodes ({DEFAULTS['demos']})"
    )
    parser.add_argument(
        "--sft-demos-file",
        type=Path,
        metavar="FILE.jsonl",
        help="demonstrations from a file instead of the env's script: one episode a line, "
        '{"seed": S, "turns": [[ids], ...]} (docs/rlhf.md), replayed against the env',
    )
    parser.add_argument(
        "--sft-batch-size", type=int, help=f"demonstrations per SFT step ({DEFAULTS['batch_size']})"
    )
    parser.add_argument(
        "--sft-learning-rate", type=float, help=f"SFT's Adam ({DEFAULTS['learning_rate']:g})"
    )


def sft_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """config.json's ``sft`` of the SFT flags (None without ``--sft-steps``; with
    ``--sft-demos-file``, ``demos`` its episode count and ``demos_file`` its path and sha256);
    a ``ValueError`` naming the flag for a count below 1, a rate not above 0, an SFT flag
    given without ``--sft-steps``, both ``--sft-demos`` and ``--sft-demos-file``, or a bad
    line of the file (``episode_demos``)."""
    given = {name: getattr(args, f"sft_{name}") for name in (*DEFAULTS, "demos_file")}
    if args.sft_steps < 0:
        raise ValueError(f"--sft-steps must be at least 0, got {args.sft_steps}")
    if not args.sft_steps:
        extra = [f"--sft-{name.replace('_', '-')}" for name, v in given.items() if v is not None]
        if extra:
            raise ValueError(f"{', '.join(extra)} set(s) up SFT: give --sft-steps N too")
        return None
    settings = {"steps": args.sft_steps}
    source = given.pop("demos_file")
    if source is not None:
        if given["demos"] is not None:
            raise ValueError(
                f"--sft-demos {given['demos']} and --sft-demos-file {source}: give one (the "
                "file's lines are the demonstrations)"
            )
        settings["demos_file"], given["demos"] = episode_demos.file_settings(source)
    for name, value in given.items():
        flag = f"--sft-{name.replace('_', '-')}"
        value = DEFAULTS[name] if value is None else value
        if value <= 0 or (name != "learning_rate" and value < 1):
            raise ValueError(f"{flag} must be above 0, got {value}")
        settings[name] = value
    return settings


def demonstrations(settings: dict[str, Any], prepared: Any) -> Episodes:
    """The demonstrations the run's ``sft`` settings ask of its env, in the trainer's episode
    layout: its script's, or ``sft.demos_file``'s lines replayed (``episode_demos``); a
    ``ValueError`` naming ``--sft-steps`` and the env for an env without a script,
    a token budget (demonstrations play none), or a script's turn that does not fit."""
    env_id = settings["env"]["id"]
    turn = prepared.trainer.settings
    source = settings["sft"].get("demos_file")  # a folder from before the flag has none
    if source is not None:
        vocab_size = prepared.lm.config.vocab_size
        return episode_demos.replay_file(source, prepared.env, env_id, turn, vocab_size)
    script = env_script(prepared.env)
    if script is None:
        raise ValueError(
            f"--sft-steps: text env {env_id!r} has no demonstrations; give it a method "
            "demonstrate(rng, prompt, history) -> response ids (docs/rlhf.md, SFT on "
            "demonstrations), or leave --sft-steps out"
        )
    if turn.token_budget is not None:
        raise ValueError("--sft-steps plays demonstrations without a token budget: leave out "
                         f"--token-budget {turn.token_budget}")  # fmt: skip
    key = jax.random.fold_in(jax.random.key(settings["run"]["seed"]), DEMO_KEY)
    try:
        return play_demos(prepared.env, script, key, settings["sft"]["demos"], turn)
    except ValueError as error:
        raise ValueError(f"--sft-steps: text env {env_id!r}'s demonstrate(): {error}") from None


def sft_done(run_dir: Path) -> bool:
    """Whether the folder ``run_dir`` has its SFT's record and a checkpoint after it: a
    ``--resume`` of it trains no SFT and needs no demonstrations."""
    saved = Path(run_dir) / folder.CHECKPOINT_DIR
    has_checkpoint = any(step.name.isdigit() for step in saved.glob("*"))
    return (Path(run_dir) / SFT_FILE).is_file() and has_checkpoint


def trained_before_rl(
    settings: dict[str, Any], prepared: Any, run_dir: Path, demos: Episodes | None, evaluate: Any
) -> tuple[Any, dict[str, Any]]:
    """``prepared`` starting RL from the SFT weights, and sft.json's record (the SFT's loss
    and held-out episodes after it, played by ``evaluate(params)``). A folder with a
    checkpoint keeps its record and goes on from its checkpoint (``prepared`` as it is, the
    template it restores into); otherwise the SFT runs, on ``demos`` (None: played again)."""
    path = Path(run_dir) / SFT_FILE
    if sft_done(run_dir):
        return prepared, folder.read_json(path)
    sft = settings["sft"]
    demos = demonstrations(settings, prepared) if demos is None else demos
    config, state = prepared.trainer.config, prepared.state
    params = policy_params_fn(config, state.reference)(state.params)  # the random start
    seed_key = jax.random.key(settings["run"]["seed"])
    train = functools.partial(
        train_on_demos,
        prepared.lm.policy_apply,
        steps=sft["steps"],
        batch_size=sft["batch_size"],
        learning_rate=sft["learning_rate"],
    )
    params, losses = jax.jit(train)(params, demos, jax.random.fold_in(seed_key, SFT_KEY))
    losses = [round(float(loss), 5) for loss in losses]
    record = {**sft, "loss_first": losses[0], "loss_last": losses[-1], "loss": losses}
    record["held_out"] = evaluate(params)
    folder.write_json(path, record)
    critic = zero_value_head(params) if config.needs_critic else None
    init_key = jax.random.fold_in(seed_key, 1)  # as prepare's
    return prepared._replace(state=prepared.trainer.init(params, init_key, critic)), record
