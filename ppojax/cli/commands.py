"""The command line: ``ppojax train | sweep | eval | envs`` (and ``rlhf``, ``sft``, ``rm``,
``dpo``, ``plan``, ``doctor``, each with its own module).

``ppojax train`` (no arguments) trains CartPole-v1, shows a progress bar, writes a run folder
(config, metrics, learning curve, checkpoints, summary; see ``ppojax.runs.folder``) and prints the
result. ``ppojax sweep`` trains a grid of hyperparameters x seeds in one compiled program.
``ppojax eval`` loads a run folder's policy and reports its mean return, optionally as a GIF.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ppojax.cli.flags import (
    add_cache_flag,
    add_env_module_flag,
    add_run_flags,
    add_shared_flags,
    add_wandb_flags,
    use_compile_cache,
)
from ppojax.cli.pbt import add_pbt_parser, run_pbt_command
from ppojax.cli.report import print_report
from ppojax.cli.values import (
    Parser,
    parse_grid,
    parse_int,
)
from ppojax.ppo.config import PRESETS, PPOConfig
from ppojax.runtime.memory import use_memory_fraction

if TYPE_CHECKING:
    from ppojax.runs import Experiment, RunOptions, RunResult


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="ppojax", description="Proximal Policy Optimization on gymnax envs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    train = commands.add_parser(
        "train",
        help="train PPO on one env (several seeds at once) into a run folder",
        description="Train PPO: a progress bar while it runs, a run folder (config.json, "
        "metrics.csv, learning_curve.png, checkpoints/, summary.json) and the result printed.",
    )
    add_run_flags(train)
    sweep = commands.add_parser(
        "sweep",
        help="train a grid of hyperparameters x seeds in one compiled program",
        description="Sweep traced PPOConfig fields (learning_rate, clip_eps, ...): every grid "
        "point and seed runs in one vmapped program; the run folder plots one curve per point.",
    )
    sweep.add_argument(
        "--grid",
        type=parse_grid,
        action="append",
        required=True,
        metavar="FIELD=V1,V2",
        help="values of one field; repeat for a cartesian product",
    )
    add_run_flags(sweep)
    evaluate = commands.add_parser(
        "eval",
        help="evaluate a run folder's policy (mean/std return, optional GIF)",
        description="Load the latest checkpoint of a run folder and run evaluation episodes.",
    )
    evaluate.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="a ppojax run folder")
    evaluate.add_argument("--episodes", type=parse_int, default=10, help="episodes (10)")
    evaluate.add_argument(
        "--deterministic", action="store_true", help="act with the policy's mode, not samples"
    )
    evaluate.add_argument("--run", type=parse_int, default=0, help="which run (seed) to load")
    evaluate.add_argument("--seed", type=parse_int, default=0, help="PRNG seed (default 0)")
    evaluate.add_argument("--gif", type=Path, metavar="PATH", help="draw one episode to a GIF")
    add_env_module_flag(evaluate)
    add_cache_flag(evaluate)
    add_wandb_flags(add_pbt_parser(commands, add_shared_flags))  # one W&B run per member
    envs = commands.add_parser("envs", help="list the environment ids that can be trained")
    add_env_module_flag(envs)
    commands.add_parser(
        "rlhf",
        help="PPO, GRPO or RLOO for language models: a digit task (--task) or a model folder "
        "(--model)",
        add_help=False,
    )
    for command, what in TEXT_COMMANDS.items():
        commands.add_parser(command, help=what, add_help=False)
    commands.add_parser(
        "plan",
        help="size a post-training step on h100/h200 GPUs before renting them (no GPU needed)",
        add_help=False,
    )
    commands.add_parser(
        "doctor",
        help="check ppojax's kernels on this machine's GPU or TPU (each against its plain "
        "form, timed); a kernel that fails is dropped",
        add_help=False,
    )
    return parser


TEXT_COMMANDS = {
    "sft": "supervised fine-tuning of a model folder on prompt/completion JSONL",
    "rm": "a reward model on a model folder from chosen/rejected JSONL",
    "dpo": "DPO or IPO of a model folder on chosen/rejected JSONL",
}
# the commands that train on a device, given the memory share ``ppojax plan`` judges against
TRAINING_COMMANDS = ("train", "rlhf", *TEXT_COMMANDS)


def run_rlhf(argv: Sequence[str]) -> int:
    """``ppojax rlhf [options]``: a built-in digit task or a model folder, picked by the flags
    given (``ppojax.cli.rlhf``)."""
    from ppojax.cli import rlhf

    return rlhf.main(argv)


def config_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The PPOConfig fields set on the command line."""
    return {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(PPOConfig)
        if field.name != "env_id" and getattr(args, field.name) is not None
    }


def flag_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The config flags and the ENV_ID argument, which override the --config file."""
    overrides = config_overrides(args)
    if args.env_id is not None:
        overrides["env_id"] = args.env_id
    return overrides


def build_config(args: argparse.Namespace) -> PPOConfig:
    """Preset of the env, then the --config file (JSON or TOML), then the flags."""
    from ppojax.runs import folder

    overrides = flag_settings(args)
    if args.config is None:
        return folder.config_from_dict(overrides)
    return folder.config_from_file(args.config, **overrides)


def run_options(args: argparse.Namespace, saved: RunOptions | None = None) -> RunOptions:
    """RunOptions from the flags; on --resume, the run's saved options with the flags on top."""
    from ppojax.runs import RunOptions

    if args.tensorboard and importlib.util.find_spec("tensorboardX") is None:
        raise ValueError("--tensorboard needs tensorboardX: pip install 'ppojax[tensorboard]'")
    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise ValueError(f"--checkpoint-every must be at least 1, got {args.checkpoint_every}")
    if args.keep_checkpoints < 0:
        raise ValueError(
            f"--keep-checkpoints must be 0 (keep all) or more, got {args.keep_checkpoints}"
        )
    base = saved or RunOptions()
    modules = tuple(dict.fromkeys([*base.env_modules, *args.env_module]))
    return dataclasses.replace(
        base,
        env_modules=modules,
        progress=not args.no_progress,
        checkpoint_every=args.checkpoint_every or base.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints or None,
        tensorboard=args.tensorboard or base.tensorboard,
        wandb=wandb_options(args, base.wandb),
    )


def wandb_options(args: argparse.Namespace, saved: Any = None) -> Any:
    """WandbOptions from --wandb and its flags; None without --wandb. On --resume, ``saved``
    (the run's W&B settings, which it logs on to without --wandb) with the flags on top."""
    from ppojax.runs.loggers import WandbOptions

    given = {
        name: getattr(args, f"wandb_{name}")
        for name in ("project", "entity", "name")
        if getattr(args, f"wandb_{name}") is not None
    }
    if not args.wandb:
        if given:
            flags = ", ".join(f"--wandb-{name}" for name in given)
            raise ValueError(f"{flags} apply only with --wandb; add --wandb")
        if saved is None:
            return None
    if importlib.util.find_spec("wandb") is None:
        logged = "" if args.wandb else " (this run logs to W&B: its run.json has wandb settings)"
        raise ValueError(f"--wandb needs wandb{logged}: pip install 'ppojax[wandb]'")
    return dataclasses.replace(saved, **given) if saved is not None else WandbOptions(**given)


def resume(args: argparse.Namespace) -> RunResult | None:
    """Continue ``args.resume``; the run's own config and seeds, so no config flags. None for
    a run that is already finished (it is left as it is)."""
    from ppojax.runs import folder
    from ppojax.runs.experiment import read_experiment, resume_experiment

    given = [f"--{name.replace('_', '-')}" for name in config_overrides(args)]
    given += ["ENV_ID"] * (args.env_id is not None) + ["--config"] * (args.config is not None)
    if given or getattr(args, "grid", None):
        raise ValueError(
            f"--resume continues a run with its saved config and seeds; drop {', '.join(given)}"
        )
    experiment, saved = read_experiment(args.resume)
    folder.check_writable(args.resume)
    if run_is_finished(args.resume, experiment):
        updates = experiment.config.num_updates
        print(f"{args.resume} is finished ({updates} of {updates} updates); nothing to do")
        return None
    return resume_experiment(args.resume, run_options(args, saved))


def run_is_finished(run_dir: Path, experiment: Experiment) -> bool:
    """Whether ``run_dir`` holds its final checkpoint, intact, every metrics row and the
    summary written after them: a resume would recompile everything to train nothing, and
    rewrite the summary's timings. Files that no longer match the run raise as a resume
    would; a damaged final checkpoint or summary is left to the resume to repair."""
    from ppojax.runs import checkpoints, folder
    from ppojax.runs.settings import check_record

    num_updates = experiment.config.num_updates
    check_record(run_dir, experiment)
    steps = [step for step, _ in checkpoints.checkpoint_records(run_dir)]
    if max(steps, default=0) < num_updates:
        return False
    folder.metrics_until(run_dir / folder.METRICS_FILE, num_updates, experiment.num_runs)
    try:
        checkpoints.verify_checkpoint(run_dir / folder.CHECKPOINT_DIR / str(max(steps)))
        folder.read_json_object(run_dir / folder.SUMMARY_FILE, "run summary")
    except (checkpoints.CheckpointError, ValueError, OSError):
        return False
    return True


def use_cpu_settings(args: argparse.Namespace, grid: dict[str, tuple[float, ...]]) -> None:
    """Make the CPU devices ``--cpu-devices`` says, then size XLA's CPU thread pool as
    ``--cpu-threads`` says, both before JAX's first computation."""
    from ppojax.runtime import compiling

    planned = None if compiling.backends_started() else planned_settings(args, grid)
    devices = args.cpu_devices
    if devices == "auto":
        devices = None if planned is None else compiling.auto_cpu_devices(planned[1])
    elif planned is not None and planned[1] % devices:
        raise ValueError(
            f"--cpu-devices {devices}: the {planned[1]} runs cannot be split evenly over "
            f"{devices} devices; give a count that divides them"
        )
    if devices is not None:
        try:
            compiling.use_cpu_devices(devices)
        except RuntimeError as error:
            raise ValueError(f"--cpu-devices {devices}: {error}") from None
    threads = args.cpu_threads
    if threads == "auto":
        if planned is None or (devices or 1) > 1:
            return  # several devices keep every core busy with runs; a shared pool is free
        try:
            threads = compiling.auto_cpu_threads(*planned)
        except (TypeError, ValueError, ArithmeticError):
            return  # a field of the wrong type or value: building the PPOConfig reports it
    if threads in ("all", None):
        return
    try:
        compiling.limit_cpu_threads(threads)
    except RuntimeError as error:
        raise ValueError(f"--cpu-threads {threads}: {error}") from None


def planned_settings(
    args: argparse.Namespace, grid: dict[str, tuple[float, ...]]
) -> tuple[dict[str, Any], int] | None:
    """The PPOConfig fields and the number of runs this command trains (a PBT run's members),
    read without building the PPOConfig (its env check imports gymnax, which computes at import
    and so starts JAX); None where the files cannot be read (the PPOConfig built next, or the
    resume, reports why)."""
    from ppojax.runs import folder

    try:
        if args.resume is not None:
            settings = folder.read_json_object(args.resume / folder.CONFIG_FILE, "PPOConfig fields")
        else:
            settings = folder.read_config_file(args.config) if args.config is not None else {}
            settings = {**settings, **flag_settings(args)}
        runs = planned_runs(args, grid)
    except (ValueError, KeyError, TypeError):
        return None
    defaults = {field.name: field.default for field in dataclasses.fields(PPOConfig)}
    preset = PRESETS.get(settings.get("env_id", defaults["env_id"]), {})
    return {**defaults, **preset, **settings}, runs


def planned_runs(args: argparse.Namespace, grid: dict[str, tuple[float, ...]]) -> int:
    """The runs of a train or sweep command (seeds x grid points), or a PBT run's members."""
    from ppojax.runs import folder
    from ppojax.runs.pbt_folder import PBT_FILE
    from ppojax.runs.settings import num_runs, read_run_settings

    if args.command == "pbt":
        if args.resume is None:
            return int(args.population)
        return int(folder.read_json_object(args.resume / PBT_FILE, "PBT settings")["population"])
    if args.resume is None:
        return num_runs(args.seeds, grid)
    run = read_run_settings(args.resume / folder.RUN_FILE)
    return num_runs(run["seeds"], run["grid"])


def check_seed_flags(args: argparse.Namespace) -> None:
    from ppojax.runs.experiment import MAX_SEED

    if args.seeds < 1:
        raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    if not 0 <= args.seed <= MAX_SEED:
        raise ValueError(f"--seed must lie in [0, {MAX_SEED}], got {args.seed}")


def run_train(args: argparse.Namespace, grid: dict[str, tuple[float, ...]]) -> int:
    """``ppojax train`` and ``ppojax sweep``: train, fill the run folder, print the result."""
    from ppojax.runs import folder
    from ppojax.runs.experiment import Experiment, check_env, run_experiment

    if args.resume is None:
        check_seed_flags(args)  # before use_cpu_settings, which splits the runs over devices
    use_cpu_settings(args, grid)
    if args.resume is not None:
        result = resume(args)
        if result is None:
            return 0
    else:
        experiment = Experiment(build_config(args), args.seeds, args.seed, grid)
        options = run_options(args)
        folder.check_out_dir(args.out)
        check_env(experiment.config)  # an env that cannot be built leaves no empty folder
        run_dir = folder.new_run_dir(args.out, experiment.config.env_id)
        if experiment.config.env_id in PRESETS:
            print(
                f"settings: the {experiment.config.env_id} preset (ppojax.PRESETS), with the "
                "flags and --config given on top"
            )
        print(f"run folder: {run_dir}", flush=True)
        result = run_experiment(experiment, run_dir, options)
    print_report(result)
    return divergence_status(result, args.command)


DIVERGED_EXIT_CODE = 3


def divergence_status(result: RunResult, command: str) -> int:
    """0, or DIVERGED_EXIT_CODE with a line on stderr when a run never recovered from
    non-finite updates (its last update still skipped steps)."""
    diverged = result.diverged_runs
    if not diverged:
        return 0
    rows = {row["run"]: row for row in result.divergence}
    first = min(rows[run]["first_update"] for run in diverged)
    steps = result.experiment.config.update_epochs * result.experiment.config.num_minibatches
    last = rows[diverged[0]]["last_update_skipped"]
    if len(diverged) == 1:
        who, whose, owner = f"run {diverged[0]}", "its last update", "Its parameters are its"
    else:
        who = f"runs {', '.join(str(run) for run in diverged)}"
        whose, owner = f"the last update of run {diverged[0]}", "Their parameters are their"
    if result.experiment.config.divergence_guard:
        kept = f"{whose} skipped {last} of {steps} steps. {owner} last finite ones"
    else:
        kept = f"{whose} had {last} of {steps} such steps, applied (divergence_guard is off)"
    sys.stderr.write(
        f"ppojax {command}: error: {who} diverged and never recovered: non-finite updates "
        f"from update {first} on, and {kept}; lower the learning rate or check the env's "
        "rewards and observations.\n"
    )
    return DIVERGED_EXIT_CODE


def run_eval(args: argparse.Namespace) -> int:
    """``ppojax eval``: mean/std return of the run's policy, and a GIF when asked."""
    from ppojax.runs import folder
    from ppojax.runs.policy import evaluate, load, render_gif

    if args.episodes < 1:
        raise ValueError(f"--episodes must be at least 1, got {args.episodes}")
    config, act = load(args.run_dir, run=args.run)
    returns = evaluate(config, act, args.episodes, args.seed, args.deterministic)
    mode = "deterministic" if args.deterministic else "sampled"
    print(
        f"{config.env_id}, run {args.run}: mean return {returns.mean():.1f} +- {returns.std():.1f}"
        f" over {args.episodes} episodes ({mode} actions)"
    )
    folder.write_json(
        args.run_dir / "eval.json",
        {"run": args.run, "mode": mode, "seed": args.seed, "returns": returns.tolist()},
    )
    if args.gif is not None:
        try:
            frames = render_gif(config, act, args.gif, args.seed, args.deterministic)
        except ValueError as error:
            print(f"ppojax eval: no GIF: {error}", file=sys.stderr)
        else:
            print(f"GIF of one episode ({frames} frames): {args.gif}")
    return 0


def list_env_ids() -> int:
    """gymnax's ids, the registered ones (after --env-module), the text envs of ``ppojax rlhf
    --env`` (built in and registered) and the adapter suites, each with whether it is
    installed or the extra that installs it."""
    from ppojax.envs.registry import SUITES, gymnax_envs, registered_envs, suite_installed
    from ppojax.rlhf.envs.env import text_env_ids

    print("gymnax:")
    for env_id in gymnax_envs():
        print(f"  {env_id}" + ("  (preset)" if env_id in PRESETS else ""))
    print("registered (ppojax.register_env, --env-module):")
    for env_id in registered_envs() or ["(none)"]:
        print(f"  {env_id}")
    print("text envs (ppojax rlhf --env; register_text_env, --env-module):")
    for env_id in text_env_ids():
        print(f"  {env_id}")
    print("suites (suite/name):")
    for name, suite in SUITES.items():
        state = "installed" if suite_installed(name) else f'pip install "ppojax[{suite.extra}]"'
        print(f"  {name + '/':<12} e.g. {suite.example:<40} {state}")
        presets = [env_id for env_id in PRESETS if env_id.startswith(name + "/")]
        if presets:
            print(f"  {'':<12} presets: {', '.join(presets)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    from ppojax.runtime.compiling import use_cpu_without_accelerators

    use_cpu_without_accelerators()  # before any command starts JAX's backends
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] and argv[0] in TRAINING_COMMANDS:
        # before any backend starts: JAX sizes its GPU pool from it once, at the start
        use_memory_fraction()
    if argv[:1] == ["rlhf"]:
        return run_rlhf(argv[1:])
    if argv[:1] == ["plan"]:
        from ppojax.cli import plan

        return plan.main(argv[1:])
    if argv[:1] == ["doctor"]:
        from ppojax.cli import doctor

        return doctor.main(argv[1:])
    if argv[:1] and argv[0] in TEXT_COMMANDS:
        from ppojax.cli import text

        return text.main(argv[0], argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    with warnings.catch_warnings():
        warnings.showwarning = functools.partial(show_warning, warnings.showwarning)
        return run_command(parser, args)


def show_warning(
    fallback: Callable[..., None], message: Any, category: type[Warning], *args: Any
) -> None:
    """ppojax's own warnings (a checkpoint passed over, an env's step adapted) as one plain
    line on stderr; others as Python shows them."""
    from ppojax.envs.env import StepAPIWarning
    from ppojax.runs.checkpoints import CheckpointWarning
    from ppojax.runtime.kernel_check import KernelCheckWarning

    if issubclass(category, (CheckpointWarning, StepAPIWarning, KernelCheckWarning)):
        sys.stderr.write(f"ppojax: warning: {message}\n")
    else:
        fallback(message, category, *args)


def run_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    try:
        if getattr(args, "env_module", None):
            from ppojax.envs.registry import import_env_modules

            import_env_modules(args.env_module, "--env-module")
        if args.command == "envs":
            return list_env_ids()
        use_compile_cache(args)
        if args.command == "eval":
            return run_eval(args)
        if args.command == "pbt":
            use_cpu_settings(args, {})  # the members split over CPU devices, as a sweep's runs
            return run_pbt_command(args, build_config, wandb_options)
        grid = dict(args.grid) if args.command == "sweep" else {}
        return run_train(args, grid)
    except (ValueError, OSError) as error:
        parser.exit(2, f"ppojax {args.command}: error: {error}\n")
    except KeyboardInterrupt:
        parser.exit(130, "ppojax: interrupted (a run with checkpoints continues with --resume)\n")


if __name__ == "__main__":
    sys.exit(main())
