"""``ppojax rlhf --sft-demos-file FILE.jsonl``: demonstrations replayed from a file against
the env (examples/keylookup.py), its rewards and replies the env's own; a run trained from
one, resumed after its SFT, and resumed before it (the SFT trained again from the same file,
or refused when the file changed or is gone); each bad line, and a Python env failing on
one, one error naming the file, the line and the field, exit 2 and no run folder."""

import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from ppojax.cli.commands import main
from ppojax.envs.registry import import_env_modules
from ppojax.rlhf.core.turns import EpisodeSettings
from ppojax.rlhf.envs import PythonTextEnv, register_text_env
from ppojax.rlhf.envs import env as env_module
from ppojax.runs.lm import episode_demos

# examples/keylookup.py's ids (checked below): GET k EOS asks for key k's value
GET, ANS, EOS, KEY = 3, 4, 2, 6
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "keylookup.py"
TINY = ["--batch-size", "2", "--group-size", "2", "--eval-episodes", "8", "--no-progress"]
ENV = ["--env-module", str(EXAMPLE), "--env", "keylookup", "--turns", "4", "--turn-len", "3"]


@pytest.fixture
def keylookup():
    import_env_modules([str(EXAMPLE)], "test")
    yield sys.modules["keylookup"]
    sys.modules.pop("keylookup", None)
    env_module._FACTORIES.pop("keylookup", None)


def lines_of(module, count):
    """The solver's first ``count`` episodes as file lines (seeds 0 to count-1)."""
    path = Path(f"/tmp/demos-{id(module)}.jsonl")
    module.write_demos(str(path), count)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    path.unlink()
    return lines


def write(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n"
                            for line in lines))  # fmt: skip
    return path


def test_a_replay_reads_the_envs_prompt_replies_and_rewards_not_the_files(tmp_path, keylookup):
    k = keylookup
    assert (k.GET, k.ANS, k.EOS, k.FIRST_KEY) == (GET, ANS, EOS, KEY)
    env = k.KeyLookup()
    right = lines_of(k, 1)[0]
    wrong = json.loads(json.dumps(right))  # the same episode, its answer off by one
    wrong["turns"][2][1] = env.first_digit + (right["turns"][2][1] - env.first_digit + 1) % 9
    short = {"seed": 5, "turns": [[GET, KEY, EOS]]}  # its turns end before the episode
    path = write(tmp_path / "demos.jsonl", [right, "", wrong, short])
    settings = EpisodeSettings(4, 3, 1.0, k.PAD, EOS)
    source, count = episode_demos.file_settings(path)
    assert count == 3  # the blank line skipped
    demos = episode_demos.replay_file(source, env, "keylookup", settings, env.vocab_size)
    assert np.asarray(demos.rewards).tolist() == [[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert np.asarray(demos.num_turns).tolist() == [3, 3, 1]
    assert np.asarray(demos.terminated).tolist() == [True, True, False]
    tokens = np.asarray(demos.tokens[0]).tolist()
    replies = [tokens[3 + 4 * t + 3] for t in range(3)]  # each turn's 3 ids, then its reply
    assert tokens[:3] == right["prompt"] and replies[2] == k.QUERY  # the answer's reply
    values = [reply - env.first_digit for reply in replies[:2]]
    assert sum(values) == right["turns"][2][1] - env.first_digit  # the env's values
    model = np.asarray(demos.model_mask[0]).tolist()
    assert model == [False] * 3 + ([True] * 3 + [False]) * 3 + [False] * 4


@pytest.mark.heavy
def test_a_run_trains_from_a_file_and_resumes_or_refuses_a_changed_one(tmp_path, keylookup, capsys):
    path = write(tmp_path / "demos.jsonl", lines_of(keylookup, 16))
    out = tmp_path / "runs"
    sft = ["--sft-steps", "4", "--sft-batch-size", "4", "--sft-learning-rate", "0.01"]
    argv = ["rlhf", *ENV, *sft, "--steps", "2", "--checkpoint-every", "1", *TINY]
    assert main([*argv, "--sft-demos-file", str(path), "--out", str(out)]) == 0
    assert "after SFT" in capsys.readouterr().out
    (run_dir,) = out.iterdir()
    config = json.loads((run_dir / "config.json").read_text())
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert config["sft"] == {
        "steps": 4, "demos": 16, "batch_size": 4, "learning_rate": 0.01,
        "demos_file": {"path": str(path.resolve()), "sha256": digest},
    }  # fmt: skip
    record = json.loads((run_dir / "sft.json").read_text())
    assert record["loss_last"] < record["loss_first"]
    # killed before its first checkpoint: the resume trains the same SFT from the file
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copy(run_dir / "config.json", killed)
    original = path.read_bytes()
    path.write_bytes(original + b"\n")
    assert main(["rlhf", "--resume", str(killed), "--no-progress"]) == 2
    now = hashlib.sha256(path.read_bytes()).hexdigest()
    assert capsys.readouterr().err == (
        f"ppojax rlhf: error: --sft-demos-file {path.resolve()} changed since the run began "
        f"(sha256 {digest[:12]}..., now {now[:12]}...): restore it to train this run's SFT, "
        "or start a new run\n"
    )
    assert sorted(p.name for p in killed.iterdir()) == ["config.json"]
    path.write_bytes(original)
    assert main(["rlhf", "--resume", str(killed), "--steps", "1", "--no-progress"]) == 0
    assert json.loads((killed / "sft.json").read_text())["loss"] == record["loss"]
    # a folder past its SFT needs no demonstrations: the file may go
    path.unlink()
    assert main(["rlhf", "--resume", str(run_dir), "--no-progress"]) == 0  # at its end: no step
    shutil.rmtree(killed / "checkpoints")
    assert main(["rlhf", "--resume", str(killed), "--no-progress"]) == 2
    assert capsys.readouterr().err.endswith(
        f"--sft-demos-file {path.resolve()} (config.json sft.demos_file) is gone: put it back "
        "to train this run's SFT, or start a new run\n"
    )


GOOD = {"seed": 1, "turns": [[GET, KEY, EOS]]}
BAD_LINES = [
    ("not JSON", "{", "line 2: not JSON (Expecting property name enclosed in double quotes at "
     "column 2)"),
    ("not an object", "[1, 2]", "line 2: must be a JSON object with seed and turns"),
    ("unknown field", {**GOOD, "reply": [1]}, "line 2: unknown field 'reply'; a line has "
     "seed, turns, prompt"),
    ("no turns", {"seed": 1}, "line 2: field 'turns' is missing"),
    ("seed", {**GOOD, "seed": -1}, "line 2: field 'seed' must be an int in [0, 2**32), got -1"),
    ("seed type", {**GOOD, "seed": "1"}, "line 2: field 'seed' must be an int in [0, 2**32), "
     "got '1'"),
    ("empty turns", {**GOOD, "turns": []}, "line 2: field 'turns' must be a non-empty list of "
     "turns"),
    ("text turn", {**GOOD, "turns": [[GET, KEY, EOS], "GET a"]}, "line 2: field 'turns'[1] "
     "must be a non-empty list of token ids, got 'GET a'"),
    ("prompt type", {**GOOD, "prompt": "ab"}, "line 2: field 'prompt' must be a list of token "
     "ids"),
    ("too many turns", {**GOOD, "turns": [[GET, KEY, EOS]] * 5}, "line 2: field 'turns' has 5 "
     "turns, more than --turns 4: raise --turns or shorten the episode"),
    ("too long", {**GOOD, "turns": [[GET, KEY, KEY, EOS]]}, "line 2: field 'turns'[0] has 4 "
     "token ids, more than --turn-len 3: raise --turn-len"),
    ("vocabulary", {**GOOD, "turns": [[GET, 99, EOS]]}, "line 2: field 'turns'[0] holds token "
     "id 99, outside the env's vocabulary (0 to 18)"),
    ("no eos", {**GOOD, "turns": [[GET, KEY]]}, "line 2: field 'turns'[0] must end with the "
     f"env's end-of-turn id {EOS}, and hold it only there, got [{GET}, {KEY}]"),
    ("after the end", {**GOOD, "turns": [[ANS, 10, EOS], [GET, KEY, EOS]]}, "line 2: field "
     "'turns' has 2 turns, but the env ended the episode after turn 1: drop the turns after "
     "it"),
    ("prompt", {**GOOD, "prompt": [1, 2, 3]}, "line 2: field 'prompt' is [1, 2, 3], but the "
     "env's reset gives [1, 9, 8] for seed 1: the line was recorded against another env"),
]  # fmt: skip


@pytest.mark.parametrize("line, message", [c[1:] for c in BAD_LINES], ids=[c[0] for c in BAD_LINES])
def test_a_bad_line_is_one_error_naming_file_line_and_field(
    tmp_path, keylookup, capsys, line, message
):
    path = write(tmp_path / "demos.jsonl", [{"seed": 0, "turns": [[GET, KEY, EOS]]}, line])
    out = tmp_path / "runs"
    argv = ["rlhf", *ENV, "--sft-steps", "2", "--sft-demos-file", str(path), *TINY]
    assert main([*argv, "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"ppojax rlhf: error: --sft-demos-file {path} {message}\n"
    assert not out.exists()


def test_a_bad_file_or_flag_is_one_error_and_no_run_folder(tmp_path, keylookup, capsys):
    out = tmp_path / "runs"
    good = write(tmp_path / "good.jsonl", lines_of(keylookup, 2))
    argv = ["rlhf", *ENV, *TINY, "--out", str(out)]
    missing, empty = tmp_path / "missing.jsonl", write(tmp_path / "empty.jsonl", ["", " "])
    cases = [
        (["--sft-steps", "2", "--sft-demos-file", str(missing)],
         f"--sft-demos-file {missing}: cannot read it (No such file or directory)"),
        (["--sft-steps", "2", "--sft-demos-file", str(empty)],
         f"--sft-demos-file {empty}: holds no demonstrations; give one JSON object a line"),
        (["--sft-steps", "2", "--sft-demos-file", str(good), "--sft-demos", "8"],
         f"--sft-demos 8 and --sft-demos-file {good}: give one (the file's lines are the "
         "demonstrations)"),
        (["--sft-demos-file", str(good)],
         "--sft-demos-file set(s) up SFT: give --sft-steps N too"),
        (["--sft-steps", "2", "--sft-demos-file", str(good), "--token-budget", "6"],
         "--sft-demos-file replays demonstrations without a token budget: leave out "
         "--token-budget 6"),
    ]  # fmt: skip
    for flags, message in cases:
        assert main([*argv, *flags]) == 2
        assert capsys.readouterr().err == f"ppojax rlhf: error: {message}\n"
    assert not out.exists()


class Faulty(PythonTextEnv):
    """A Python env that replies past its width to a turn of 3, and raises on a turn of 4
    (the check before training steps a turn of EOS alone, which it answers well)."""

    prompt_len, reply_len = 1, 1
    vocab_size, pad_id, eos_id = 5, 0, 2

    def reset(self, key):
        return 0, [1]

    def step(self, state, response):
        if response[0] == 4:
            raise RuntimeError("no such command")
        return state, [1, 1] if response[0] == 3 else [1], 0.0, False


@pytest.mark.parametrize(
    "turn, message",
    [
        ([3, 2], "line 1: the env replied 2 token ids to turn 0, more than its reply_len 1"),
        ([4, 2], "line 1: text env 'faulty' raised RuntimeError: no such command"),
    ],
)
def test_a_python_env_failing_on_a_line_is_named_with_it(tmp_path, capsys, turn, message):
    register_text_env("faulty", Faulty)
    try:
        path = write(tmp_path / "demos.jsonl", [{"seed": 0, "turns": [turn]}])
        out = tmp_path / "runs"
        argv = ["rlhf", "--env", "faulty", "--sft-steps", "2", "--sft-demos-file", str(path)]
        assert main([*argv, *TINY, "--out", str(out)]) == 2
        assert capsys.readouterr().err == f"ppojax rlhf: error: --sft-demos-file {path} {message}\n"
        assert not out.exists()
    finally:
        env_module._FACTORIES.pop("faulty", None)
