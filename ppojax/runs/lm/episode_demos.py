"""Demonstrations from a JSONL file, for ``ppojax rlhf --env ID --sft-steps N --sft-demos-file
FILE.jsonl``: the model's turns of each episode, replayed against the env, so that the prompt,
replies and rewards SFT reads are the env's own.

One episode a line, a JSON object (blank lines are skipped):

    {"seed": 3, "turns": [[5, 7, 2], [6, 9, 2]]}
    {"seed": 4, "prompt": [1, 5, 6], "turns": [[5, 8, 2]]}

- ``seed``: an int in [0, 2**32); the env is reset with ``jax.random.key(seed)``, so
  ``env.reset(jax.random.key(seed))`` shows the prompt the turns answer.
- ``turns``: the model's responses, one list of token ids a turn, each ending with the env's
  ``eos_id`` (and holding it nowhere else), at most ``--turn-len`` ids below the env's
  ``vocab_size``; at most ``--turns`` turns, and none after the env says the episode is done.
  An episode whose turns run out before the env ends it is laid out as a truncated one.
- ``prompt`` (optional): the ids ``reset`` must give for ``seed``; a line recorded against
  another version of the env is refused instead of trained on.

Each bad line is a ``ValueError`` naming the file, the line and the field (the command's one
line, exit code 2), raised before the run folder is made. config.json keeps the file's
absolute path and sha256 (``sft.demos_file``): a ``--resume`` that must train the SFT again
replays the same file, and refuses one that changed or is gone.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jax

from ppojax.rlhf.core.turns import EpisodeLayout, Episodes, EpisodeSettings
from ppojax.rlhf.post.demos import episodes_of, host_calls, padded

FLAG = "--sft-demos-file"
FIELDS = ("seed", "turns", "prompt")
SEED_LIMIT = 2**32


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def id_list(value: Any) -> bool:
    return isinstance(value, list) and all(is_int(i) for i in value)


def read_lines(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], str]:
    """The file's episodes as (line number, object) pairs, their fields' types checked, and
    the sha256 of its bytes; a ``ValueError`` naming the file (and line and field) for a file
    that cannot be read, holds no episode, or has a line that is not such an object."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"{FLAG} {path}: cannot read it ({error.strerror or error})") from None
    lines = []
    for number, text in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if text.strip():
            lines.append((number, parse_line(path, number, text)))
    if not lines:
        raise ValueError(f"{FLAG} {path}: holds no demonstrations; give one JSON object a line")
    return lines, hashlib.sha256(data).hexdigest()


def parse_line(path: Path, number: int, text: str) -> dict[str, Any]:
    """Line ``number``'s object, its fields' types checked (see the module)."""
    where = f"{FLAG} {path} line {number}"
    try:
        line = json.loads(text)
    except json.JSONDecodeError as error:  # its own "line 1" would be the file's line
        raise ValueError(f"{where}: not JSON ({error.msg} at column {error.colno})") from None
    if not isinstance(line, dict):
        raise ValueError(f"{where}: must be a JSON object with seed and turns")
    unknown = sorted(set(line) - set(FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}; a line has {', '.join(FIELDS)}")
    for name in ("seed", "turns"):
        if name not in line:
            raise ValueError(f"{where}: field {name!r} is missing")
    seed = line["seed"]
    if not is_int(seed) or not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"{where}: field 'seed' must be an int in [0, 2**32), got {seed!r}")
    turns = line["turns"]
    if not isinstance(turns, list) or not turns:
        raise ValueError(f"{where}: field 'turns' must be a non-empty list of turns")
    for index, turn in enumerate(turns):
        if not id_list(turn) or not turn:
            raise ValueError(
                f"{where}: field 'turns'[{index}] must be a non-empty list of token ids, "
                f"got {turn!r}"
            )
    if "prompt" in line and not id_list(line["prompt"]):
        raise ValueError(f"{where}: field 'prompt' must be a list of token ids")
    return line


def file_settings(path: Path) -> tuple[dict[str, Any], int]:
    """config.json's ``sft.demos_file`` for ``path`` (its absolute path and sha256) and the
    episodes it holds, from one read (its fields checked, the env not played)."""
    lines, digest = read_lines(path)
    return {"path": str(Path(path).resolve()), "sha256": digest}, len(lines)


def replay_file(
    source: dict[str, Any], env: Any, env_id: str, settings: EpisodeSettings, vocab_size: int
) -> Episodes:
    """The episodes of ``source`` (config.json's ``sft.demos_file``), each line's turns
    stepped through ``env`` (see the module), in the layout of a rollout with ``settings``
    (log-probs 0: no model sampled them); a ``ValueError`` naming the file, the line and the
    field for a line that does not fit the env, and for a file unlike ``source``'s sha256."""
    path = Path(source["path"])
    if not path.is_file():
        raise ValueError(
            f"{FLAG} {path} (config.json sft.demos_file) is gone: put it back to train this "
            "run's SFT, or start a new run"
        )
    lines, digest = read_lines(path)
    if digest != source["sha256"]:
        raise ValueError(
            f"{FLAG} {path} changed since the run began (sha256 {source['sha256'][:12]}..., "
            f"now {digest[:12]}...): restore it to train this run's SFT, or start a new run"
        )
    if settings.token_budget is not None:
        raise ValueError(f"{FLAG} replays demonstrations without a token budget: leave out "
                         f"--token-budget {settings.token_budget}")  # fmt: skip
    layout = EpisodeLayout(env.prompt_len, settings.turn_len, env.reply_len, settings.max_turns)
    calls = host_calls(env, settings.turn_len, settings.pad_id)
    rows = []
    for number, line in lines:
        where = f"{FLAG} {path} line {number}"
        check_turns(where, line["turns"], settings, vocab_size)
        guarded = env_calls(calls, where, env_id)
        rows.append(replay_line(guarded, line, layout, settings.pad_id, where))
    return episodes_of(rows)


def check_turns(
    where: str, turns: list[list[int]], settings: EpisodeSettings, vocab_size: int
) -> None:
    """A ``ValueError`` naming ``where`` and the turn for turns a rollout could not have
    written: more than ``--turns``, longer than ``--turn-len``, an id outside the vocabulary,
    an end-of-turn token missing at the end or found before it."""
    if len(turns) > settings.max_turns:
        raise ValueError(
            f"{where}: field 'turns' has {len(turns)} turns, more than --turns "
            f"{settings.max_turns}: raise --turns or shorten the episode"
        )
    eos = settings.eos_id
    for index, turn in enumerate(turns):
        field = f"field 'turns'[{index}]"
        if len(turn) > settings.turn_len:
            raise ValueError(
                f"{where}: {field} has {len(turn)} token ids, more than --turn-len "
                f"{settings.turn_len}: raise --turn-len"
            )
        outside = [i for i in turn if not 0 <= i < vocab_size]
        if outside:
            raise ValueError(
                f"{where}: {field} holds token id {outside[0]}, outside the env's vocabulary "
                f"(0 to {vocab_size - 1})"
            )
        if turn[-1] != eos or eos in turn[:-1]:
            raise ValueError(
                f"{where}: {field} must end with the env's end-of-turn id {eos}, and hold it "
                f"only there, got {turn}"
            )


def env_calls(calls: Any, where: str, env_id: str) -> Any:
    """``calls`` with whatever the env's code raises re-raised as one ``ValueError`` line
    naming ``where`` and the env."""

    def guarded(call: Any) -> Any:
        def run(*args: Any) -> Any:
            try:
                return call(*args)
            except Exception as error:  # the env's own code, any exception
                raise ValueError(
                    f"{where}: text env {env_id!r} raised {type(error).__name__}: {error}"
                ) from None

        return run

    return type(calls)(guarded(calls.reset), guarded(calls.step))


def replay_line(
    calls: Any, line: dict[str, Any], layout: EpisodeLayout, pad_id: int, where: str
) -> tuple[list[int], list[bool], list[bool], list[float], int, bool]:
    """One line's episode: its tokens, mask and model mask [L], rewards per turn
    [max_turns], the turns played and whether the env said done."""
    state, prompt = calls.reset(jax.random.key(line["seed"]))
    if "prompt" in line and line["prompt"] != prompt:
        raise ValueError(
            f"{where}: field 'prompt' is {line['prompt']}, but the env's reset gives "
            f"{prompt} for seed {line['seed']}: the line was recorded against another env"
        )
    tokens, mask = padded(prompt, layout.prompt_len, pad_id, left=True)
    model_mask = [False] * layout.prompt_len
    rewards = [0.0] * layout.max_turns
    done = False
    for index, response in enumerate(line["turns"]):
        if done:
            raise ValueError(
                f"{where}: field 'turns' has {len(line['turns'])} turns, but the env ended "
                f"the episode after turn {index}: drop the turns after it"
            )
        state, reply, rewards[index], done = calls.step(state, response)
        if len(reply) > layout.reply_len:  # a Python env's reply, past its own width
            raise ValueError(
                f"{where}: the env replied {len(reply)} token ids to turn {index}, more than "
                f"its reply_len {layout.reply_len}"
            )
        for ids, width in ((response, layout.turn_len), (reply, layout.reply_len)):
            more_tokens, more_mask = padded(ids, width, pad_id, left=False)
            tokens, mask = tokens + more_tokens, mask + more_mask
        model_mask += padded(response, layout.turn_len, pad_id, False)[1]
        model_mask += [False] * layout.reply_len
    gap = layout.length - len(tokens)
    tokens, mask = tokens + [pad_id] * gap, mask + [False] * gap
    return tokens, mask, model_mask + [False] * gap, rewards, len(line["turns"]), done
