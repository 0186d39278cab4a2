"""``ppojax sft | rm | dpo`` and ``ppojax rlhf --model`` on a tiny Llama folder: the run folder
each writes, ``final/`` read back by ``from_pretrained``, a killed run resuming bit-exactly,
W&B logging, and bad input named by file, line or field."""

import csv
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import chex
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.cli import main
from ppojax.rlhf import from_pretrained, save_pretrained
from ppojax.rlhf.models.pretrained import load_value_head
from ppojax.runs import folder
from ppojax.runs.lm.text_run import drop_lines_after

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "hf" / "llama"
SUMS = [(a, b) for a in range(1, 5) for b in range(1, 3)]
FAST = ["--steps", "4", "--checkpoint-every", "2", "--batch-size", "4", "--no-progress"]
RUN_FILES = ("config.json", "metrics.csv", "curves.png", "summary.json", "final/config.json")


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A copy of the tiny Llama folder and the JSONL files of a two-number addition task."""
    root = tmp_path_factory.mktemp("text")
    model = shutil.copytree(FIXTURE, root / "llama")
    questions = [(f"What is {a}+{b}?", str(a + b)) for a, b in SUMS]
    sft = [{"prompt": q, "completion": a} for q, a in questions]
    pairs = [{"prompt": q, "chosen": a, "rejected": str(int(a) + 1)} for q, a in questions]
    prompts = [{"prompt": q, "answer": a} for q, a in questions]
    (root / "my_rewards.py").write_text(
        "def short(prompts, responses):\n    return [-len(r) / 10 for r in responses]\n"
        "def infinite(prompts, responses):\n    return [float('inf')] * len(responses)\n"
        "def broken(prompts, responses):\n    return [1 / 0 for r in responses]\n"
        "CALLS, FAIL_AFTER = [0], [None]\n"
        "def later(prompts, responses):  # fine for the check, then as FAIL_AFTER says\n"
        "    CALLS[0] += 1\n"
        "    if FAIL_AFTER[0] is not None and CALLS[0] > FAIL_AFTER[0]:\n"
        "        raise KeyError('no answer column')\n"
        "    return [0.5] * len(responses)\n"
    )
    return types.SimpleNamespace(
        root=root,
        model=model,
        sft=write_jsonl(root / "sft.jsonl", sft),
        pairs=write_jsonl(root / "pairs.jsonl", pairs),
        prompts=write_jsonl(root / "prompts.jsonl", prompts),
    )


def run(argv: list[str], out: Path) -> Path:
    """``ppojax`` with ``argv`` into a fresh ``out``; the run folder it made."""
    assert main([*argv, "--out", str(out)]) == 0
    (run_dir,) = out.iterdir()
    return run_dir


def kill_after_first_checkpoint(run_dir: Path, to: Path) -> Path:
    """A copy of ``run_dir`` as a kill right after the checkpoint at step 2 leaves it."""
    killed = shutil.copytree(run_dir, to)
    for name in ("checkpoints/4", "final", "summary.json"):
        shutil.rmtree(killed / name) if (killed / name).is_dir() else (killed / name).unlink()
    folder.truncate_metrics(killed / "metrics.csv", 2)
    return killed


def assert_resumes_bit_exactly(command: str, run_dir: Path, tmp_path: Path) -> None:
    killed = kill_after_first_checkpoint(run_dir, tmp_path / "killed")
    assert main([command, "--resume", str(killed), "--no-progress"]) == 0
    for name in ("final/model.safetensors", "metrics.csv"):
        assert (killed / name).read_bytes() == (run_dir / name).read_bytes(), name


def metric_rows(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as file:
        return list(csv.DictReader(file))


class FakeWandb(types.ModuleType):
    """What ppojax calls of wandb, recorded: init, log (with tables), summary, finish."""

    def __init__(self):
        super().__init__("wandb")
        self.runs = []

    def init(self, **kwargs):
        run = types.SimpleNamespace(kwargs=kwargs, logged=[], summary={}, exit_code=None)
        run.log = lambda values, step: run.logged.append((step, values))
        run.finish = lambda exit_code=0: setattr(run, "exit_code", exit_code)
        self.runs.append(run)
        return run

    class Table:
        def __init__(self, columns, data):
            self.columns, self.data = columns, data


def test_sft_writes_the_run_folder_and_resumes_bit_exactly(files, tmp_path, monkeypatch, capsys):
    wandb = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    argv = ["sft", "--model", str(files.model), "--data", str(files.sft), *FAST, "--wandb"]
    run_dir = run([*argv, "--learning-rate", "1e-3"], tmp_path / "runs")
    assert "final model:" in capsys.readouterr().out
    for name in RUN_FILES:
        assert (run_dir / name).exists(), name
    rows = metric_rows(run_dir)
    assert [row["update"] for row in rows] == ["1", "2", "3", "4"]
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"])
    assert [row["nonfinite_steps"] for row in rows] == ["0.0"] * 4  # the guard skipped none
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir()) == [2, 4]
    start, trained = from_pretrained(files.model), from_pretrained(run_dir / "final")
    assert dataclasses.replace(trained.config, raw=start.config.raw) == start.config
    moved = [not np.array_equal(a, b) for a, b in zip(leaves(start), leaves(trained), strict=True)]
    assert all(moved)
    (logged,) = wandb.runs
    assert [step for step, _ in logged.logged] == [1, 2, 3, 4] and logged.exit_code == 0
    assert logged.summary["loss"] == pytest.approx(float(rows[-1]["loss"]))
    assert_resumes_bit_exactly("sft", run_dir, tmp_path)
    resumed = wandb.runs[-1]
    assert resumed.kwargs["id"] == logged.kwargs["id"]  # the resume logs on into that run
    assert [step for step, _ in resumed.logged] == [3, 4]


def leaves(lm) -> list[np.ndarray]:
    import jax

    return [np.asarray(leaf) for leaf in jax.tree.leaves(lm.params)]


def test_reward_model_and_dpo_on_pairs(files, tmp_path):
    argv = ["--model", str(files.model), "--pairs", str(files.pairs), *FAST]
    rm_dir = run(["rm", *argv, "--held-out", "2", "--learning-rate", "1e-3"], tmp_path / "rm")
    summary = folder.read_json(rm_dir / "summary.json")
    assert 0 <= summary["held_out"]["held_out_accuracy"] <= 1
    assert {"loss", "rewards/accuracies", "rewards/margins"} <= set(metric_rows(rm_dir)[0])
    reward_lm = from_pretrained(rm_dir / "final")
    head = load_value_head(reward_lm, rm_dir / "final")["params"]["value_head"]
    assert np.abs(np.asarray(head["kernel"])).sum() > 0  # trained away from its start at 0

    dpo_dir = run(["dpo", *argv, "--loss", "ipo", "--beta", "0.5"], tmp_path / "dpo")
    assert {"loss", "rewards/accuracies", "rewards/margins"} <= set(metric_rows(dpo_dir)[0])
    settings = folder.read_json(dpo_dir / "config.json")
    assert (settings["loss"], settings["beta"]) == ("ipo", 0.5)
    chex.assert_trees_all_equal_shapes(
        from_pretrained(dpo_dir / "final").params, from_pretrained(files.model).params
    )


@pytest.mark.heavy
def test_rlhf_with_a_text_reward_and_a_reward_model(files, tmp_path, monkeypatch, capsys):
    """Also a reward that passes the check on the first prompts and fails at step 3 in
    training: one line naming it, the run stopped with its checkpoint of step 2, and
    ``--resume`` going on from there once it is fixed."""
    import importlib

    monkeypatch.chdir(files.root)  # my_rewards imports from the current folder
    monkeypatch.syspath_prepend(str(files.root))
    # another test of this process may have imported a my_rewards of its own folder
    monkeypatch.delitem(sys.modules, "my_rewards", raising=False)
    rewards = importlib.import_module("my_rewards")
    rewards.CALLS[0], rewards.FAIL_AFTER[0] = 0, 3  # the check and steps 1-2 pass
    wandb = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    reward_lm = from_pretrained(files.model)  # a reward model as `ppojax rm` leaves one
    params = reward_lm.init_value_head(reward_lm.params)
    params["params"]["value_head"]["kernel"] = jnp.linspace(-1, 1, 64)[:, None]
    reward_model = save_pretrained(reward_lm, params, tmp_path / "reward_model")
    argv = ["rlhf", "--model", str(files.model), "--prompts", str(files.prompts), *FAST]
    argv += ["--reward", "my_rewards:short", "--reward", "my_rewards:later"]
    argv += ["--reward-model", str(reward_model)]
    argv += ["--algorithm", "grpo", "--group-size", "2", "--response-len", "4"]
    argv += ["--num-minibatches", "2", "--update-epochs", "1", "--samples", "2", "--wandb"]
    assert main([*argv, "--out", str(tmp_path / "rlhf")]) == 2
    (run_dir,) = (tmp_path / "rlhf").iterdir()
    assert capsys.readouterr().err == (
        f"ppojax rlhf: error: --reward my_rewards:later ({files.root / 'my_rewards.py'}:11): "
        "KeyError: 'no answer column' (at step 3, on responses sampled in training); fix it: a "
        "reward takes (prompts, responses, **columns) and returns one finite float per "
        f"response, then continue with --resume {run_dir}: the run stopped before step 3, "
        "checkpoints/2 kept\n"
    )
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["2"]
    assert [row["update"] for row in metric_rows(run_dir)] == ["1", "2"]
    assert not (run_dir / "final").exists() and not (run_dir / "lock").exists()
    rewards.FAIL_AFTER[0] = None  # fixed
    assert main(["rlhf", "--resume", str(run_dir), "--no-progress"]) == 0
    for name in (*RUN_FILES, "samples.jsonl"):
        assert (run_dir / name).exists(), name
    rows = metric_rows(run_dir)
    assert [row["update"] for row in rows] == ["1", "2", "3", "4"]
    names = {"rewards/short/mean", "rewards/later/mean", "rewards/reward_model_score/mean"}
    assert names | {"objective/kl"} <= set(rows[0])
    assert {row["rewards/later/mean"] for row in rows} == {"0.5"}
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [(s["step"], s["prompt"]) for s in samples] == [
        (step, f"What is 1+{b}?") for step in (2, 4) for b in (1, 2)
    ]
    failed, resumed = wandb.runs  # the resume logs on into the failed run's W&B run
    assert failed.exit_code == 1 and resumed.kwargs["id"] == failed.kwargs["id"]
    assert [step for step, values in failed.logged if "samples" not in values] == [1, 2]
    assert [step for step, values in resumed.logged if "samples" not in values] == [3, 4]
    tables = [
        values["samples"] for run in wandb.runs for _, values in run.logged if "samples" in values
    ]
    assert [table.data[0][:2] for table in tables] == [[2, "What is 1+1?"], [4, "What is 1+1?"]]
    from_pretrained(run_dir / "final")


def test_a_resume_drops_the_samples_written_after_its_checkpoint(tmp_path):
    path = tmp_path / "samples.jsonl"
    rows = [{"step": step, "prompt": "p", "response": "r"} for step in (2, 2, 4)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"step": 6, "pro')
    drop_lines_after(path, 2)
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows[:2]


RLHF = ["rlhf", "--prompts", "{prompts}", "--reward", "my_rewards:short"]
LONG = (
    r"long\.jsonl: prompts \(700 tokens, --max-len 700\) and --response-len 10 take 710 "
    r"tokens, more than the model's context \(256\); lower --max-len to 246 or less"
)

INFINITE = (
    r"--reward my_rewards:infinite \(\S+my_rewards\.py:3\): ValueError: text reward infinite "
    r"returned inf at position 0\. \(on the first 4 prompts of \S+prompts\.jsonl with random "
)
TOO_LONG = (
    r"long\.jsonl, line 4: the prompt has \d+ tokens, more than the 246 the model's context "
    r"\(256 tokens\) leaves beside --response-len 10; give --max-len 246 to cut prompts on the "
    r"left$"
)
MINIBATCHES = (
    r"--num-minibatches 3 must divide --batch-size 8 x --group-size 2 = 16 responses a step; "
    r"choose a divisor of 16"
)
BROKEN = r"--reward my_rewards:broken \(\S+my_rewards\.py:6\): ZeroDivisionError: division by"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["sft", "--data", "{bad_sft}"], r"bad\.jsonl, line 2: no field 'completion'"),
        (["dpo", "--pairs", "{same_pair}"], r"same\.jsonl, line 1: .* are the same text"),
        (["rlhf", "--prompts", "{prompts}", "--reward", "my_rewards"], r"give MODULE:FUNCTION"),
        (["rlhf", "--prompts", "{prompts}", "--reward", "no_such:fn"], r"cannot import 'no_such'"),
        (["rlhf", "--prompts", "{prompts}", "--reward", "my_rewards:nope"], r"no function 'nope'"),
        (["sft", "--data", "{sft}", "--model", "{root}"], r"config\.json does not exist"),
        (["sft", "--data", "{sft}", "--batch-size", "99"], r"fewer than --batch-size 99"),
        (["sft", "--data", "{sft}", "--learning-rate", "-1"], r"--learning-rate must be .* > 0"),
        (["sft", "--data", "{sft}", "--learning-rate", "0"], r"--learning-rate must be .* > 0"),
        (["dpo", "--pairs", "{pairs}", "--learning-rate", "-1"], r"--learning-rate must be"),
        (["rm", "--pairs", "{pairs}", "--learning-rate", "0"], r"--learning-rate must be"),
        (["dpo", "--pairs", "{pairs}", "--beta", "0"], r"--beta must be a finite number > 0"),
        (["sft", "--data", "{sft}", "--batch-size", "0"], r"--batch-size must be a positive int"),
        ([*RLHF, "--batch-size", "0"], r"--batch-size must be a positive int"),
        (["sft", "--data", "{sft}", "--steps", "0"], r"--steps must be a positive int"),
        (["sft", "--data", "{sft}", "--max-len", "0"], r"--max-len must be a positive int"),
        (["rm", "--pairs", "{pairs}", "--held-out", "8"], r"--held-out 8 keeps out all 8 pairs"),
        ([*RLHF, "--group-size", "1", "--algorithm", "rloo"], r"--group-size must be >= 2 for"),
        ([*RLHF, "--prompts", "{long}", "--max-len", "700"], LONG),
        ([*RLHF, "--prompts", "{long}"], TOO_LONG),
        ([*RLHF, "--reward", "my_rewards:infinite"], INFINITE),
        ([*RLHF, "--group-size", "2", "--num-minibatches", "3"], MINIBATCHES),
        ([*RLHF, "--reward", "my_rewards:broken"], BROKEN),
    ],
)
def test_bad_input_is_named_and_makes_no_run_folder(
    files, tmp_path, monkeypatch, capsys, argv, message
):
    monkeypatch.chdir(files.root)
    write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "a", "completion": "b"}, {"prompt": "c"}])
    write_jsonl(tmp_path / "same.jsonl", [{"prompt": "a", "chosen": "b", "rejected": "b"}])
    long = [{"prompt": "1+2=3?"}] * 3 + [{"prompt": "1+2=3? " * 60}] * 5  # > 256 tokens
    write_jsonl(tmp_path / "long.jsonl", long)
    paths = {"bad_sft": tmp_path / "bad.jsonl", "same_pair": tmp_path / "same.jsonl"}
    paths["long"] = tmp_path / "long.jsonl"
    paths.update(sft=files.sft, pairs=files.pairs, prompts=files.prompts, root=files.root)
    argv = [word.format(**paths) for word in argv]
    if "--model" not in argv:
        argv += ["--model", str(files.model)]
    assert main([*argv, "--out", str(tmp_path / "runs"), "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert re.search(message, error), error
    assert error.count("error:") == 1 and not (tmp_path / "runs").exists()


def test_resume_of_a_model_folder_and_a_broken_config_json_are_named(files, tmp_path, capsys):
    assert main(["sft", "--resume", str(files.model)]) == 2
    error = capsys.readouterr().err
    assert f"--resume {files.model}: that is a model folder, not a run folder" in error, error
    assert f"train it with --model {files.model}" in error
    model = shutil.copytree(files.model, tmp_path / "llama")
    (model / "config.json").write_text('{\n  "model_type": "llama",\n}\n')
    argv = ["sft", "--model", str(model), "--data", str(files.sft), "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "runs")]) == 2
    error = capsys.readouterr().err
    assert f"{model / 'config.json'}, line 3: not valid JSON (" in error, error
    assert not (tmp_path / "runs").exists()


def test_resume_of_another_commands_run_folder_is_refused(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"command": "sft"}))
    assert main(["dpo", "--resume", str(tmp_path)]) == 2
    assert "one of 'sft', not dpo" in capsys.readouterr().err
    assert main(["sft", "--resume", str(tmp_path), "--steps", "9", "--no-progress"]) == 2
    assert "with the settings in its config.json; drop --steps" in capsys.readouterr().err


def test_ppojax_rlhf_tells_a_model_run_from_a_digit_task(tmp_path):
    from ppojax.cli.text_checks import is_model_run

    (tmp_path / "config.json").write_text(json.dumps({"command": "rlhf"}))
    assert is_model_run(["--model", "m", "--prompts", "p.jsonl"])
    assert is_model_run(["--resume", str(tmp_path), "--no-progress"])
    (tmp_path / "config.json").write_text(json.dumps({"task": {}, "rlhf": {}, "run": {}}))
    assert not is_model_run(["--resume", str(tmp_path)])
    assert not is_model_run(["--task", "reversal", "--steps", "4"])


@pytest.mark.parametrize("algorithm, size", [("grpo", 8), ("rloo", 8), ("ppo", None)])
def test_rlhf_without_group_size_gets_one_that_works(files, monkeypatch, algorithm, size):
    from ppojax.cli.text import build_parser, settings_from_args

    monkeypatch.chdir(files.root)
    parser = build_parser("rlhf")
    argv = ["--model", str(files.model), "--prompts", str(files.prompts), "--reward"]
    args = parser.parse_args([*argv, "my_rewards:short", "--algorithm", algorithm])
    assert settings_from_args("rlhf", args)["rlhf"].get("group_size") == size
    assert "grpo, rloo: 8" in parser.format_help()
    assert "(longer: cut on the left)" in parser.format_help()  # as load_prompts does
    args = parser.parse_args(
        [*argv, "my_rewards:short", "--algorithm", algorithm, "--group-size", "3"]
    )
    assert settings_from_args("rlhf", args)["rlhf"]["group_size"] == 3


def test_a_tokenizer_with_more_ids_than_embedding_rows_is_refused(files, tmp_path, capsys):
    model = shutil.copytree(files.model, tmp_path / "llama")
    tokenizer = json.loads((model / "tokenizer.json").read_text())
    vocab_size = json.loads((model / "config.json").read_text())["vocab_size"]
    vocab = tokenizer["model"]["vocab"]
    vocab.update({f"extra{i}": i for i in range(len(vocab), vocab_size + 4)})  # 4 rows short
    (model / "tokenizer.json").write_text(json.dumps(tokenizer))
    argv = ["sft", "--model", str(model), "--data", str(files.sft), "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "runs")]) == 2
    error = capsys.readouterr().err
    assert f"{model / 'tokenizer.json'} has token ids up to {vocab_size + 3}" in error
    assert f"{model / 'config.json'} has vocab_size {vocab_size}" in error
    assert "resize_token_embeddings" in error and not (tmp_path / "runs").exists()


@pytest.mark.parametrize("damage", ["drop", "cut", "cut_header"])
def test_damaged_weights_are_one_line_naming_the_file(files, tmp_path, capsys, damage):
    from safetensors.numpy import load_file, save_file

    model = shutil.copytree(files.model, tmp_path / "llama")
    weights = model / "model.safetensors"
    if damage == "drop":
        tensors = load_file(weights)
        del tensors["lm_head.weight"]
        save_file(tensors, weights)
        message = "tensor 'lm_head.weight' is missing from model.safetensors; the checkpoint"
    else:
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2] if damage == "cut" else data[:20])
        message = f"{weights} is not a readable safetensors file ("
    argv = ["sft", "--model", str(model), "--data", str(files.sft), "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "runs")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("ppojax sft: error: " + message), error
    assert error.count("\n") == 1 and not (tmp_path / "runs").exists()


def test_ppojax_rlhf_help_shows_the_model_run_flags(capsys):
    with pytest.raises(SystemExit):
        main(["rlhf", "--help"])
    shown = " ".join(capsys.readouterr().out.split())  # argparse wraps the epilog
    for flag in ("--model FOLDER", "--prompts FILE.jsonl", "--reward MODULE:FUNCTION"):
        assert flag in shown, flag
    with pytest.raises(SystemExit):
        main(["rlhf", "--model", "m", "--help"])
    shown = capsys.readouterr().out
    assert "--prompts FILE.jsonl" in shown and "--reward-model FOLDER" in shown


@pytest.mark.parametrize(
    "template, message",
    [
        ("{{ 1 / 0 }}", r"failed on a conversation of 1 messages \(ZeroDivisionError: division by"),
        ("{{ raise_exception('no user turn') }}", r"\(TemplateError: no user turn\); fix the"),
        ("{% if %}", r"the chat template does not parse \(its line 1: "),
    ],
)
def test_a_broken_chat_template_names_its_file(files, tmp_path, capsys, template, message):
    model = shutil.copytree(files.model, tmp_path / "llama")
    settings = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(
        json.dumps({**settings, "chat_template": template})
    )
    argv = ["sft", "--model", str(model), "--data", str(files.sft), "--chat", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path / "runs")]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"ppojax sft: error: {model / 'tokenizer_config.json'}: "), error
    assert re.search(message, error) and not (tmp_path / "runs").exists(), error


def test_a_live_run_folder_refuses_a_second_writer_and_a_killed_runs_lock_is_taken(
    tmp_path, capsys
):
    import os
    import socket
    import subprocess

    from ppojax.runs.lock import holder, run_lock

    run_dir = tmp_path / "sft-run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"command": "sft"}))
    host = socket.gethostname()
    for pid, where in ((os.getppid(), host), (1, "another-host")):  # live, or not checkable
        (run_dir / "lock").write_text(f"{pid} {where}\n")
        assert main(["sft", "--resume", str(run_dir), "--no-progress"]) == 2
        error = capsys.readouterr().err
        assert f"{run_dir} is in use: process {pid} on {where} is training there" in error
        assert (run_dir / "lock").read_text() == f"{pid} {where}\n"  # left as it was
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    (run_dir / "lock").write_text(f"{int(gone.stdout)} {host}\n")  # a killed run's
    with run_lock(run_dir) as path:
        assert holder(path) == (os.getpid(), host)
    assert not path.exists()


def test_two_processes_taking_over_one_stale_lock_at_once_do_not_both_win(tmp_path, monkeypatch):
    import os
    import socket
    import subprocess
    import threading

    from ppojax.runs import lock

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    (tmp_path / "lock").write_text(f"{int(gone.stdout)} {socket.gethostname()}\n")
    # Both find the lock stale before either acts; then one takes it over while the other
    # waits, and the other goes on from what it read: the race, made certain.
    both_read, first_done = threading.Barrier(2), threading.Event()
    judged, is_stale = set(), lock.is_stale

    def judge_then_wait(owner):
        stale = is_stale(owner)
        if threading.get_ident() not in judged:
            judged.add(threading.get_ident())
            if both_read.wait(timeout=30) != 0:
                first_done.wait(timeout=30)
        return stale

    monkeypatch.setattr(lock, "is_stale", judge_then_wait)
    results = []

    def take():
        try:
            results.append(lock.acquire(tmp_path))
        except ValueError as error:
            results.append(error)
        finally:
            first_done.set()

    threads = [threading.Thread(target=take) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    won = [result for result in results if isinstance(result, Path)]
    (lost,) = [result for result in results if isinstance(result, ValueError)]
    assert won == [tmp_path / "lock"]
    assert f"process {os.getpid()} on {socket.gethostname()} is training there" in str(lost)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lock"]  # no take-over file left
    monkeypatch.setattr(lock, "is_stale", is_stale)
    dead = f"{int(gone.stdout)} {socket.gethostname()}\n"
    for name in ("lock", "lock.takeover"):  # a process killed while taking over
        (tmp_path / name).write_text(dead)
    with pytest.raises(ValueError, match=r"died while taking over its stale lock; delete "):
        lock.acquire(tmp_path)


def test_a_run_whose_updates_are_all_skipped_says_so_and_exits_3_without_final(
    files, tmp_path, capsys
):
    argv = ["sft", "--model", str(files.model), "--data", str(files.sft), *FAST]
    assert main([*argv, "--learning-rate", "1e30", "--out", str(tmp_path / "runs")]) == 3
    (run_dir,) = (tmp_path / "runs").iterdir()
    error = capsys.readouterr().err
    reports = [line for line in error.splitlines() if line.startswith("ppojax: step")]
    assert reports == [
        f"ppojax: step {first} skipped 1 of its 1 update(s) for a NaN or inf in the loss, "
        f"gradients or parameters; 2 of steps {first}-{first + 1} skipped all theirs (the "
        "parameters stay the last finite ones). If it goes on: lower --learning-rate; in "
        "rlhf, check the rewards' scale (and the reward model)"
        for first in (1, 3)
    ]
    assert error.endswith(
        "ppojax sft: error: the run diverged and never recovered: from step 1 on updates "
        "were skipped for a NaN or inf, and its last step, 4, skipped all 1; 4 of its 4 steps "
        "trained nothing. No final/ is written: its newest checkpoint holds the model it "
        "started from. Lower --learning-rate; in rlhf, check the rewards' scale (and the "
        "reward model), then train again\n"
    ), error
    assert not (run_dir / "final").exists() and not (run_dir / "summary.json").exists()
    assert [row["gradient_steps"] for row in metric_rows(run_dir)] == ["0.0"] * 4
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir()) == [2, 4]


def test_ctrl_c_exits_130_as_ppojax_train_does(files, monkeypatch, capsys):
    from ppojax.cli import text

    def interrupted(command, args):
        raise KeyboardInterrupt

    monkeypatch.setattr(text, "run", interrupted)
    assert main(["sft", "--model", str(files.model), "--data", str(files.sft)]) == 130
    assert capsys.readouterr().err == (
        "ppojax: interrupted (a run with checkpoints continues with --resume)\n"
    )


def ppojax_process(root: Path, *argv: str) -> None:
    """``ppojax`` in a process of its own: JAX makes its CPU devices once, when its backend
    starts, so --devices N needs a fresh process."""
    command = [sys.executable, "-m", "ppojax", *argv]
    done = subprocess.run(command, capture_output=True, text=True, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.heavy
def test_bf16_on_two_devices_is_recorded_saves_bf16_and_resumes_bit_exactly(files, tmp_path):
    def ppojax(*argv: str) -> None:
        ppojax_process(files.root, *argv)

    out = tmp_path / "runs"
    flags = ["--dtype", "bfloat16", "--devices", "2", "--learning-rate", "1e-3"]
    ppojax(
        "sft",
        "--model",
        str(files.model),
        "--data",
        str(files.sft),
        *FAST,
        *flags,
        "--out",
        str(out),
    )
    (run_dir,) = out.iterdir()
    settings = json.loads((run_dir / "config.json").read_text())
    assert (settings["dtype"], settings["devices"], settings["master_weights"]) == (
        "bfloat16",
        2,
        True,
    )
    saved = json.loads((run_dir / "final" / "config.json").read_text())
    assert saved["torch_dtype"] == "bfloat16"
    trained = from_pretrained(run_dir / "final", dtype="bfloat16")
    start = from_pretrained(files.model, dtype="bfloat16")
    moved = [not np.array_equal(a, b) for a, b in zip(leaves(start), leaves(trained), strict=True)]
    assert all(moved)
    killed = kill_after_first_checkpoint(run_dir, tmp_path / "killed")
    ppojax("sft", "--resume", str(killed), "--no-progress")
    for name in ("final/model.safetensors", "metrics.csv"):
        assert (killed / name).read_bytes() == (run_dir / name).read_bytes(), name


@pytest.mark.heavy
def test_rlhf_in_bf16_on_two_devices_runs_and_resumes_bit_exactly(files, tmp_path):
    out = tmp_path / "runs"
    argv = ["rlhf", "--model", str(files.model), "--prompts", str(files.prompts), *FAST]
    argv += ["--reward", "my_rewards:short", "--algorithm", "grpo", "--group-size", "2"]
    argv += ["--response-len", "4", "--num-minibatches", "2", "--update-epochs", "1"]
    # sampling tensor-parallel (not auto's replicated on a CPU): the layout is recorded and a
    # resume samples in it again, bit for bit
    argv += ["--dtype", "bfloat16", "--devices", "2", "--sample-layout", "tensor"]
    ppojax_process(files.root, *argv, "--out", str(out))
    (run_dir,) = out.iterdir()
    settings = json.loads((run_dir / "config.json").read_text())
    assert (settings["dtype"], settings["devices"], settings["sample_layout"]) == (
        "bfloat16",
        2,
        "tensor",
    )
    assert json.loads((run_dir / "final" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    killed = kill_after_first_checkpoint(run_dir, tmp_path / "killed")
    ppojax_process(files.root, "rlhf", "--resume", str(killed), "--no-progress")
    for name in ("final/model.safetensors", "metrics.csv"):
        assert (killed / name).read_bytes() == (run_dir / name).read_bytes(), name


def test_a_run_folder_from_before_dtype_and_devices_resumes_as_float32_on_one_device(
    files, tmp_path
):
    argv = ["sft", "--model", str(files.model), "--data", str(files.sft), *FAST]
    run_dir = run(argv, tmp_path / "runs")
    killed = kill_after_first_checkpoint(run_dir, tmp_path / "old")
    config = json.loads((killed / "config.json").read_text())
    for name in ("dtype", "devices", "master_weights"):  # what older versions did not write
        del config[name]
    (killed / "config.json").write_text(json.dumps(config))
    assert main(["sft", "--resume", str(killed), "--no-progress"]) == 0
    for name in ("final/model.safetensors", "metrics.csv"):
        assert (killed / name).read_bytes() == (run_dir / name).read_bytes(), name
