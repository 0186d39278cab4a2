"""The job of ``ppojax sft | rm | dpo`` and ``ppojax rlhf --model`` assembled from a command's
settings (what config.json keeps; ``ppojax.cli.text`` makes them from the flags): the model
folder loaded in its dtype on its devices, the examples or prompts read and checked against it,
the rewards, the run's ``RLHFConfig`` and ``Job``, then trained into a run folder
(``ppojax.runs.lm.text_run``). Every input is checked before a run folder is made.

    run_dir, summary = run("sft", settings, None, Path("runs"))     # a fresh run
    run_dir, summary = run("sft", None, run_dir, Path("runs"))      # on from its config.json
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from ppojax.checks import ConfigError, as_flag
from ppojax.rlhf.core.config import RLHFConfig
from ppojax.runs.lm.settings import rlhf_config
from ppojax.runs.lm.text_checks import (
    check_batch,
    check_devices,
    load_reward,
    read_settings,
    reward_check,
    try_reward,
)


def run(
    command: str,
    settings: dict[str, Any] | None,
    run_dir: Path | None,
    out: Path,
    progress: bool = True,
) -> tuple[Path, dict[str, Any]]:
    """Train ``settings`` into a new run folder under ``out``, or (``settings`` None) go on in
    ``run_dir`` with the settings its config.json keeps; the run folder and summary."""
    if settings is None:
        settings = read_settings(run_dir, command)
    elif command == "rlhf":
        check_rlhf_settings(settings)
    return start(settings, run_dir, out, progress=progress)


def check_rlhf_settings(settings: dict[str, Any]) -> RLHFConfig:
    """The RLHFConfig of a fresh rlhf run's ``settings`` (its tokens not yet the tokenizer's),
    checked before the run folder is made: a reward given, each ``--reward`` imported, every
    RLHF field named as its flag, and the minibatches against the responses of a step."""
    if not settings["reward"] and settings["reward_model"] is None:
        raise ValueError("give a reward: --reward MODULE:FUNCTION and/or --reward-model FOLDER")
    for spec in settings["reward"]:
        load_reward(spec)  # a bad one fails before the run folder is made
    try:
        config = rlhf_config(settings["rlhf"])  # a bad value fails here, named as its flag
    except ConfigError as error:
        raise as_flag(error, "RLHFConfig") from None
    size = settings["batch_size"]
    rows = size * config.group_size  # what a step's minibatches split
    if rows % config.num_minibatches:
        raise ValueError(
            f"--num-minibatches {config.num_minibatches} must divide --batch-size "
            f"{size} x --group-size {config.group_size} = {rows} responses a step; "
            f"choose a divisor of {rows}"
        )
    return config


def start(
    settings: dict[str, Any], run_dir: Path | None, out: Path, progress: bool = True
) -> tuple[Path, dict[str, Any]]:
    """Load the model and data of ``settings`` (every input checked before a run folder is
    made), then train into a new run folder under ``out``, or on in ``run_dir``."""
    import jax

    from ppojax.rlhf.models.pretrained import from_pretrained
    from ppojax.runs import folder
    from ppojax.runs.lm.run import FINAL_MEANS
    from ppojax.runs.lm.text_run import train_job
    from ppojax.runs.lock import run_lock
    from ppojax.runs.loggers import WandbRun, options_from_settings
    from ppojax.runs.options import RunOptions

    with contextlib.ExitStack() as stack:  # this process the folder's one writer till done
        if run_dir is not None:
            stack.enter_context(run_lock(Path(run_dir)))  # before a resume reads anything
        mesh = device_mesh(settings)
        command, key = settings["command"], jax.random.key(settings["seed"])
        lm = from_pretrained(settings["model"], dtype=model_dtype(settings), mesh=mesh)
        config = run_config(settings, lm) if command == "rlhf" else None
        failures: list[Any] = []  # the text rewards' errors inside the compiled step
        job, prompts = make_job(settings, lm, jax.random.fold_in(key, 1), failures, mesh, config)
        if mesh is not None:
            from ppojax.runs.lm.jobs import sharded

            job = sharded(job, mesh)
        options = RunOptions(progress=progress, checkpoint_every=settings["checkpoint_every"])
        resume = run_dir is not None
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
            writer = sample_writer(settings, config, run_dir, lm, job, prompts, key, wandb)
            hooks.append(writer)
            checks.append(reward_check(settings["reward"], job, failures, run_dir))
        try:
            _, summary = train_job(
                run_dir,
                lm,
                job,
                jax.random.fold_in(key, 2),
                options,
                num_steps=settings["steps"],
                resume=resume,
                seed=settings["seed"],
                hooks=hooks,
                checks=checks,
            )
        except BaseException:
            if wandb is not None:
                wandb.abort()
            raise
        if wandb is not None:
            wandb.finish(summary[FINAL_MEANS])
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
    settings: dict[str, Any],
    config: RLHFConfig,
    run_dir: Path,
    lm: Any,
    job: Any,
    prompts: Any,
    key: Any,
    wandb: Any,
) -> Any:
    """The hook that writes samples.jsonl (and a W&B table) every ``sample_every`` steps."""
    import jax

    from ppojax.runs.lm.text_run import SampleWriter

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


def run_config(settings: dict[str, Any], lm: Any) -> RLHFConfig:
    """The rlhf run's RLHFConfig (config.json's ``rlhf``), its EOS the tokenizer's. Its pad
    id is the tokenizer's unless that is EOS too (Llama's): padding is masked out everywhere,
    but a response must end at its first EOS, so then another id pads."""
    eos, pad = lm.tokenizer.eos_id, lm.tokenizer.pad_id
    if pad == eos:
        pad = 0 if eos != 0 else 1
    return rlhf_config(settings["rlhf"], pad_id=pad, eos_id=eos)


def make_job(
    settings: dict[str, Any],
    lm: Any,
    key: Any,
    failures: list,
    mesh: Any = None,
    config: RLHFConfig | None = None,
) -> tuple[Any, Any]:
    """The run's ``Job`` and, for rlhf (of ``config``, ``run_config``'s), its prompts (for
    the samples), its text rewards' errors kept in ``failures``; the data checked."""
    from ppojax.rlhf.data import split_held_out
    from ppojax.runs.lm import jobs

    command, path = settings["command"], Path(settings["data"])
    size, rate = settings["batch_size"], settings.get("learning_rate")
    if command == "rlhf":
        config = run_config(settings, lm) if config is None else config
        return rlhf_job(settings, config, lm, key, failures, mesh)
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
    settings: dict[str, Any],
    config: RLHFConfig,
    lm: Any,
    key: Any,
    failures: list,
    mesh: Any = None,
) -> tuple[Any, Any]:
    """The RLHF job of ``settings`` and its ``config``: the prompts, text rewards and reward
    model it names."""
    from ppojax.rlhf.data import load_prompts
    from ppojax.rlhf.models.pretrained import from_pretrained, load_value_head
    from ppojax.runs.lm import jobs

    path = Path(settings["data"])
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
        settings.get("sample_layout", "auto"),  # a run folder from before the flag: auto
    )
    return job, prompts
