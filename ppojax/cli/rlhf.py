"""``ppojax rlhf``: one command, three forms, told apart by their flags.

    ppojax rlhf --task sorting|reversal [options]                   the task form (the default)
    ppojax rlhf --model FOLDER --prompts FILE.jsonl --reward M:F    the model form
    ppojax rlhf --env ID [--model FOLDER] [options]                 the episode form

The task form trains the built-in model on a digit task (``ppojax.runs.lm.task_run``); the
model form trains a Hugging Face folder on a prompt file (``ppojax.cli.text``); the episode
form trains the built-in model from random weights, or a Hugging Face folder (``--model``), on
multi-turn episodes of a text env (``ppojax.runs.lm.episode_run``). A flag that only one form
has (``--prompts``, ...; ``--task``, ``--small``, ...; ``--env``, ``--turns``, ...) picks that
form, and flags of two forms are an error naming them. ``--model`` and ``--dtype``, which the
model and episode forms share (``BOTH``), count as the episode form's when ``--env`` is given
and as the model form's otherwise. With none, ``--resume RUN_DIR`` follows what made the
folder, and anything else is the task form. Every form takes the run flags and every
``RLHFConfig`` field. ``--help`` shows every form, or one form's options when a flag of that
form comes with it."""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Sequence
from pathlib import Path

from ppojax.rlhf.core.config import config_names

FORMS = ("task", "model", "episode")
# The flags of the model and episode forms both: the episode form's when --env is given.
BOTH = ("--model", "--dtype")
USAGE = """ppojax rlhf [--task {sorting,reversal}] [options]
       ppojax rlhf --model FOLDER --prompts FILE.jsonl --reward MODULE:FUNCTION [options]
       ppojax rlhf --env ID [--env-module MODULE] [--sft-steps N] [--turns N] [options]
       ppojax rlhf --env ID --model FOLDER [--dtype bfloat16] [options]
       ppojax rlhf --resume RUN_DIR"""
DESCRIPTION = """\
PPO, GRPO or RLOO for language models, in one of three forms:
  task form     the built-in model on a digit task (sorting: SFT, a reward model, then RL;
                reversal: SFT, then RL against its checker); the default
  model form    a Hugging Face folder on a JSONL file of prompts, scored by text rewards
                (--reward) and/or a reward model (--reward-model)
  episode form  the built-in model, from random weights (or SFT on the env's demonstrations,
                --sft-steps), or a Hugging Face folder (--model, an env over text through
                its chat template), on multi-turn episodes of a text env
                (--env: {ids}, or one that --env-module registers)
The form is the one whose own flags are given (below); flags of two forms are an error.
--resume RUN_DIR continues a run folder of any form. ppojax rlhf --task sorting --help,
ppojax rlhf --model FOLDER --help or ppojax rlhf --env ID --help lists one form's options
with its defaults."""


def form_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each form's own parser."""
    from ppojax.cli import text
    from ppojax.runs.lm import episode_settings, task_run

    return {
        "task": task_run.build_parser(),
        "model": text.build_parser("rlhf"),
        "episode": episode_settings.build_parser(),
    }


def own_flags(parsers: dict[str, argparse.ArgumentParser]) -> dict[str, set[str]]:
    """The flags only one form has, per form (``--task``; ``--model``, ``--response-len``;
    ``--env``, ``--turns``)."""
    flags = {form: set(parser._option_string_actions) for form, parser in parsers.items()}
    return {
        form: flags[form].difference(*(flags[other] for other in flags if other != form))
        for form in flags
    }


def flags_in(argv: Sequence[str]) -> list[str]:
    """The ``--flag`` words of ``argv`` in order (``--flag=value`` as ``--flag``)."""
    return [word.split("=", 1)[0] for word in argv if word.startswith("--")]


def given_flags(argv: Sequence[str], own: dict[str, set[str]]) -> dict[str, list[str]]:
    """Each form's flags in ``argv``: its own, and ``BOTH``'s for the episode form when
    ``--env`` is given, else for the model form."""
    flags = flags_in(argv)
    shares = "episode" if "--env" in flags else "model"
    return {
        form: [f for f in flags if f in own[form] or (form == shares and f in BOTH)]
        for form in FORMS
    }


def choose_form(argv: Sequence[str], own: dict[str, set[str]]) -> str:
    """ "task", "model" or "episode" for ``argv``; a ``ValueError`` naming the flags when it
    mixes two forms', or gives the model form's without ``--model`` or the episode form's
    without ``--env`` (either without ``--resume``)."""
    from ppojax.cli.text_checks import is_model_run

    given = given_flags(argv, own)
    mixed = [form for form in FORMS if given[form]]
    if len(mixed) > 1:
        parts = [f"{', '.join(given[form])} of the {form} form" for form in mixed]
        first = f"{', '.join(given[mixed[0]])} {is_are(given[mixed[0]])} of the {mixed[0]} form"
        rest = parts[1:]
        joined = rest[0] if len(rest) == 1 else f"{', '.join(rest[:-1])} and {rest[-1]}"
        raise ValueError(
            f"{first} and {joined}; give the flags of one form (ppojax rlhf --help shows "
            "every form's)"
        )
    present = set(flags_in(argv)) | ({"--help"} if "-h" in argv else set())
    if given["model"]:
        if not {"--model", "--resume", "--help"} & present:
            raise ValueError(
                f"{', '.join(given['model'])} {is_are(given['model'])} of the model form, "
                "which trains a Hugging Face folder: add --model FOLDER (without it, ppojax "
                "rlhf trains a built-in digit task, which takes none of them)"
            )
        return "model"
    if given["episode"]:
        if not {"--env", "--resume", "--help"} & present:
            raise ValueError(
                f"{', '.join(given['episode'])} {is_are(given['episode'])} of the episode "
                "form, which trains on a text env: add --env ID"
            )
        return "episode"
    if given["task"]:
        return "task"
    if is_model_run(list(argv)):
        return "model"
    return "episode" if is_episode_run(argv) else "task"


def is_episode_run(argv: Sequence[str]) -> bool:
    """Whether ``argv`` resumes a run folder of the episode form (its config.json has
    ``env``)."""
    from ppojax.runs import folder

    words = list(argv)
    if "--resume" not in words[:-1]:
        return False
    config = Path(words[words.index("--resume") + 1]) / folder.CONFIG_FILE
    try:
        settings = folder.read_json(config)
    except (ValueError, TypeError, OSError):
        return False
    return isinstance(settings, dict) and "env" in settings


def is_are(flags: Sequence[str]) -> str:
    return "is a flag" if len(flags) == 1 else "are flags"


def help_text(parsers: dict[str, argparse.ArgumentParser], own: dict[str, set[str]]) -> str:
    """The help of ``ppojax rlhf``: every form's usage, each form's own flags, then the flags
    they share (with each form's help where they differ) and the RLHFConfig fields."""
    from ppojax.rlhf.envs.env import text_env_ids

    fields = set(config_names())
    actions = {
        form: {a.option_strings[0]: a for a in parsers[form]._actions if a.option_strings}
        for form in FORMS
    }
    shared, config = [], []
    for flag, action in actions["task"].items():
        if flag in own["task"] or action.dest == "help" or action.help == argparse.SUPPRESS:
            continue
        if action.dest in fields:
            config.append(action)
            continue
        helps = {form: actions[form][flag].help for form in FORMS if flag in actions[form]}
        if len(set(helps.values())) > 1 or len(helps) < len(FORMS):
            action = copy.copy(action)
            action.help = "; ".join(f"{form} form: {text}" for form, text in helps.items())
        shared.append(action)
    both = []
    for flag in BOTH:
        action = copy.copy(actions["episode"][flag])
        action.help = "; ".join(f"{form} form: {actions[form][flag].help}"
                                for form in ("model", "episode"))  # fmt: skip
        both.append(action)
    formatter = argparse.RawDescriptionHelpFormatter("ppojax rlhf")
    formatter.add_usage(USAGE, [], [])
    formatter.add_text(DESCRIPTION.format(ids=", ".join(text_env_ids())))
    sections = [
        (f"{form} form only", [a for f, a in actions[form].items() if f in own[form]])
        for form in FORMS
    ]
    sections += [
        ("model and episode forms (the episode form's with --env)", both),
        ("every form", shared),
        ("every form: RLHFConfig fields (unset: the field's default, or the form's)", config),
    ]
    for title, section in sections:
        formatter.start_section(title)
        formatter.add_arguments(section)
        formatter.end_section()
    return formatter.format_help()


def main(argv: Sequence[str]) -> int:
    """``ppojax rlhf [options]`` in the form its flags pick (bad input: one line, exit status
    2, before any run folder is made)."""
    from ppojax.cli import text
    from ppojax.runs.lm.episode_run import main as episode_main
    from ppojax.runs.lm.task_run import main as task_main

    argv = list(argv)
    parsers = form_parsers()
    own = own_flags(parsers)
    try:
        form = choose_form(argv, own)
        if ("-h" in argv or "--help" in argv) and not given_flags(argv, own)[form]:
            sys.stdout.write(help_text(parsers, own))
            raise SystemExit(0)  # as argparse's --help does
        if form == "model":
            return text.main("rlhf", argv)
        if form == "episode":
            return episode_main(argv)
        return task_main(argv)
    except ValueError as error:
        sys.stderr.write(f"ppojax rlhf: error: {error}\n")
        return 2
