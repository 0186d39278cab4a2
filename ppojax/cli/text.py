"""``ppojax sft | rm | dpo`` and ``ppojax rlhf --model``: a Hugging Face model folder trained
on a JSONL file into a run folder (``ppojax.runs.lm.text_run``), its final model in ``final/``.

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
import contextlib
import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ppojax.checks import ConfigError
from ppojax.cli.flags import add_repeatable
from ppojax.cli.text_checks import (
    as_flag,
    check_batch,
    check_devices,
    check_flags,
    check_resume_flags,
    load_reward,
    read_settings,
    reward_check,
    try_reward,
)
from ppojax.cli.values import DEFAULT_OUT, Parser, parse_bool, parse_float, parse_int
from ppojax.rlhf.core.config import RLHFConfig, add_config_flags, stored_names

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
    helps = {"group_size": f"samples per prompt (ppo: 1; grpo, rloo: {GROUP_SIZE}, must be >= 2)"}
    add_config_flags(parser, TOKEN_FIELDS, helps)


def settings_from_args(command: str, args: argparse.Namespace) -> dict[str, Any]:
    """What config.json keeps of a fresh run: every option, paths made absolute."""
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
    if not args.reward and args.reward_model is None:
        raise ValueError("give a reward: --reward MODULE:FUNCTION and/or --reward-model FOLDER")
    for spec in args.reward:
        load_reward(spec)  # a bad one fails before the run folder is made
    chosen = {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(RLHFConfig)
        if field.name not in TOKEN_FIELDS and getattr(args, field.name) is not None
    }
    if chosen.get("algorithm") in ("grpo", "rloo") and "group_size" not in chosen:
        chosen["group_size"] = GROUP_SIZE  # RLHFConfig's 1 suits only ppo
    try:
        config = RLHFConfig(**chosen)  # a bad value fails here, named as its flag
    except ConfigError as error:
        raise as_flag(error, "RLHFConfig") from None
    rows = args.batch_size * config.group_size  # what a step's minibatches split
    if rows % config.num_minibatches:
        raise ValueError(
            f"--num-minibatches {config.num_minibatches} must divide --batch-size "
            f"{args.batch_size} x --group-size {config.group_size} = {rows} responses a step; "
            f"choose a divisor of {rows}"
        )
    settings.update(
        reward=list(args.reward),
        reward_model=None if args.reward_model is None else str(args.reward_model.resolve()),
        prompt_field=args.prompt_field,
        sample_every=args.sample_every or args.checkpoint_every,
        samples=args.samples,
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
    from ppojax.runtime import cache

    if not args.no_compile_cache and not cache.disabled_by_environment():
        cache.enable_compile_cache()
    if args.resume is not None:
        settings, run_dir = read_settings(args.resume, command), args.resume
    else:
        settings, run_dir = settings_from_args(command, args), None
    run_dir, summary = start(settings, run_dir, args.out, progress=not args.no_progress)
    print(f"run folder: {run_dir}")
    print(f"final model: {run_dir / 'final'}")
    final = {**summary["final (mean of the last 10% of steps)"], **summary.get("held_out", {})}
    shown = ", ".join(f"{name} {final[name]:.4g}" for name in PRINTED if name in final)
    print(f"step {summary['steps']} (mean of the last 10% of steps): {shown}")
    return 0


def start(
    settings: dict[str, Any], run_dir: Path | None, out: Path, progress: bool = True
) -> tuple[Path, dict[str, Any]]:
    """Load the model and data of ``settings`` (every input checked before a run folder is
    made), then train into a new run folder under ``out``, or on in ``run_dir``."""
    import jax

    from ppojax.rlhf.models.pretrained import from_pretrained
    from ppojax.runs import folder
    from ppojax.runs.lm.text_run import train_job
    from ppojax.runs.lock import run_lock
    from ppojax.runs.loggers import WandbRun, options_from_settings
    from ppojax.runs.loop import LoopOptions

    with contextlib.ExitStack() as stack:  # this process the folder's one writer till done
        if run_dir is not None:
            stack.enter_context(run_lock(Path(run_dir)))  # before a resume reads anything
        mesh = device_mesh(settings)
        command, key = settings["command"], jax.random.key(settings["seed"])
        lm = from_pretrained(settings["model"], dtype=model_dtype(settings), mesh=mesh)
        failures: list[Any] = []  # the text rewards' errors inside the compiled step
        job, prompts = make_job(settings, lm, jax.random.fold_in(key, 1), failures, mesh)
        if mesh is not None:
            from ppojax.runs.lm.jobs import sharded

            job = sharded(job, mesh)
        options = LoopOptions(
            settings["steps"],
            settings["checkpoint_every"],
            progress=progress,
            bar_metrics=job.curves[:2],
            resume=run_dir is not None,
            seed=settings["seed"],
        )
        if run_dir is None:
            run_dir = folder.new_run_dir(out, command)
            stack.enter_context(run_lock(run_dir))
            folder.write_json(run_dir / folder.CONFIG_FILE, settings)
        run_dir = Path(run_dir)
        wandb_options = options_from_settings(run_dir / folder.CONFIG_FILE, settings.get("wandb"))
        wandb = None if wandb_options is None else WandbRun(wandb_options, settings, run_dir)
        hooks: list[Any] = [] if wandb is None else [wandb.log]
        checks = []
        if prompts is not None:
            hooks.append(sample_writer(settings, run_dir, lm, job, prompts, key, wandb))
            checks.append(reward_check(settings["reward"], job, failures, run_dir))
        options = dataclasses.replace(options, hooks=tuple(hooks), checks=tuple(checks))
        try:
            _, summary = train_job(run_dir, lm, job, jax.random.fold_in(key, 2), options)
        except BaseException:
            if wandb is not None:
                wandb.abort()
            raise
        if wandb is not None:
            wandb.finish(summary["final (mean of the last 10% of steps)"])
        return run_dir, summary


def model_dtype(settings: dict[str, Any]) -> str:
    """The run's --dtype; float32 for folders written before the flag."""
    return settings.get("dtype", "float32")


def device_mesh(settings: dict[str, Any]) -> Any:
    """The (data, fsdp) mesh of the run's --devices (1 x N), None for one device. On a CPU the
    process gets N host devices, which must happen before JAX's first computation."""
    from ppojax.runtime.compiling import use_cpu_devices

    devices = settings.get("devices", 1)
    if devices == 1:
        return None
    use_cpu_devices(devices)  # the CPU backend's count only: a GPU process keeps its GPUs
    import jax

    from ppojax.rlhf.core.sharding import make_mesh

    available = jax.devices()
    if len(available) < devices:
        raise ValueError(
            f"--devices {devices}: this process has {len(available)} "
            f"{available[0].platform} device(s); give at most {len(available)}"
        )
    return make_mesh(fsdp=devices, devices=available[:devices])


def sample_writer(
    settings: dict[str, Any], run_dir: Path, lm: Any, job: Any, prompts: Any, key: Any, wandb: Any
) -> Any:
    """The hook that writes samples.jsonl (and a W&B table) every ``sample_every`` steps."""
    import jax

    from ppojax.runs.lm.text_run import SampleWriter

    config = rlhf_config(settings, lm)
    return SampleWriter(
        run_dir,
        lm,
        job,
        prompts,
        count=settings["samples"],
        every=settings["sample_every"],
        num_steps=settings["steps"],
        response_len=config.response_len,
        temperature=config.temperature,
        key=jax.random.fold_in(key, 3),
        log=None if wandb is None else wandb.log_samples,
    )


def rlhf_config(settings: dict[str, Any], lm: Any) -> RLHFConfig:
    """The run's RLHFConfig, its EOS the tokenizer's. Its pad id is the tokenizer's unless
    that is EOS too (Llama's): padding is masked out everywhere, but a response must end at
    its first EOS, so then another id pads."""
    stored = stored_names(settings["rlhf"])  # an older folder's ppo_epochs, target_kl
    chosen = {k: tuple(v) if isinstance(v, list) else v for k, v in stored.items()}
    eos, pad = lm.tokenizer.eos_id, lm.tokenizer.pad_id
    if pad == eos:
        pad = 0 if eos != 0 else 1
    return RLHFConfig(**chosen, pad_id=pad, eos_id=eos)


def make_job(
    settings: dict[str, Any], lm: Any, key: Any, failures: list, mesh: Any = None
) -> tuple[Any, Any]:
    """The run's ``Job`` and, for rlhf, its prompts (for the samples), its text rewards'
    errors kept in ``failures``; the data checked."""
    from ppojax.rlhf.data import split_held_out
    from ppojax.runs.lm import jobs

    command, path = settings["command"], Path(settings["data"])
    size, rate = settings["batch_size"], settings.get("learning_rate")
    if command == "rlhf":
        return rlhf_job(settings, lm, key, failures, mesh)
    data = load_examples(settings, lm)
    rows, held_out = data.prompts.shape[0], settings.get("held_out", 0)
    if held_out >= rows:
        raise ValueError(f"--held-out {held_out} keeps out all {rows} pairs of {path}: lower it")
    rows -= held_out
    check_batch(path, rows, size)
    check_devices(settings, size)
    master = settings.get("master_weights", True)
    if command == "sft":
        return jobs.sft_job(lm, data, size, rate, master), None
    if command == "dpo":
        loss, beta = settings["loss"], settings["beta"]
        return jobs.dpo_job(lm, data, size, rate, loss, beta, master), None
    train, held = data, None
    if settings["held_out"]:
        train, held = split_held_out(data, settings["held_out"], settings["seed"])
    return jobs.reward_model_job(lm, train, size, rate, held, master), None


def load_examples(settings: dict[str, Any], lm: Any) -> Any:
    """The completions (sft) or pairs (rm, dpo) of the run's JSONL file, checked to fit the
    model's context."""
    from ppojax.rlhf.post.pairs import load_pairs
    from ppojax.rlhf.post.sft import load_completions

    load = load_completions if settings["command"] == "sft" else load_pairs
    path = Path(settings["data"])
    data = load(
        path,
        lm.tokenizer,
        chat=settings["chat"],
        max_len=settings["max_len"],
        max_response_len=settings["max_response_len"],
    )
    width = data.prompts.shape[1] + data[2].shape[1]
    if width > lm.config.max_positions:
        raise ValueError(
            f"{path}: the longest prompt and response take {width} tokens, more than the "
            f"model's context ({lm.config.max_positions}); cut them with --max-len and "
            "--max-response-len"
        )
    return data


def rlhf_job(
    settings: dict[str, Any], lm: Any, key: Any, failures: list, mesh: Any = None
) -> tuple[Any, Any]:
    """The RLHF job of ``settings``: the prompts, text rewards and reward model it names."""
    from ppojax.rlhf.data import load_prompts
    from ppojax.rlhf.models.pretrained import from_pretrained, load_value_head
    from ppojax.runs.lm import jobs

    config, path = rlhf_config(settings, lm), Path(settings["data"])
    limit = settings["max_len"] or lm.config.max_positions - config.response_len
    try:
        prompts = load_prompts(
            path,
            lm.tokenizer,
            field=settings["prompt_field"],
            chat=settings["chat"],
            max_len=limit,
            overflow="truncate" if settings["max_len"] else "error",
            pad_id=config.pad_id,
        )
    except ValueError as error:
        from ppojax.rlhf.data import TOO_LONG_FIX

        if TOO_LONG_FIX not in str(error):
            raise
        raise ValueError(
            str(error).replace(f"max_len={limit}; {TOO_LONG_FIX}", f"the {limit} the model's ")
            + f"context ({lm.config.max_positions} tokens) leaves beside --response-len "
            f"{config.response_len}; give --max-len {limit} to cut prompts on the left"
        ) from None
    width = prompts.tokens.shape[1] + config.response_len
    if width > lm.config.max_positions:  # a --max-len above the context lets them through
        raise ValueError(
            f"{path}: prompts ({prompts.tokens.shape[1]} tokens, --max-len {settings['max_len']})"
            f" and --response-len {config.response_len} take {width} tokens, more than the "
            f"model's context ({lm.config.max_positions}); lower --max-len to "
            f"{lm.config.max_positions - config.response_len} or less"
        )
    check_batch(path, len(prompts), settings["batch_size"])
    check_devices(settings, settings["batch_size"])
    rewards = [load_reward(spec) for spec in settings["reward"]]
    for spec, fn in zip(settings["reward"], rewards, strict=True):
        try_reward(spec, fn, lm.tokenizer, prompts, path, config.response_len)
    reward_lm = reward_params = None
    if settings["reward_model"] is not None:
        reward_lm = from_pretrained(settings["reward_model"], dtype=model_dtype(settings))
        if reward_lm.config.vocab_size != lm.config.vocab_size:
            raise ValueError(
                f"--reward-model {settings['reward_model']} has a vocabulary of "
                f"{reward_lm.config.vocab_size} tokens, the policy {lm.config.vocab_size}: "
                "it must read the policy's tokens"
            )
        reward_params = load_value_head(reward_lm, settings["reward_model"])
    job = jobs.rlhf_job(
        lm,
        config,
        prompts,
        settings["batch_size"],
        key,
        rewards,
        reward_lm,
        reward_params,
        failures,
        mesh,
    )
    return job, prompts
