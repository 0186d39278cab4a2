"""``ppojax rlhf``: one command, two forms, told apart by their flags.

    ppojax rlhf --task sorting|reversal [options]                   the task form (the default)
    ppojax rlhf --model FOLDER --prompts FILE.jsonl --reward M:F    the model form

The task form trains the built-in model on a digit task (``ppojax.rlhf.apps.task_run``, also
``python -m ppojax.rlhf``); the model form trains a Hugging Face folder on a prompt file
(``ppojax.cli.text``). A flag that only the model form has (``--model``, ``--prompts``,
``--reward``, ...) picks the model form, one that only the task form has (``--task``,
``--small``, ...) the task form, and flags of both are an error naming them. With neither,
``--resume RUN_DIR`` follows what made the folder, and anything else is the task form. Both
forms take the run flags and every ``RLHFConfig`` field. ``--help`` shows both forms, or one
form's options when a flag of that form comes with it.
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Sequence

from ppojax.rlhf.core.config import config_names

FORMS = ("task", "model")
USAGE = """ppojax rlhf [--task {sorting,reversal}] [options]
       ppojax rlhf --model FOLDER --prompts FILE.jsonl --reward MODULE:FUNCTION [options]
       ppojax rlhf --resume RUN_DIR"""
DESCRIPTION = """\
PPO, GRPO or RLOO for language models, in one of two forms:
  task form    the built-in model on a digit task (sorting: SFT, a reward model, then RL;
               reversal: SFT, then RL against its checker); the default
  model form   a Hugging Face folder on a JSONL file of prompts, scored by text rewards
               (--reward) and/or a reward model (--reward-model)
The form is the one whose own flags are given (below); flags of both forms are an error.
--resume RUN_DIR continues a run folder of either form. ppojax rlhf --task sorting --help or
ppojax rlhf --model FOLDER --help lists one form's options with its defaults."""


def form_parsers() -> dict[str, argparse.ArgumentParser]:
    """Each form's own parser."""
    from ppojax.cli import text
    from ppojax.rlhf.apps import task_run

    return {"task": task_run.build_parser(), "model": text.build_parser("rlhf")}


def own_flags(parsers: dict[str, argparse.ArgumentParser]) -> dict[str, set[str]]:
    """The flags only one form has, per form (``--task``; ``--model``, ``--response-len``)."""
    flags = {form: set(parser._option_string_actions) for form, parser in parsers.items()}
    return {"task": flags["task"] - flags["model"], "model": flags["model"] - flags["task"]}


def flags_in(argv: Sequence[str]) -> list[str]:
    """The ``--flag`` words of ``argv`` in order (``--flag=value`` as ``--flag``)."""
    return [word.split("=", 1)[0] for word in argv if word.startswith("--")]


def choose_form(argv: Sequence[str], own: dict[str, set[str]]) -> str:
    """ "task" or "model" for ``argv``; a ``ValueError`` naming the flags when it mixes the
    two forms', or gives the model form's without ``--model`` or ``--resume``."""
    from ppojax.cli.text import is_model_run

    given = {form: [flag for flag in flags_in(argv) if flag in own[form]] for form in FORMS}
    if given["task"] and given["model"]:
        raise ValueError(
            f"{', '.join(given['task'])} {is_are(given['task'])} of the task form and "
            f"{', '.join(given['model'])} of the model form; give the flags of one form "
            "(ppojax rlhf --help shows both)"
        )
    if given["model"]:
        if not {"--model", "--resume", "--help"} & set(flags_in(argv)) and "-h" not in argv:
            raise ValueError(
                f"{', '.join(given['model'])} {is_are(given['model'])} of the model form, "
                "which trains a Hugging Face folder: add --model FOLDER (without it, ppojax "
                "rlhf trains a built-in digit task, which takes none of them)"
            )
        return "model"
    if given["task"]:
        return "task"
    return "model" if is_model_run(list(argv)) else "task"


def is_are(flags: Sequence[str]) -> str:
    return "is a flag" if len(flags) == 1 else "are flags"


def help_text(parsers: dict[str, argparse.ArgumentParser], own: dict[str, set[str]]) -> str:
    """The help of ``ppojax rlhf``: both forms' usage, each form's own flags, then the flags
    they share (with each form's default where they differ) and the RLHFConfig fields."""
    fields = set(config_names())
    task, model = (
        {a.option_strings[0]: a for a in parsers[form]._actions if a.option_strings}
        for form in FORMS
    )
    shared, config = [], []
    for flag, action in task.items():
        if flag in own["task"] or action.dest == "help" or action.help == argparse.SUPPRESS:
            continue
        if action.dest in fields:
            config.append(action)
            continue
        action = copy.copy(action)
        if model[flag].help != action.help:
            action.help = f"task form: {action.help}; model form: {model[flag].help}"
        shared.append(action)
    formatter = argparse.RawDescriptionHelpFormatter("ppojax rlhf")
    formatter.add_usage(USAGE, [], [])
    formatter.add_text(DESCRIPTION)
    sections = (
        ("task form only", [a for f, a in task.items() if f in own["task"]]),
        ("model form only", [a for f, a in model.items() if f in own["model"]]),
        ("both forms", shared),
        ("both forms: RLHFConfig fields (unset: the field's default)", config),
    )
    for title, actions in sections:
        formatter.start_section(title)
        formatter.add_arguments(actions)
        formatter.end_section()
    return formatter.format_help()


def main(argv: Sequence[str]) -> int:
    """``ppojax rlhf [options]`` in the form its flags pick (errors: one line, exit status 2)."""
    from ppojax.cli import text
    from ppojax.rlhf.apps.task_run import main as task_main

    argv = list(argv)
    parsers = form_parsers()
    own = own_flags(parsers)
    try:
        form = choose_form(argv, own)
        if ("-h" in argv or "--help" in argv) and not set(flags_in(argv)) & own[form]:
            sys.stdout.write(help_text(parsers, own))
            raise SystemExit(0)  # as argparse's --help does
        if form == "model":
            return text.main("rlhf", argv)
        return task_main(argv)
    except ValueError as error:
        sys.stderr.write(f"ppojax rlhf: error: {error}\n")
        return 2
