"""``ppojax sft | rm | dpo`` and ``ppojax rlhf --model``: a Hugging Face model folder trained
on a JSONL file into a run folder, its final model in ``final/``. This module parses the flags
and makes them into settings once; ``ppojax.runs.lm.text_job`` assembles and trains the job.

    ppojax sft --model FOLDER --data sft.jsonl --steps 200            # prompt, completion
    ppojax rm  --model FOLDER --pairs pairs.jsonl --steps 200 --held-out 64
    ppojax dpo --model FOLDER --pairs pairs.jsonl --loss ipo --beta 0.1 --steps 200
    ppojax rlhf --model FOLDER --prompts prompts.jsonl --reward rewards:correct \\
        --algorithm grpo --group-size 4 --steps 200
    ppojax sft --resume runs/sft-<time>                               # bit-exact

``--reward MODULE:FUNCTION`` imports MODULE from the current folder or PYTHONPATH (the
built-ins too: ``ppojax.rlhf.text_rewards:exact_match``); ``--reward-model FOLDER`` is a
folder ``ppojax rm`` wrote (its ``final/``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ppojax.cli.flags import add_repeatable
from ppojax.cli.text_checks import check_flags, check_resume_flags
from ppojax.cli.values import DEFAULT_OUT, Parser, parse_bool, parse_float, parse_int
from ppojax.rlhf.core.config import add_config_flags
from ppojax.rlhf.core.sharding import SAMPLE_LAYOUTS

COMMANDS = ("sft", "rm", "dpo", "rlhf")
DATA_FLAGS = {"sft": "data", "rm": "pairs", "dpo": "pairs", "rlhf": "prompts"}
FIELDS = {"sft": "prompt, completion", "rm": "prompt, chosen, rejected", "rlhf": "prompt"}
FIELDS["dpo"] = FIELDS["rm"]
DESCRIPTIONS = {
    "sft": "Supervised fine-tuning on prompt/completion pairs (loss on the completion).",
    "rm": "A Bradley-Terry reward model (a scalar head on the model) on chosen/rejected pairs.",
    "dpo": "DPO (sigmoid loss) or IPO on chosen/rejected pairs.",
    "rlhf": "PPO, GRPO or RLOO on prompts, scored by text rewards and/or a reward model.",
}
# What the last line printed shows of the summary.
PRINTED = ("loss", "rewards/accuracies", "held_out_accuracy", "objective/scores", "objective/kl")
# RLHFConfig fields the tokenizer fixes.
TOKEN_FIELDS = ("pad_id", "eos_id")
# The group size of grpo and rloo without --group-size (theirs must be >= 2; the README's 8).
GROUP_SIZE = 8
# --dtype's choices, ppojax plan's: the model's params and compute; the trained state stays
# float32 unless --master-weights false.
DTYPES = ("float32", "bfloat16")


def build_parser(command: str) -> Parser:
    """The options of ``ppojax <command>``."""
    parser = Parser(prog=f"ppojax {command}", description=DESCRIPTIONS[command])
    flag = DATA_FLAGS[command]
    parser.add_argument("--model", type=Path, metavar="FOLDER", help="a Hugging Face folder")
    parser.add_argument(
        f"--{flag}", type=Path, metavar="FILE.jsonl", help=f"JSON lines ({FIELDS[command]})"
    )
    parser.add_argument("--steps", type=parse_int, default=100, help="training steps (100)")
    parser.add_argument("--batch-size", type=parse_int, default=8, help="rows per step (8)")
    parser.add_argument("--seed", type=parse_int, default=0)
    parser.add_argument("--out", type=Path, default=Path(DEFAULT_OUT), help="parent of run folders")
    parser.add_argument("--checkpoint-every", type=parse_int, default=50, help="steps (50)")
    parser.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a run folder")
    parser.add_argument("--chat", action="store_true", help="prompts through the chat template")
    parser.add_argument("--max-len", type=parse_int, help="prompt tokens (longer: cut on the left)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--wandb", action="store_true", help="log to Weights & Biases")
    parser.add_argument("--wandb-project", default="ppojax", help="W&B project (ppojax)")
    parser.add_argument(
        "--no-compile-cache", action="store_true", help="compile afresh, not from the cache"
    )
    parser.add_argument(
        "--dtype",
        choices=DTYPES,
        default="float32",
        help="the model's params and compute (float32); bfloat16 trains float32 master weights",
    )
    parser.add_argument(
        "--devices",
        type=parse_int,
        default=1,
        help="devices of one FSDP mesh, as ppojax plan's (1; on a CPU, host devices)",
    )
    if command == "rlhf":
        add_rlhf_flags(parser)
        return parser
    parser.add_argument("--learning-rate", type=parse_float, default=1e-5, help="(1e-5)")
    parser.add_argument("--max-response-len", type=parse_int, help="completion tokens")
    parser.add_argument(
        "--master-weights",
        type=parse_bool,
        default=True,
        help="float32 params and Adam moments under --dtype bfloat16 (true); false keeps "
        "them in bfloat16, which loses updates below a weight's bf16 spacing",
    )
    if command == "rm":
        parser.add_argument("--held-out", type=parse_int, default=0, help="pairs kept out (0)")
    if command == "dpo":
        parser.add_argument("--loss", choices=("sigmoid", "ipo"), default="sigmoid")
        parser.add_argument("--beta", type=parse_float, default=0.1, help="(0.1)")
    return parser


def add_rlhf_flags(parser: argparse.ArgumentParser) -> None:
    add_repeatable(
        parser,
        "--reward",
        metavar="MODULE:FUNCTION",
        help="reward(prompts, responses, **columns) -> list[float]; repeatable",
    )
    parser.add_argument("--reward-model", type=Path, metavar="FOLDER", help="from ppojax rm")
    parser.add_argument("--prompt-field", default="prompt", help="the prompt's JSONL field")
    parser.add_argument("--sample-every", type=parse_int, help="steps (--checkpoint-every)")
    parser.add_argument("--samples", type=parse_int, default=4, help="prompts sampled (4)")
    parser.add_argument(
        "--sample-layout",
        choices=SAMPLE_LAYOUTS,
        default="auto",
        help="how sampling lays out the policy over --devices, resharded once a step: "
        "replicated (each device decodes its own rows, no collective a token), tensor (heads "
        "and MLP columns split), fsdp (the training layout), auto (replicated where it fits; "
        "ppojax plan --sample-layout checks it)",
    )
    helps = {"group_size": f"samples per prompt (ppo: 1; grpo, rloo: {GROUP_SIZE}, must be >= 2)"}
    add_config_flags(parser, TOKEN_FIELDS, helps)


def settings_from_args(command: str, args: argparse.Namespace) -> dict[str, Any]:
    """What config.json keeps of a fresh run: every option, paths made absolute; the flags
    checked (``check_flags``), what they name is checked by ``ppojax.runs.lm.text_job``."""
    flag = DATA_FLAGS[command]
    for name in ("model", flag):
        if getattr(args, name) is None:
            raise ValueError(f"--{name} is required (or --resume RUN_DIR)")
    check_flags(args)
    settings: dict[str, Any] = {
        "command": command,
        "model": str(args.model.resolve()),
        "data": str(getattr(args, flag).resolve()),
        "steps": args.steps,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "checkpoint_every": args.checkpoint_every,
        "chat": args.chat,
        "max_len": args.max_len,
        "dtype": args.dtype,
        "devices": args.devices,
        "wandb": wandb_settings(args),
    }
    if command != "rlhf":
        settings.update(
            learning_rate=args.learning_rate,
            max_response_len=args.max_response_len,
            master_weights=args.master_weights,
        )
        kept = [name for name in ("held_out", "loss", "beta") if hasattr(args, name)]
        settings.update({name: getattr(args, name) for name in kept})
        return settings
    from ppojax.runs.lm.settings import given_fields

    chosen = given_fields(args, TOKEN_FIELDS)
    if chosen.get("algorithm") in ("grpo", "rloo") and "group_size" not in chosen:
        chosen["group_size"] = GROUP_SIZE  # RLHFConfig's 1 suits only ppo
    settings.update(
        reward=list(args.reward),
        reward_model=None if args.reward_model is None else str(args.reward_model.resolve()),
        prompt_field=args.prompt_field,
        sample_every=args.sample_every or args.checkpoint_every,
        samples=args.samples,
        sample_layout=args.sample_layout,
        rlhf={k: list(v) if isinstance(v, tuple) else v for k, v in chosen.items()},
    )
    return settings


def wandb_settings(args: argparse.Namespace) -> dict[str, Any] | None:
    """The W&B run's options with its id (so a resume logs on into it); None without --wandb."""
    from ppojax.runs.loggers import WandbOptions, import_wandb, wandb_settings

    if not args.wandb:
        return None
    import_wandb()  # a clear error now when wandb is missing
    return wandb_settings(WandbOptions(project=args.wandb_project).with_run_ids(1))


def main(command: str, argv: Sequence[str] | None = None) -> int:
    """``ppojax <command> [options]``: errors in the input as one line naming the file, line
    or field (exit status 2); a run that diverged and never recovered, one line (3); Ctrl-C
    (130), as ``ppojax train``."""
    parser = build_parser(command)
    args = parser.parse_args(argv)
    from ppojax.runs.loop import RunDiverged  # after --help: it imports jax

    try:
        if args.resume is not None:
            check_resume_flags(parser, args)
        return run(command, args)
    except (ValueError, OSError) as error:
        sys.stderr.write(f"ppojax {command}: error: {error}\n")
        return 2
    except RunDiverged as error:  # ppojax train's code for a run that never recovered
        sys.stderr.write(f"ppojax {command}: error: {error}\n")
        return 3
    except KeyboardInterrupt:
        sys.stderr.write("ppojax: interrupted (a run with checkpoints continues with --resume)\n")
        return 130


def run(command: str, args: argparse.Namespace) -> int:
    """Train what the flags ``args`` say (their settings made once here; a ``--resume``, its
    folder's) through ``ppojax.runs.lm.text_job``, then print where it went."""
    from ppojax.runs.lm import text_job
    from ppojax.runtime import cache

    if not args.no_compile_cache and not cache.disabled_by_environment():
        cache.enable_compile_cache()
    settings = None if args.resume is not None else settings_from_args(command, args)
    progress = not args.no_progress
    run_dir, summary = text_job.run(command, settings, args.resume, args.out, progress)
    print(f"run folder: {run_dir}")
    print(f"final model: {run_dir / 'final'}")
    final = {**summary["final (mean of the last 10% of steps)"], **summary.get("held_out", {})}
    shown = ", ".join(f"{name} {final[name]:.4g}" for name in PRINTED if name in final)
    print(f"step {summary['steps']} (mean of the last 10% of steps): {shown}")
    return 0
