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
``--resume``.

With ``--model FOLDER`` the env is one over text (its factory takes ``chat``, a
``ChatFormat``, and returns a ``ChatEnv``: the calculator's does), built through the folder's
tokenizer and chat template; the policy (and PPO's critic, with a value head at 0) starts
from the folder's weights, in ``--dtype``, and the trained policy is saved as a Hugging Face
folder in ``final/``. config.json keeps the folder's absolute path (``model.folder``) for
``--resume``. A JAX token env has no text form: ``--model`` with one is refused.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import numpy as np

from ppojax.checks import ConfigError
from ppojax.envs.registry import import_env_modules, module_reference
from ppojax.rlhf.core.config import add_config_flags
from ppojax.rlhf.core.episode_trainer import EpisodeTrainer, make_episode_trainer
from ppojax.rlhf.core.episodes import EnvOutputError, check_env_faults, rollout_episodes
from ppojax.rlhf.core.host_rollout import HostRollout
from ppojax.rlhf.core.trainer import RLHFState, policy_params_fn
from ppojax.rlhf.core.turns import EpisodeLayout, EpisodeSettings, model_context
from ppojax.rlhf.envs.chat import ChatFormat
from ppojax.rlhf.envs.env import success_rule, text_env_ids
from ppojax.rlhf.envs.host import HostEnvError, runs_on_host
from ppojax.rlhf.models.transformer import transformer, zero_value_head
from ppojax.runs import folder
from ppojax.runs.lm import episode_checks as checks
from ppojax.runs.lm import episode_sft
from ppojax.runs.lm.run import PLOT_FILE, write_loop_summary
from ppojax.runs.lm.settings import config_dict, given_fields, rlhf_config
from ppojax.runs.lock import run_lock
from ppojax.runs.loop import RunDiverged, never_recovered, train_loop
from ppojax.runs.options import RunOptions
from ppojax.runs.plots import plot_metrics
from ppojax.runtime import cache

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
BAR_METRICS = ("episodes/return", "episodes/turns")
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
    parser.add_argument("--steps", type=int, help="RL steps (200)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=16,
        help="resets per step, each played --group-size times (16)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs"), help="parent of run folders")
    parser.add_argument("--checkpoint-every", type=int, default=50, help="steps per chunk (50)")
    parser.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue a run folder")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--no-compile-cache",
        action="store_true",
        help="compile every program afresh instead of loading it from the compilation cache "
        "(PPOJAX_NO_COMPILE_CACHE=1 does the same)",
    )
    episode_sft.add_sft_flags(parser)
    helps = {name: f"default {value!r} (this form's)" for name, value in DEFAULTS.items()}
    for name in set(DEFAULTS) - set(PRETRAINED_DEFAULTS):
        helps[name] = f"default {DEFAULTS[name]!r} (this form's; with --model, RLHFConfig's)"
    add_config_flags(parser, ENV_FIELDS, helps)
    return parser


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
        vocab = chat_vocabulary(ChatFormat(load_tokenizer(args.model)))
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


def chat_vocabulary(chat: ChatFormat, vocab_size: int = 0) -> checks.Vocabulary:
    """The ids a ``--model`` run plays with: the template's end-of-turn ends a turn; the
    tokenizer's pad id pads unless it is that token too (Llama's), then another id does
    (padding is masked everywhere, but a turn must end at its first end-of-turn)."""
    pad, eos = chat.tokenizer.pad_id, chat.eot_id
    if pad is None or pad == eos:
        pad = 0 if eos != 0 else 1
    return checks.Vocabulary(vocab_size, pad, eos)


def load_model(settings: dict[str, Any]) -> Any:
    """The run's ``--model`` (``from_pretrained``) in its dtype; a ``ValueError`` naming
    config.json's ``model.folder`` when the folder is gone (a ``--resume``)."""
    from ppojax.rlhf.models.pretrained import from_pretrained

    path = Path(settings["model"]["folder"])
    if not path.is_dir():
        raise ValueError(
            f"the run's --model folder {path} (config.json's model.folder) is gone: put the "
            "model back there to go on"
        )
    return from_pretrained(path, dtype=settings["model"]["dtype"])


class Prepared(NamedTuple):
    """A run's env, model (the built-in ``LanguageModel`` or a ``PretrainedLM``), trainer and
    state at step 0."""

    env: Any
    lm: Any
    trainer: EpisodeTrainer
    state: RLHFState


def prepare(settings: dict[str, Any]) -> Prepared:
    """The env (checked: ``episode_checks``), the model (from random weights, or the
    ``--model`` folder's), the trainer and its state at step 0 of a run's settings; a
    ``ValueError`` for anything that does not fit."""
    env_id, episodes, run = settings["env"]["id"], settings["episodes"], settings["run"]
    pretrained = "folder" in settings["model"]
    config = rlhf_config(settings["rlhf"])
    if pretrained:
        lm = load_model(settings)
        chat = ChatFormat(lm.tokenizer)
        env = checks.build_env(env_id, settings["env"]["args"], episodes["turns"], chat=chat)
        vocab = chat_vocabulary(chat, lm.config.vocab_size)
    else:
        env = checks.build_env(env_id, settings["env"]["args"], episodes["turns"])
        vocab = checks.vocabulary(env_id, env)
    if config.missing_eos_penalty:
        raise ConfigError(
            "missing_eos_penalty",
            "--missing-eos-penalty: episodes do not read it (a turn without EOS goes to the "
            "env as it is); leave it 0",
        )
    turn = EpisodeSettings(episodes["turns"], config.response_len, config.temperature,
                           config.pad_id, config.eos_id, episodes["token_budget"])  # fmt: skip
    if not pretrained:
        layout = EpisodeLayout(env.prompt_len, config.response_len, env.reply_len, turn.max_turns)
        lm = transformer(vocab.vocab_size, layout.length, **settings["model"])
    checks.check_env(env_id, env, lm.kv_cache, turn, vocab)
    success_rule(env)  # a success_return that is not a number fails here
    critic = lm.critic_apply if config.needs_critic else None
    trainer = make_episode_trainer(
        config, lm.policy_apply, env, run["batch_size"] * config.group_size, turn.max_turns,
        turn.token_budget, kv_cache=lm.kv_cache, critic_apply=critic,
        context_len=model_context(lm),
    )  # fmt: skip
    init_key = jax.random.fold_in(jax.random.key(run["seed"]), 1)
    if pretrained:
        params = lm.params
        critic_params = lm.init_value_head(params) if config.needs_critic else None
    else:
        params = lm.init(init_key)
        critic_params = zero_value_head(params) if config.needs_critic else None
    return Prepared(env, lm, trainer, trainer.init(params, init_key, critic_params))


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
    env_name, vocab_size = repr(settings["env"]["id"]), prepared.lm.config.vocab_size

    def check_env_output(first: int, state: Any, metrics: dict[str, np.ndarray]) -> None:
        # before the chunk is kept: its checkpoint would hold what the env's output did
        check_env_faults(metrics, env_name, vocab_size, first)

    options = RunOptions(
        progress=not args.no_progress,
        checkpoint_every=run["checkpoint_every"],
        keep_checkpoints=None,
    )
    result = train_loop(
        run_dir,
        episode_step(prepared.trainer),
        prepared.state,
        None,
        jax.random.fold_in(seed_key, 2),
        options,
        num_steps=run["steps"],
        resume=args.resume is not None,
        seed=run["seed"],
        bar_metrics=BAR_METRICS,
        host_steps=runs_on_host(prepared.env),
        checks=(check_env_output,),
    )
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
