import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from tolerance import (
    TRAINING_ULPS,
    assert_close,
    assert_states_close,
    assert_trees_close,
    assert_trees_equal,
)

import ppojax
from ppojax.cli.commands import build_config, build_parser, divergence_status, main
from ppojax.cli.report import (
    carried_forward,
    print_divergence,
    print_learning_curve,
    reset_pool_line,
)
from ppojax.cli.values import annotation_parser
from ppojax.ppo.summary import final_return
from ppojax.runs import checkpoints, folder
from ppojax.runs.experiment import Experiment, RunResult, read_experiment, run_table, state_template
from ppojax.runtime import cache

TINY = (
    "--total-timesteps",
    "48",
    "--num-envs",
    "2",
    "--num-steps",
    "4",
    "--update-epochs",
    "1",
    "--num-minibatches",
    "2",
    "--hidden-sizes",
    "8",
)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ppojax", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def run_folder(stdout: str):
    """The run folder a ``ppojax train``/``sweep`` printed."""
    line = next(line for line in stdout.splitlines() if line.startswith("run folder: "))
    return folder.Path(line.removeprefix("run folder: "))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny two-seed run with checkpoints every 2 of its 6 updates (all kept), TensorBoard on."""
    out = tmp_path_factory.mktemp("runs")
    result = run_cli(
        "train",
        "CartPole-v1",
        "--seeds",
        "2",
        *TINY,
        "--checkpoint-every",
        "2",
        "--keep-checkpoints",
        "0",
        "--tensorboard",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    return run_folder(result.stdout), result


def final_state(run_dir):
    experiment, _ = read_experiment(run_dir)
    return checkpoints.restore_checkpoint(run_dir, state_template(experiment))


def test_train_prints_the_learning_curve_and_final_return(trained):
    _, result = trained
    assert "2 run(s) = 2 seed(s) x 1 grid point(s), 6 updates x 8 steps" in result.stdout
    assert "env steps/s" in result.stdout and "mean return" in result.stdout
    assert "settings: the CartPole-v1 preset (ppojax.PRESETS)" in result.stdout
    assert "per seed:" in result.stdout and "over seeds" in result.stdout
    assert "Traceback" not in result.stderr


def test_the_report_shows_the_episode_length_beside_the_return(trained):
    """Where the reward is 1 at a goal whatever the time taken, only the length shows
    learning: the curve has a length column and the final lengths are listed per seed."""
    run_dir, result = trained
    assert "mean length" in result.stdout
    lines = result.stdout.splitlines()
    at = lines.index("final episode length (mean of the last 10 updates):")
    _, metrics = folder.read_metrics(run_dir / folder.METRICS_FILE)
    expected = final_return(metrics["episode_length"])
    assert lines[at + 1].split(":")[1].split()[:2] == [f"{value:.1f}" for value in expected]


def test_train_writes_every_file_of_the_run_folder(trained):
    run_dir, _ = trained
    config = folder.config_from_dict(folder.read_json(run_dir / "config.json"))
    assert config.num_envs == 2 and config.hidden_sizes == (8,)
    assert folder.read_json(run_dir / "run.json")["seeds"] == 2
    runs, metrics = folder.read_metrics(run_dir / "metrics.csv")
    assert len(runs) == 2 and metrics["episode_return"].shape == (2, 6)
    np.testing.assert_array_equal(metrics["env_steps"][0], np.arange(1, 7) * 8)
    assert (run_dir / "learning_curve.png").read_bytes()[:4] == b"\x89PNG"
    steps = sorted(int(path.name) for path in (run_dir / "checkpoints").iterdir())
    assert steps == [2, 4, 6]
    summary = folder.read_json(run_dir / "summary.json")
    assert len(summary["final_return"][0]["per_seed"]) == 2
    assert summary["compile_seconds"] > 0 and summary["env_steps_per_second"] > 0
    assert summary["versions"]["jax"] == jax.__version__
    assert summary["num_updates"] == 6 and summary["timed_updates"] == 6
    assert summary["resumed_from_update"] is None and summary["finished_utc"]
    for run in ("run-0", "run-1"):
        assert any((run_dir / "tensorboard" / run).glob("events.out.tfevents.*"))


def test_final_checkpoint_holds_the_finished_state(trained):
    state, step = final_state(trained[0])
    assert step == 6
    np.testing.assert_array_equal(state.update_step, [6, 6])
    np.testing.assert_array_equal(state.env_steps, [48, 48])


def test_resume_from_a_mid_run_checkpoint_reproduces_the_uninterrupted_run(trained, tmp_path):
    """Cut the run back to its checkpoint at update 2, as if it had died there, and resume it
    with other compiled programs: no progress callback, and chunks of 3 updates instead of 2."""
    run_dir, _ = trained
    resumed = tmp_path / "resumed"
    shutil.copytree(run_dir, resumed)
    for step in ("4", "6"):
        shutil.rmtree(resumed / "checkpoints" / step)
    result = run_cli("train", "--resume", str(resumed), "--no-progress", "--checkpoint-every", "3")
    assert result.returncode == 0, result.stderr
    assert_same_final_state(run_dir, resumed, same_program=False)
    assert folder.read_json(resumed / "summary.json")["resumed_from_update"] == 2


COUNTERS = ("env_steps", "episodes_finished", "gradient_steps", "nonfinite_steps")


def assert_same_final_state(run_dir, other_dir, same_program):
    """The final checkpoint and metrics.csv of ``other_dir`` equal those of ``run_dir``: bit
    for bit (the file's text too) when both ran the same compiled chunk program; else (another
    chunk length, a progress callback or none) to float32 rounding of terms of order 1, as
    XLA may fuse another loop body differently (see tests/tolerance.py), and the counters
    (updates, env steps, episodes, PRNG keys) exactly."""
    expected, _ = final_state(run_dir)
    got, step = final_state(other_dir)
    assert step == read_experiment(run_dir)[0].config.num_updates
    if same_program:
        assert_trees_equal(got, expected)
        assert (other_dir / "metrics.csv").read_text() == (run_dir / "metrics.csv").read_text()
        return
    assert_states_close(got, expected, ulps=TRAINING_ULPS)
    runs, metrics = folder.read_metrics(run_dir / "metrics.csv")
    other_runs, other_metrics = folder.read_metrics(other_dir / "metrics.csv")
    assert other_runs == runs and list(other_metrics) == list(metrics)
    for name, values in metrics.items():
        if name in COUNTERS:
            np.testing.assert_array_equal(other_metrics[name], values, err_msg=name)
        else:
            assert_close(other_metrics[name], values, ulps=TRAINING_ULPS, err_msg=name)


def test_resume_passes_over_a_corrupt_newest_checkpoint(trained, tmp_path, capsys):
    """Checkpoint 6 (the final one) loses half of its largest file, and summary.json is
    damaged: resume says so, names the file, moves it aside, restarts from checkpoint 4, ends
    where the run ended and writes a new summary."""
    run_dir, _ = trained
    damaged = tmp_path / "damaged"
    shutil.copytree(run_dir, damaged)
    newest = damaged / "checkpoints" / "6"
    files = [path for path in newest.rglob("*") if path.is_file() and "manifest" not in path.name]
    victim = max(files, key=lambda path: path.stat().st_size)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    (damaged / "summary.json").write_text("{")  # an output, never read back: rewritten
    assert main(["train", "--resume", str(damaged), "--no-progress"]) == 0
    err = capsys.readouterr().err
    name = victim.relative_to(newest)
    assert f"ppojax: warning: checkpoint {newest} is corrupt: {name} is " in err
    assert f"using the previous complete checkpoint, {damaged / 'checkpoints' / '4'}" in err
    assert "moved the unreadable checkpoint to" in err
    assert [path.name[:2] for path in (damaged / "checkpoints-unreadable").iterdir()] == ["6-"]
    assert_same_final_state(run_dir, damaged, same_program=False)  # no progress callback
    assert folder.read_json(damaged / "summary.json")["resumed_from_update"] == 4


KILLED_RUN = (
    "train",
    "CartPole-v1",
    *("--num-envs", "4", "--num-steps", "16", "--total-timesteps", str(4 * 16 * 40)),
    *("--update-epochs", "2", "--num-minibatches", "2", "--hidden-sizes", "16"),
    *("--checkpoint-every", "2", "--no-progress"),
)


def complete_checkpoints(out):
    """The checkpoints under the run folders in ``out`` whose save finished (manifest written)."""
    return [
        path for path in out.glob("*/checkpoints/*") if (path / checkpoints.MANIFEST_FILE).exists()
    ]


@pytest.mark.heavy
def test_a_run_killed_after_its_second_checkpoint_resumes_to_the_same_parameters(tmp_path):
    """SIGKILL (no chance to clean up, possibly in the middle of writing checkpoint 6) once
    the second checkpoint is complete, then --resume: the final state, parameters included,
    and metrics.csv equal an uninterrupted run's exactly."""
    out = tmp_path / "killed"
    # One compilation cache for the three commands: the resume and the whole run load the
    # killed run's programs rather than compile them again (test_cache.py: a loaded program
    # computes the fresh one's bits).
    env = {name: value for name, value in os.environ.items() if name != cache.OFF_VARIABLE}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    command = [sys.executable, "-m", "ppojax", *KILLED_RUN, "--out", str(out)]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    deadline = time.monotonic() + 300
    while len(complete_checkpoints(out)) < 2 and process.poll() is None:
        assert time.monotonic() < deadline, "no second checkpoint within 300 s"
        time.sleep(0.005)
    process.send_signal(signal.SIGKILL)
    _, stderr = process.communicate()
    assert process.returncode == -signal.SIGKILL, stderr  # killed, not finished
    (run_dir,) = out.iterdir()
    assert not (run_dir / "summary.json").exists()
    resumed = run_cli("train", "--resume", str(run_dir), "--no-progress", env=env)
    assert resumed.returncode == 0, resumed.stderr
    whole = run_cli(*KILLED_RUN, "--out", str(tmp_path / "whole"), env=env)
    assert whole.returncode == 0, whole.stderr
    assert "program(s) loaded from the compilation cache" in whole.stdout
    assert "(0 program(s) loaded" not in whole.stdout, whole.stdout
    # Both runs have the same options, so the same chunk program: bit for bit.
    assert_same_final_state(run_folder(whole.stdout), run_dir, same_program=True)
    assert folder.read_json(run_dir / "summary.json")["resumed_from_update"] >= 4


def test_eval_reports_mean_return_and_draws_a_gif(trained, tmp_path):
    run_dir, _ = trained
    gif = tmp_path / "episode.gif"
    result = run_cli("eval", str(run_dir), "--episodes", "3", "--run", "1", "--gif", str(gif))
    assert result.returncode == 0, result.stderr
    assert "CartPole-v1, run 1: mean return" in result.stdout and "over 3 episodes" in result.stdout
    assert gif.read_bytes()[:6] == b"GIF89a"
    assert len(folder.read_json(run_dir / "eval.json")["returns"]) == 3


def test_sweep_trains_every_grid_point_in_one_program(trained, tmp_path):
    result = run_cli(
        "sweep",
        "--grid",
        "learning_rate=2.5e-4,1e-3",
        "--seeds",
        "2",
        *TINY,
        "--no-progress",
        "--out",
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert "learning_rate=0.001:" in result.stdout and "learning_rate=0.00025:" in result.stdout
    run_dir = run_folder(result.stdout)
    runs, metrics = folder.read_metrics(run_dir / "metrics.csv")
    assert [float(run["grid_learning_rate"]) for run in runs] == [2.5e-4, 2.5e-4, 1e-3, 1e-3]
    assert len(folder.read_json(run_dir / "summary.json")["final_return"]) == 2
    # The preset's lr (1e-3) reproduces the plain two-seed run, computed by another program (the
    # swept learning rate is an array in it rather than a constant): parameters of order 1
    # after 12 Adam steps, to float32 rounding (see tests/tolerance.py).
    swept, _ = final_state(run_dir)
    plain, _ = final_state(trained[0])
    own = jax.tree.map(lambda leaf: leaf[2:], swept.params)
    assert_trees_close(own, plain.params, ulps=TRAINING_ULPS)


def test_a_run_that_never_recovers_exits_3_and_says_where_it_diverged(tmp_path, capsys):
    """A learning rate of 1e30 makes every step's update overflow float32 (its norm is inf):
    the guard skips all 12 steps, the report says so and the exit code is 3; the saved
    parameters are still finite (the initial ones)."""
    args = ["train", *TINY, "--learning-rate", "1e30", "--no-progress", "--out", str(tmp_path)]
    assert main(args) == 3
    captured = capsys.readouterr()
    assert captured.err.splitlines()[-1] == (
        "ppojax train: error: run 0 diverged and never recovered: non-finite updates from "
        "update 1 on, and its last update skipped 2 of 2 steps. Its parameters are its last "
        "finite ones; lower the learning rate or check the env's rewards and observations."
    )
    assert "divergence guard, run 0 (seed 0): 12 minibatch step(s) skipped" in captured.out
    assert "NOT recovered" in captured.out
    run_dir = run_folder(captured.out)
    summary = folder.read_json(run_dir / "summary.json")
    assert summary["diverged_runs"] == [0] and summary["divergence"][0]["first_update"] == 1
    state, _ = final_state(run_dir)
    for leaf in jax.tree.leaves((state.params, state.opt_state)):
        assert np.isfinite(np.asarray(leaf)).all()


def test_divergence_lines_name_the_seed_and_grid_point_of_each_run(capsys):
    config = ppojax.PPOConfig(
        num_envs=2, num_steps=4, total_timesteps=24, update_epochs=1, divergence_guard=True
    )
    experiment = Experiment(config, seeds=2, grid={"learning_rate": (2.5e-4, 1e30)})
    skipped = np.array([[0, 0, 0], [0, 1, 0], [0, 4, 4], [4, 4, 4]], np.float32)
    result = RunResult(
        experiment, None, run_table(experiment), None, {"nonfinite_steps": skipped}, 0, 0
    )
    print_divergence(result)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "divergence guard, run 1 (seed 1, learning_rate=0.00025): 1 minibatch step(s) skipped "
        "(NaN or inf), first at update 2; recovered",
        "divergence guard, run 2 (seed 0, learning_rate=1e+30): 8 minibatch step(s) skipped "
        "(NaN or inf), first at update 2; NOT recovered: its last update skipped steps",
        "divergence guard, run 3 (seed 1, learning_rate=1e+30): 12 minibatch step(s) skipped "
        "(NaN or inf), first at update 1; NOT recovered: its last update skipped steps",
    ]
    assert result.diverged_runs == [2, 3]
    assert divergence_status(result, "sweep") == 3
    assert "runs 2, 3 diverged and never recovered: non-finite updates from update 1 on" in (
        capsys.readouterr().err
    )
    # without the guard the steps were applied, and the lines say so
    unguarded = Experiment(config.replace(divergence_guard=False), seeds=2, grid=experiment.grid)
    result = RunResult(
        unguarded, None, run_table(unguarded), None, {"nonfinite_steps": skipped}, 0, 0
    )
    print_divergence(result)
    assert capsys.readouterr().out.splitlines()[-1] == (
        "not finite, run 3 (seed 1, learning_rate=1e+30): 12 minibatch step(s) with a NaN or "
        "inf loss or gradients, first at update 1, applied (divergence_guard is off)"
    )
    assert divergence_status(result, "sweep") == 3
    assert "applied (divergence_guard is off)" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "--bogus", "1"], "unrecognized arguments: --bogus"),
        (["train", "--learning-rate", "fast"], "expected a number, got 'fast'"),
        (["train", "--num-minibatches", "3"], "PPOConfig.num_minibatches"),
        (["train", "Cartpole-v1"], "CartPole-v1"),
        (["train", "--config", "/nonexistent.json"], "cannot read config file"),
        (["train", "--resume", "/nonexistent"], "not a ppojax run folder"),
        (["sweep", "--grid", "num_envs=2,4"], "cannot be swept"),
        (["sweep", "--grid", "learning_rate"], "expected FIELD=V1,V2"),
        (["eval", "/nonexistent"], "not a ppojax run folder"),
        (["evaluate"], "invalid choice"),
    ],
)
def test_bad_flags_are_one_line_errors(capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_bad_flag_in_a_subprocess_exits_non_zero_without_traceback():
    result = run_cli("train", "--num-minibatches", "3")
    assert result.returncode == 2
    assert "PPOConfig.num_minibatches" in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_resume_of_a_finished_run_says_so_and_changes_nothing(trained, tmp_path, capsys):
    """A finished run is not trained again: one line says so, the exit code is 0, and every
    file keeps its bytes (summary.json's timings included)."""
    run_dir, _ = trained
    copy = tmp_path / "finished"
    shutil.copytree(run_dir, copy)
    before = {path: path.read_bytes() for path in copy.rglob("*") if path.is_file()}
    assert main(["train", "--resume", str(copy), "--no-progress"]) == 0
    assert f"{copy} is finished (6 of 6 updates); nothing to do" in capsys.readouterr().out
    after = {path: path.read_bytes() for path in copy.rglob("*") if path.is_file()}
    assert after == before


def test_resume_refuses_config_flags(trained, capsys):
    with pytest.raises(SystemExit):
        main(["train", "--resume", str(trained[0]), "--learning-rate", "1e-3"])
    assert "drop --learning-rate" in capsys.readouterr().err


def test_config_file_then_flags_override_the_preset(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"env_id": "Pendulum-v1", "num_envs": 8}))
    args = build_parser().parse_args(
        ["train", "--config", str(tmp_path / "c.json"), "--gamma", "0.9"]
    )
    config = build_config(args)
    assert config.env_id == "Pendulum-v1" and config.num_envs == 8 and config.gamma == 0.9
    assert config.num_steps == 256  # from the Pendulum preset


def test_toml_config_file_with_a_flag_on_top(tmp_path):
    (tmp_path / "c.toml").write_text('env_id = "Pendulum-v1"\nnum_envs = 8\ntarget_kl = "off"\n')
    args = build_parser().parse_args(
        ["train", "Acrobot-v1", "--config", str(tmp_path / "c.toml"), "--num-envs", "2"]
    )
    config = build_config(args)
    assert config.env_id == "Acrobot-v1" and config.num_envs == 2 and config.target_kl is None


def test_flags_parse_into_config_types():
    args = build_parser().parse_args(
        [
            "train",
            "--total-timesteps",
            "5e5",
            "--anneal-lr",
            "false",
            "--vf-clip-eps",
            "none",
            "--hidden-sizes",
            "32,32",
            "--learning-rate",
            "1e-3",
        ]
    )
    assert args.total_timesteps == 500_000 and args.anneal_lr is False
    assert args.vf_clip_eps is None and args.hidden_sizes == (32, 32)
    assert args.learning_rate == 1e-3


def test_field_types_map_to_parsers():
    assert annotation_parser(float | None)("off") is None
    assert annotation_parser(float | None)("0.5") == 0.5
    assert annotation_parser(int)("1e3") == 1000
    assert annotation_parser(tuple[int, ...])("4,2") == (4, 2)
    assert annotation_parser(bool)("yes") is True


def test_every_subcommand_has_help(capsys):
    for command in ("train", "sweep", "eval", "envs"):
        with pytest.raises(SystemExit) as exit_info:
            main([command, "--help"])
        assert exit_info.value.code == 0
        assert f"usage: ppojax {command}" in capsys.readouterr().out


def test_envs_lists_ids(capsys):
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    assert "CartPole-v1  (preset)" in out and "Breakout-MinAtar  (preset)" in out
    assert "jumanji/" in out and "xminigrid/" in out and "brax/" in out
    assert "presets: xminigrid/MiniGrid-Empty-5x5" in out


def test_rlhf_subcommand_forwards_to_the_rlhf_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["rlhf", "--help"])
    assert exit_info.value.code == 0
    assert "--kl-coef" in capsys.readouterr().out
    assert main(["rlhf", "--kl-coef", "-1"]) == 2
    assert "RLHFConfig.kl_coef" in capsys.readouterr().err


def test_rlhf_help_names_every_form_and_each_forms_help_its_own(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["rlhf", "--help"])
    assert exit_info.value.code == 0
    shown = capsys.readouterr().out
    sections = {part.split(":\n")[0]: part for part in shown.split("\n\n")}
    assert "--task {sorting,reversal}" in sections["task form only"]
    assert "--small" in sections["task form only"]
    both = sections["model and episode forms (the episode form's with --env)"]
    assert "--model FOLDER" in both and "--dtype" in both
    assert "--reward MODULE:FUNCTION" in sections["model form only"]
    assert "--env ID" in sections["episode form only"]
    assert "guessing" in sections["episode form only"] and "--turns" in shown
    assert "--steps" in sections["every form"]
    fields = sections["every form: RLHFConfig fields (unset: the field's default, or the form's)"]
    assert "--update-epochs" in fields and "--kl-target" in fields
    assert "--ppo-epochs" not in shown and "--target-kl" not in shown  # old names: hidden
    for form, own, other in (
        ("--task", "--sft-steps", "--samples"),
        ("--model", "--prompts", "--small"),
        ("--env", "--turn-len", "--prompts"),
    ):
        with pytest.raises(SystemExit):
            value = {"--task": "reversal", "--env": "guessing"}.get(form, "m")
            main(["rlhf", form, value, "--help"])
        shown = capsys.readouterr().out
        assert own in shown and other not in shown and "task form only" not in shown


def test_rlhf_picks_its_form_by_the_flags_and_refuses_a_mix(tmp_path, capsys):
    from ppojax.cli import rlhf

    own = rlhf.own_flags(rlhf.form_parsers())
    assert own["task"] == {"--task", "--rm-steps", "--small"}
    assert "--sft-steps" not in own["episode"]  # the task and episode forms share it
    assert {"--prompts", "--reward", "--response-len"} <= own["model"]
    assert "--model" in rlhf.BOTH  # the model and episode forms share it
    assert rlhf.choose_form(["--steps", "4", "--kl-coef", "0.1"], own) == "task"  # the default
    assert rlhf.choose_form(["--task=reversal"], own) == "task"
    assert rlhf.choose_form(["--model", "m", "--prompts", "p.jsonl"], own) == "model"
    (tmp_path / "config.json").write_text(json.dumps({"command": "rlhf"}))
    assert rlhf.choose_form(["--resume", str(tmp_path)], own) == "model"
    assert main(["rlhf", "--task", "reversal", "--small", "--model", "m", "--steps", "2"]) == 2
    error = capsys.readouterr().err
    assert error == (
        "ppojax rlhf: error: --task, --small are flags of the task form and --model of the "
        "model form; give the flags of one form (ppojax rlhf --help shows every form's)\n"
    )
    assert main(["rlhf", "--prompts", "p.jsonl", "--reward", "m:f"]) == 2
    assert "--prompts, --reward are flags of the model form" in capsys.readouterr().err


def test_rlhf_old_flag_names(capsys):
    """--ppo-epochs still sets update_epochs, after one warning line, in both forms;
    --target-kl (the adaptive target, now --kl-target) is an error naming --kl-target."""
    from ppojax.cli import rlhf

    parsers = rlhf.form_parsers()
    for parser in parsers.values():
        assert parser.parse_args(["--ppo-epochs", "2"]).update_epochs == 2
        assert capsys.readouterr().err == (
            "ppojax rlhf: warning: --ppo-epochs is deprecated; use --update-epochs\n"
        )
    for form in ([], ["--model", "m"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["rlhf", *form, "--target-kl", "1.0"])
        assert exit_info.value.code == 2
        assert "error: --target-kl is now --kl-target" in capsys.readouterr().err


def test_the_reset_pool_line_counts_repeated_starts_over_runs_and_updates():
    metrics = {
        "repeated_starts": np.array([[0, 3], [1, 0]], np.int32),
        "episodes_finished": np.array([[10, 20], [30, 20]], np.int32),
    }
    assert reset_pool_line(None, metrics) is None
    assert reset_pool_line(2, metrics) == (
        "reset pool of 2 start(s) per env per rollout: 4 of 80 finished episodes (5.0%) began "
        "from a start already used; a larger --reset-pool draws more fresh starts"
    )
    none_repeated = {**metrics, "repeated_starts": np.zeros((2, 2), np.int32)}
    assert reset_pool_line(8, none_repeated).endswith(
        "0 of 80 finished episodes (0.0%) began from a start already used"
    )


@pytest.fixture
def cpu_plan(monkeypatch):
    """What ``use_cpu_settings`` asks for, as ("devices" | "threads", count) pairs, on a
    2-core CPU-only machine whose JAX backend is taken as not started."""
    from ppojax.runtime import compiling

    asked = []
    monkeypatch.setattr(compiling, "backends_started", lambda: False)
    monkeypatch.setattr(compiling, "limit_cpu_threads", lambda n: asked.append(("threads", n)))
    monkeypatch.setattr(compiling, "use_cpu_devices", lambda n: asked.append(("devices", n)))
    monkeypatch.setattr(compiling, "cpu_cores", lambda: 2)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    return asked


def plan_for(asked: list, *argv: str, grid: dict | None = None) -> list:
    from ppojax.cli.commands import use_cpu_settings

    before = len(asked)
    use_cpu_settings(build_parser().parse_args(list(argv)), grid or {})
    return asked[before:]


def test_cpu_settings_auto_split_runs_over_devices_and_give_small_configs_one_thread(
    cpu_plan, tmp_path
):
    one_thread, two_devices = [("threads", 1)], [("devices", 2)]
    assert plan_for(cpu_plan, "train") == one_thread  # classic CartPole, 1 seed
    assert plan_for(cpu_plan, "train", "--seeds", "3") == one_thread  # 3 runs: no even split
    assert plan_for(cpu_plan, "train", "Pendulum-v1") == one_thread  # its preset: 16 envs
    assert plan_for(cpu_plan, "train", "--seeds", "8") == two_devices  # and every core's pool
    assert plan_for(cpu_plan, "train", "--seeds", "16", "--num-envs", "64") == two_devices
    grid = {"learning_rate": (1, 2, 3)}
    argv = ("sweep", "--grid", "learning_rate=1,2,3", "--seeds", "4")
    assert plan_for(cpu_plan, *argv, grid=grid) == two_devices  # 12 runs
    for big in (("--num-envs", "64"), ("Breakout-MinAtar",), ("--encoder", "cnn")):
        assert plan_for(cpu_plan, "train", *big) == []  # 1 run: every core's pool
    (tmp_path / "c.json").write_text(json.dumps({"num_envs": 64}))
    assert plan_for(cpu_plan, "train", "--config", str(tmp_path / "c.json")) == []
    assert plan_for(cpu_plan, "train", "--config", str(tmp_path / "missing.json")) == []
    (tmp_path / "bad.json").write_text(json.dumps({"hidden_sizes": "64", "num_envs": "x"}))
    assert plan_for(cpu_plan, "train", "--config", str(tmp_path / "bad.json")) == []
    assert plan_for(cpu_plan, "train", "--num-minibatches", "0") == []  # reported afterwards
    assert plan_for(cpu_plan, "train", "--cpu-threads", "all") == []
    assert plan_for(cpu_plan, "train", "--num-envs", "64", "--cpu-threads", "3") == [("threads", 3)]
    assert plan_for(cpu_plan, "train", "--seeds", "8", "--cpu-threads", "1") == [
        ("devices", 2),
        ("threads", 1),
    ]
    classic = ("--num-envs", "4")  # PureJaxRL's CartPole rollout: 8 runs x 4 envs x 64 is small
    assert plan_for(cpu_plan, "train", "--seeds", "8", "--cpu-devices", "1", *classic) == [
        ("devices", 1),
        ("threads", 1),
    ]
    assert plan_for(cpu_plan, "train", "--seeds", "3", "--cpu-devices", "3") == [("devices", 3)]
    with pytest.raises(ValueError, match="--cpu-devices 3: the 4 runs cannot be split evenly"):
        plan_for(cpu_plan, "train", "--seeds", "4", "--cpu-devices", "3")


def test_cpu_settings_split_a_pbt_population_over_devices_like_a_sweep(cpu_plan, tmp_path):
    search = ("--interval", "1", "--search", "learning_rate=1e-4:1e-3:log")
    assert plan_for(cpu_plan, "pbt", "--population", "8", *search) == [("devices", 2)]
    assert plan_for(cpu_plan, "pbt", "--population", "3", *search) == [("threads", 1)]
    one_device = ("--cpu-devices", "1", "--num-envs", "4")
    assert plan_for(cpu_plan, "pbt", "--population", "8", *one_device, *search) == [
        ("devices", 1),
        ("threads", 1),
    ]
    with pytest.raises(ValueError, match="--cpu-devices 3: the 8 runs cannot be split evenly"):
        plan_for(cpu_plan, "pbt", "--population", "8", "--cpu-devices", "3", *search)
    # --resume reads the population from the run folder's pbt.json
    (tmp_path / "config.json").write_text(json.dumps({"env_id": "CartPole-v1"}))
    (tmp_path / "pbt.json").write_text(json.dumps({"population": 6}))
    assert plan_for(cpu_plan, "pbt", "--resume", str(tmp_path)) == [("devices", 2)]
    (tmp_path / "pbt.json").write_text(json.dumps({"members": 6}))
    assert plan_for(cpu_plan, "pbt", "--resume", str(tmp_path)) == []  # resume reports it


def test_cpu_settings_leave_accelerators_and_a_set_device_count_alone(cpu_plan, monkeypatch):
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "4")
    assert plan_for(cpu_plan, "train", "--seeds", "8", "--num-envs", "4") == [("threads", 1)]
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    assert plan_for(cpu_plan, "train", "--seeds", "8", "--num-envs", "4") == [("threads", 1)]
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert plan_for(cpu_plan, "train", "--seeds", "8") == []


def test_cpu_settings_auto_on_resume_read_the_run_folder(cpu_plan, trained):
    run_dir = trained[0]  # 2 seeds of a tiny config
    assert plan_for(cpu_plan, "train", "--resume", str(run_dir)) == [("devices", 2)]


def test_cpu_flags_errors_name_the_flag(capsys):
    from ppojax.cli.commands import use_cpu_settings

    for flag in ("--cpu-threads", "--cpu-devices"):
        for bad in ("0", "-2", "many", "1.5") + (("all",) if flag == "--cpu-devices" else ()):
            with pytest.raises(SystemExit):
                build_parser().parse_args(["train", flag, bad])
            assert flag in capsys.readouterr().err

    def settings(*argv: str) -> None:
        use_cpu_settings(build_parser().parse_args(["train", *argv]), {})

    jax.devices()  # JAX has started here: an explicit count cannot take effect any more
    with pytest.raises(ValueError, match="--cpu-threads 1: .*before JAX's first computation"):
        settings("--cpu-threads", "1")
    with pytest.raises(ValueError, match="--cpu-devices 2: .*before JAX's first computation"):
        settings("--cpu-devices", "2", "--seeds", "2")
    settings("--seeds", "2")  # auto passes over a started JAX


def test_learning_curve_shows_long_episodes_between_their_ends(capsys):
    # episodes of 25 rollouts: one update in 25 has a finished episode, returns 1, 2, 3, 4
    returns = np.full((2, 100), np.nan)
    returns[:, 24::25] = np.arange(1.0, 5.0)
    np.testing.assert_array_equal(
        carried_forward(np.array([np.nan, 1.0, np.nan, np.nan, 3.0, np.nan])),
        [np.nan, 1.0, 1.0, 1.0, 3.0, 3.0],
    )
    print_learning_curve(returns, 128, np.where(np.isfinite(returns), 2500.0, np.nan))
    lines = capsys.readouterr().out.splitlines()[1:]
    # points at updates 0, 11, 22, 33, ..., 99: before the first end (update 24) nothing,
    # then the latest episodes' return, in windows without an end as in those with one
    assert [line.split()[1] for line in lines] == ["nan"] * 3 + ["1.0", "1.0", "2.0", "2.0"] + [
        "3.0",
        "3.0",
        "4.0",
    ]
    assert [line.split()[2] for line in lines[3:]] == ["2500.0"] * 7
