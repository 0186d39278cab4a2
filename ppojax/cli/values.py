"""How the command line reads its values: the parser with one-line errors and the parsers of
PPOConfig's field types (ints as ``5e5``, sizes as ``64,64``, ``none`` for off, env kwargs,
grid axes)."""

from __future__ import annotations

import argparse
import difflib
import json
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ppojax.checks import EnvKwargs, parse_bool


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``ppojax train: error: ... (see ppojax train --help)``."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            message += close_flags(self, message.split(":", 1)[1].split())
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


DEFAULT_OUT = "runs"  # where run folders go unless --out says otherwise


def close_flags(parser: argparse.ArgumentParser, words: Sequence[str]) -> str:
    """ " Did you mean --x?" for the first unknown ``--flag`` in ``words`` that is close to a
    flag of ``parser`` or of its subcommands; "" when none is."""
    flags = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for subparser in action.choices.values():
                flags.update(subparser._option_string_actions)
    for word in words:
        close = difflib.get_close_matches(word.split("=")[0], sorted(flags), n=1, cutoff=0.75)
        if word.startswith("--") and close:
            return f". Did you mean {close[0]}?"
    return ""


def parse_int(text: str) -> int:
    """Integers, also written as 5e5 or 500_000."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
    return int(value)


def positive_int_or(text: str, words: tuple[str, ...]) -> int | str:
    """One of ``words``, or a positive integer; an ArgumentTypeError naming both otherwise."""
    if text in words:
        return text
    try:
        count = parse_int(text)
    except argparse.ArgumentTypeError:
        count = 0
    if count < 1:
        expected = ", ".join(words) + " or a positive integer"
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return count


def parse_cpu_threads(text: str) -> int | str:
    """``--cpu-threads``: "auto", "all" or a positive number of threads."""
    return positive_int_or(text, ("auto", "all"))


def parse_cpu_devices(text: str) -> int | str:
    """``--cpu-devices``: "auto" or a positive number of devices."""
    return positive_int_or(text, ("auto",))


def parse_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def parse_sizes(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 64,64, got {text!r}") from None


def optional(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """``parse`` that also reads ``none`` / ``off`` as None (the feature switched off)."""

    def parse_optional(text: str) -> Any:
        return None if text.lower() in ("none", "off") else parse(text)

    return parse_optional


def parse_env_kwargs(text: str) -> dict[str, Any]:
    """``max_steps_in_episode=50,name=x`` or a JSON object -> a dict; each value is read as
    JSON (50, 0.5, true, null) and kept as a string where it is not JSON."""
    if text.strip().startswith("{"):
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError as error:
            raise argparse.ArgumentTypeError(f"not a JSON object: {error}") from None
        if isinstance(parsed, dict):
            return parsed
    settings = {}
    for item in filter(None, text.split(",")):
        name, separator, value = item.partition("=")
        if not separator or not name.strip():
            raise argparse.ArgumentTypeError(f"expected NAME=VALUE,..., got {text!r}")
        try:
            settings[name.strip()] = json.loads(value)
        except json.JSONDecodeError:
            settings[name.strip()] = value
    return settings


SCALAR_PARSERS: dict[type, Callable[[str], Any]] = {
    bool: parse_bool,
    int: parse_int,
    float: parse_float,
    str: str,
    EnvKwargs: parse_env_kwargs,
}


def annotation_parser(annotation: Any) -> Callable[[str], Any]:
    """A command-line parser for a PPOConfig field's type: bool, int, float, str, tuples of
    ints (``64,64``), and any of these ``| None`` (``none`` turns the feature off)."""
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in arguments:
        inner = [argument for argument in arguments if argument is not type(None)]
        return optional(annotation_parser(inner[0]))
    if annotation is tuple or origin is tuple:
        return parse_sizes
    return SCALAR_PARSERS.get(annotation, str)


def parse_grid(text: str) -> tuple[str, tuple[float, ...]]:
    """``learning_rate=1e-4,3e-4`` -> ("learning_rate", (1e-4, 3e-4))."""
    name, separator, values = text.partition("=")
    try:
        parsed = tuple(float(value) for value in values.split(","))
    except ValueError:
        parsed = ()
    if not separator or not name or not parsed:
        raise argparse.ArgumentTypeError(f"expected FIELD=V1,V2,..., got {text!r}")
    return name.strip().replace("-", "_"), parsed
