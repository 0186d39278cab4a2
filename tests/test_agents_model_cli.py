"""``ppojax rlhf --env ID --model FOLDER``: a Hugging Face folder (tests/fixtures/hf/qwen2, a
ChatML template) trained on the calculator through its tokenizer and chat template, from the
shell: the run folder, ``final/`` as a Hugging Face folder, a resume bit for bit, a gone
model folder named; how ``--env`` picks the episode form beside ``--model``; ``--dtype``; and
each bad combination's one line, exit code 2 and no run folder."""

import argparse
import csv
import json
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from ppojax.cli import rlhf
from ppojax.cli.commands import main
from ppojax.rlhf import RLHFConfig
from ppojax.rlhf.models.pretrained import from_pretrained
from ppojax.runs.lm import episode_settings, episode_setup

MODEL = Path(__file__).resolve().parent / "fixtures" / "hf" / "qwen2"
CALCULATOR = ["--env", "calculator", "--env-arg", "num_digits=1", "--turn-len", "4"]
TINY = ["--batch-size", "2", "--group-size", "2", "--eval-episodes", "4", "--no-progress"]


def rows(run_dir):
    with open(run_dir / "metrics.csv") as file:
        return list(csv.DictReader(file))


def fresh_args(*argv: str) -> argparse.Namespace:
    return episode_settings.build_parser().parse_args([*CALCULATOR, "--model", str(MODEL), *argv])


@pytest.mark.heavy
def test_a_model_folder_trains_on_the_chat_calculator_saves_final_and_resumes_exactly(
    tmp_path, capsys
):
    """2 steps write the run folder with final/ (the trained policy: an entropy bonus moves
    it whatever the rewards); a copy killed after step 1 resumed to step 2 writes step 2's row
    and final/ as the whole run did; a resume whose model folder is gone is one line naming
    it."""
    model = tmp_path / "model"
    shutil.copytree(MODEL, model)
    out = tmp_path / "runs"
    argv = ["rlhf", *CALCULATOR, "--model", str(model), *TINY, "--steps", "2",
            "--checkpoint-every", "1", "--ent-coef", "0.1"]  # fmt: skip
    assert main([*argv, "--out", str(out)]) == 0
    (whole,) = out.iterdir()
    printed = capsys.readouterr().out
    assert f"final model: {whole / 'final'}" in printed
    assert "held-out success (return >= 1)" in printed  # the calculator's rule, through chat
    config = json.loads((whole / "config.json").read_text())
    assert config["model"] == {"folder": str(model), "dtype": "float32"}
    assert config["rlhf"]["eos_id"] == 2 and config["rlhf"]["pad_id"] == 0  # <|im_end|>, pad
    start, trained = from_pretrained(model), from_pretrained(whole / "final")
    moved = jax.tree.map(lambda a, b: float(np.abs(a - b).max()), start.params, trained.params)
    assert max(jax.tree.leaves(moved)) > 0
    assert trained.tokenizer.apply_chat_template([{"role": "user", "content": "1+1"}]) == (
        start.tokenizer.apply_chat_template([{"role": "user", "content": "1+1"}])
    )
    killed = tmp_path / "killed"
    shutil.copytree(whole, killed)
    shutil.rmtree(killed / "checkpoints" / "2")
    shutil.rmtree(killed / "final")
    assert main(["rlhf", "--resume", str(killed), "--no-progress"]) == 0
    assert rows(killed) == rows(whole)  # step 2 again, bit for bit
    again = from_pretrained(killed / "final")
    for a, b in zip(jax.tree.leaves(trained.params), jax.tree.leaves(again.params), strict=True):
        np.testing.assert_array_equal(a, b)
    shutil.rmtree(model)
    capsys.readouterr()
    assert main(["rlhf", "--resume", str(killed), "--steps", "3", "--no-progress"]) == 2
    assert capsys.readouterr().err == (
        f"ppojax rlhf: error: the run's --model folder {model} (config.json's model.folder) "
        "is gone: put the model back there to go on\n"
    )


def test_env_picks_the_episode_form_beside_model_and_the_mixes_stay_named(tmp_path, capsys):
    own = rlhf.own_flags(rlhf.form_parsers())
    parsers = rlhf.form_parsers()
    flags = {form: set(parser._option_string_actions) for form, parser in parsers.items()}
    assert set(rlhf.BOTH) == (flags["model"] & flags["episode"]) - flags["task"]
    assert rlhf.choose_form(["--model", "m", "--env", "calculator"], own) == "episode"
    assert rlhf.choose_form(["--env=calculator", "--dtype", "bfloat16", "--model=m"], own) == (
        "episode"
    )
    assert rlhf.choose_form(["--model", "m", "--prompts", "p.jsonl"], own) == "model"
    assert rlhf.choose_form(["--model", "m", "--dtype", "bfloat16"], own) == "model"
    out = tmp_path / "runs"
    for argv, named in (
        (["--model", "m", "--env", "calculator", "--prompts", "p.jsonl"],
         "--prompts is a flag of the model form and --model, --env of the episode form"),
        (["--model", "m", "--turns", "3"],
         "--model is a flag of the model form and --turns of the episode form"),
    ):  # fmt: skip
        assert main(["rlhf", *argv, "--out", str(out)]) == 2
        assert capsys.readouterr().err == (
            f"ppojax rlhf: error: {named}; give the flags of one form (ppojax rlhf --help "
            "shows every form's)\n"
        )
    with pytest.raises(SystemExit):
        main(["rlhf", "--env", "calculator", "--model", "m", "--help"])
    shown = capsys.readouterr().out
    assert "--turn-len" in shown and "--prompts" not in shown  # the episode form's help
    assert not out.exists()


def test_bad_combinations_with_model_are_one_line_before_any_folder(tmp_path, capsys):
    out = tmp_path / "runs"
    base = ["rlhf", "--out", str(out), "--no-progress"]
    cases = (
        (["--env", "guessing", "--model", str(MODEL)],
         "--model trains a Hugging Face folder on an env over text, through its chat "
         "template; --env guessing is a token env (its factory takes no chat=): drop --model "
         "to train the built-in transformer on it"),
        (["--env", "guessing", "--dtype", "bfloat16"],
         "--dtype bfloat16 is the --model's dtype; the built-in transformer trains in "
         "float32: give --model FOLDER, or drop --dtype"),
        ([*CALCULATOR, "--model", str(MODEL), "--d-model", "64", "--num-layers", "2"],
         f"--d-model, --num-layers size the built-in transformer; --model {MODEL} brings its "
         "own: drop --d-model, --num-layers"),
        ([*CALCULATOR, "--model", str(MODEL), "--sft-steps", "10"],
         f"--sft-steps trains the built-in transformer on an env's demonstrations; with "
         f"--model {MODEL} the episode form runs RL only: drop --sft-steps (or SFT the "
         "folder first with ppojax sft)"),
        ([*CALCULATOR, "--model", str(tmp_path / "nowhere")],
         f"--model {tmp_path / 'nowhere'}: no such folder (a Hugging Face model folder)"),
        ([*CALCULATOR, "--model", str(MODEL), "--env-arg", "chat=1"],
         "--env-arg chat: --model FOLDER gives the env its chat template"),
    )  # fmt: skip
    for argv, message in cases:
        assert main([*base, *argv]) == 2, argv
        assert capsys.readouterr().err == f"ppojax rlhf: error: {message}\n"
    assert not out.exists()


def test_dtype_sets_the_models_compute_and_model_runs_take_rlhfconfigs_rate_and_kl():
    """--dtype bfloat16 loads the frozen reference in bfloat16 (the trained params stay
    float32 masters); a --model run's learning rate and KL coefficient are RLHFConfig's, the
    built-in model's the form's own."""
    dtypes = {}
    for dtype in ("float32", "bfloat16"):
        settings = episode_settings.settings_from_args(fresh_args("--dtype", dtype))
        assert settings["model"]["dtype"] == dtype
        state = episode_setup.prepare(settings).state
        dtypes[dtype] = {leaf.dtype for leaf in jax.tree.leaves(state.reference)}
        assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {np.dtype("float32")}
    assert dtypes == {"float32": {np.dtype("float32")}, "bfloat16": {np.dtype("bfloat16")}}
    config = episode_settings.settings_from_args(fresh_args())["rlhf"]
    default = RLHFConfig(pad_id=0, eos_id=1)
    assert (config["learning_rate"], config["kl_coef"]) == (default.learning_rate, default.kl_coef)
    built_in = episode_settings.build_parser().parse_args(CALCULATOR)
    config = episode_settings.settings_from_args(built_in)["rlhf"]
    assert (config["learning_rate"], config["kl_coef"]) == (3e-3, 0.0)
