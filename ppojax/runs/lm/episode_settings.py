"""The episode form's flags (``ppojax rlhf --env``), their checks, and the settings a run
folder's config.json holds: made from fresh flags (the env built to read its vocabulary, or
the ``--model`` folder's tokenizer), or read back from a ``--resume`` folder with its env
modules imported again. Bad input is a ``ValueError`` naming the flag, raised before a run
folder is made."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ppojax.envs.registry import import_env_modules, module_reference
from ppojax.rlhf.core.config import add_config_flags
from ppojax.rlhf.envs.chat import ChatFormat
from ppojax.rlhf.envs.env import text_env_ids
from ppojax.runs import folder
from ppojax.runs.lm import episode_checks as checks
from ppojax.runs.lm import episode_sft
from ppojax.runs.lm.settings import add_folder_flags, config_dict, given_fields, rlhf_config

# Fields the env and --turn-len fix: the env's vocabulary, the per-turn token limit.
ENV_FIELDS = ("pad_id", "eos_id", "response_len")
# The form's defaults where RLHFConfig's (made for fine-tuning a trained model) do not fit a
# model trained from random weights; benchmarks/agents.py's settings.
DEFAULTS = dict(
    algorithm="grpo",
    group_size=4,
    update_epochs=1,
    num_minibatches=1,
    learning_rate=3e-3,
    kl_coef=0.0,
)
# The built-in transformer's size without --d-model, --num-heads, --num-layers.
SIZE = {"d_model": 32, "num_heads": 2, "num_layers": 1}
# --dtype's choices, the model form's: the --model's params and compute.
DTYPES = ("float32", "bfloat16")
# With --model, the learning rate and KL penalty are RLHFConfig's, made for a trained model.
PRETRAINED_DEFAULTS = {k: v for k, v in DEFAULTS.items() if k not in ("learning_rate", "kl_coef")}
# What config.json holds.
SECTIONS = ("rlhf", "env", "episodes", "model", "run")
# Flags a --resume may give: the rest are the folder's (config.json).
RESUME_FLAGS = ("--resume", "--steps", "--no-progress", "--no-compile-cache")


def build_parser() -> argparse.ArgumentParser:
    """The episode form's options plus one per RLHFConfig field (unset: the form's default)."""
    parser = argparse.ArgumentParser(
        prog="ppojax rlhf",
        description="GRPO, RLOO or PPO on multi-turn episodes of a text env, the built-in "
        "model trained from random weights, into a run folder (the episode form).",
        epilog="ppojax rlhf --help lists every form's options.",
    )
    add_env_flags(parser)
    add_model_flags(parser)
    add_run_flags(parser)
    episode_sft.add_sft_flags(parser)
    helps = {name: f"default {value!r} (this form's)" for name, value in DEFAULTS.items()}
    for name in set(DEFAULTS) - set(PRETRAINED_DEFAULTS):
        helps[name] = f"default {DEFAULTS[name]!r} (this form's; with --model, RLHFConfig's)"
    add_config_flags(parser, ENV_FIELDS, helps)
    return parser


def add_env_flags(parser: argparse.ArgumentParser) -> None:
    """The env and its episodes: which env, its arguments, turns and tokens, the held-out
    episodes."""
    ids = ", ".join(text_env_ids())
    parser.add_argument("--env", metavar="ID", help=f"the text env: {ids}")
    parser.add_argument(
        "--env-module",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (a module name such as mypackage.envs, or the path of a .py file) "
        "first, which registers text envs with register_text_env; repeatable; config.json "
        "keeps where it is, so --resume imports it again",
    )
    parser.add_argument(
        "--env-arg",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an argument of the env's factory, VALUE read as JSON (repeat it): guessing "
        "takes num_values, calculator num_digits",
    )
    parser.add_argument("--turns", type=int, default=2, help="turns an episode at most (2)")
    parser.add_argument("--turn-len", type=int, default=2, help="tokens a turn at most (2)")
    parser.add_argument("--token-budget", type=int, help="model tokens an episode at most")
    parser.add_argument("--eval-episodes", type=int, default=256, help="held-out episodes (256)")
    parser.add_argument(
        "--eval-greedy",
        action="store_true",
        help="play the held-out episodes greedily (argmax tokens) instead of sampling them",
    )


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """The model: a Hugging Face folder and its dtype, or the built-in transformer's size."""
    parser.add_argument(
        "--model",
        type=Path,
        metavar="FOLDER",
        help="train this Hugging Face folder instead of the built-in transformer: the env "
        "(one over text, its factory taking chat=, as the calculator's) plays through its "
        "tokenizer and chat template; final/ holds the trained model",
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        help="with --model: its params and compute (float32); bfloat16 trains float32 masters",
    )
    parser.add_argument("--d-model", type=int, help="the built-in model's width (32)")
    parser.add_argument("--num-heads", type=int, help="the built-in model's attention heads (2)")
    parser.add_argument("--num-layers", type=int, help="the built-in model's layers (1)")


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The run: its steps, batch and seed, its folder, checkpoints and resume."""
    parser.add_argument("--steps", type=int, help="RL steps (200)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="resets per step, each played --group-size times (16)",
    )
    parser.add_argument("--seed", type=int, default=0)
    add_folder_flags(parser)


def check_counts(args: argparse.Namespace) -> None:
    """A ``ValueError`` naming the flag for a count below 1 or a width heads do not divide."""
    counts = "steps batch_size checkpoint_every turns turn_len eval_episodes token_budget"
    for name in (*counts.split(), *SIZE):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    size = model_size(args)
    if size["d_model"] % size["num_heads"]:
        raise ValueError(
            f"--d-model {size['d_model']} must be a multiple of --num-heads {size['num_heads']}"
        )


def model_size(args: argparse.Namespace) -> dict[str, int]:
    """The built-in transformer's size: the flags given, ``SIZE`` for the rest."""
    return {name: SIZE[name] if getattr(args, name) is None else getattr(args, name)
            for name in SIZE}  # fmt: skip


def check_model_flags(args: argparse.Namespace) -> None:
    """A ``ValueError`` naming the flags for a ``--model`` beside the built-in model's size,
    ``--sft-steps``, or a token env; or a ``--dtype`` without ``--model``; or a ``--model``
    that is no folder."""
    if args.model is None:
        if args.dtype is not None:
            raise ValueError(
                f"--dtype {args.dtype} is the --model's dtype; the built-in transformer "
                "trains in float32: give --model FOLDER, or drop --dtype"
            )
        return
    sized = [f"--{name.replace('_', '-')}" for name in SIZE if getattr(args, name) is not None]
    if sized:
        raise ValueError(
            f"{', '.join(sized)} size{'s' if len(sized) == 1 else ''} the built-in transformer; "
            f"--model {args.model} brings its own: drop {', '.join(sized)}"
        )
    if args.sft_steps:
        raise ValueError(
            "--sft-steps trains the built-in transformer on an env's demonstrations; with "
            f"--model {args.model} the episode form runs RL only: drop --sft-steps (or SFT "
            "the folder first with ppojax sft)"
        )
    names = checks.factory_arguments(args.env)
    if names is not None and "chat" not in names:
        raise ValueError(
            f"--model trains a Hugging Face folder on an env over text, through its chat "
            f"template; --env {args.env} is a token env (its factory takes no chat=): drop "
            "--model to train the built-in transformer on it"
        )
    if not args.model.is_dir():
        raise ValueError(f"--model {args.model}: no such folder (a Hugging Face model folder)")


def settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """Everything a run folder's config.json holds, from fresh command-line arguments (the
    env built, to read its vocabulary); ``--env-module`` imported first."""
    import_env_modules(args.env_module, "--env-module")
    if args.env is None:
        raise ValueError(f"give --env ID, a text env: {', '.join(text_env_ids())}")
    check_counts(args)
    check_model_flags(args)
    env_args = checks.parse_env_args(args.env_arg)
    if args.model is None:
        vocab = checks.vocabulary(args.env, checks.build_env(args.env, env_args, args.turns))
        model = model_size(args)
    else:
        vocab = checks.chat_vocabulary(ChatFormat(load_tokenizer(args.model)))
        model = {"folder": str(args.model.resolve()), "dtype": args.dtype or "float32"}
    chosen = given_fields(args, ENV_FIELDS)
    defaults = DEFAULTS if args.model is None else PRETRAINED_DEFAULTS
    config = rlhf_config(
        {**defaults, **chosen},
        pad_id=vocab.pad_id,
        eos_id=vocab.eos_id,
        response_len=args.turn_len,
    )
    return {
        "rlhf": config_dict(config),
        "env": {
            "id": args.env,
            "args": env_args,
            "modules": [module_reference(module) for module in args.env_module],
        },
        "episodes": {
            "turns": args.turns,
            "token_budget": args.token_budget,
            "eval_episodes": args.eval_episodes,
            "eval_greedy": args.eval_greedy,
        },
        "model": model,
        "run": {
            "steps": 200 if args.steps is None else args.steps,
            "batch_size": args.batch_size,
            "seed": args.seed,
            "checkpoint_every": args.checkpoint_every,
        },
        "sft": episode_sft.sft_settings(args),
    }


def load_tokenizer(model: Path) -> Any:
    """The tokenizer (and chat template) of the Hugging Face folder ``model``."""
    from ppojax.rlhf.models.tokenizer import Tokenizer

    return Tokenizer(model)


def check_resume_flags(run_dir: Path, argv: Sequence[str]) -> None:
    """A ``ValueError`` for a flag besides ``RESUME_FLAGS`` given with ``--resume``: the run
    folder's settings are its config.json's."""
    given = [w.split("=", 1)[0] for w in argv if w.startswith("--")]
    fixed = [flag for flag in given if flag not in RESUME_FLAGS]
    if fixed:
        raise ValueError(
            f"--resume continues {run_dir} with its own settings (its config.json): "
            f"{', '.join(fixed)} cannot change them; --steps can raise its step count"
        )


def resumed_settings(run_dir: Path, steps: int | None) -> dict[str, Any]:
    """The settings of the run folder ``run_dir``, ``steps`` (if given) its new step count,
    its env modules imported again; a ``ValueError`` for a folder of another form."""
    config_path = run_dir / folder.CONFIG_FILE
    settings = folder.read_json(config_path)
    if not isinstance(settings, dict) or "env" not in settings:
        raise ValueError(f"--resume {run_dir}: not a run folder of ppojax rlhf --env")
    missing = [part for part in SECTIONS if not isinstance(settings.get(part), dict)]
    if missing:
        raise ValueError(
            f"{run_dir / folder.CONFIG_FILE} lacks {', '.join(missing)} (objects the episode "
            "form writes): restore it, or start a new run"
        )
    if steps is not None:
        settings["run"]["steps"] = steps
    import_env_modules(settings["env"].get("modules", []), str(config_path))
    return settings
