"""``ppojax sweep --eval-every ... --wandb`` offline: the run folder shows the evaluation, the
policy it evaluated is what ``ppojax eval`` evaluates, and the offline W&B runs hold every
metric of every update."""

import json
import os
import shutil
import struct
from pathlib import Path

import jax
import numpy as np
import pytest

from ppojax.cli.commands import main
from ppojax.ppo.evaluation import EVAL_METRIC_NAMES, eval_key
from ppojax.ppo.summary import final_return
from ppojax.runs import checkpoints, folder, plots
from ppojax.runs.experiment import read_experiment, state_template
from ppojax.runs.policy import evaluate, load

wandb_proto = pytest.importorskip("wandb.proto.wandb_internal_pb2")

SWEEP = (
    "sweep",
    "CartPole-v1",
    "--grid",
    "learning_rate=1e-3,3e-3",
    "--seeds",
    "2",
    "--num-envs",
    "2",
    "--num-steps",
    "8",
    "--total-timesteps",
    "64",
    "--update-epochs",
    "1",
    "--num-minibatches",
    "2",
    "--hidden-sizes",
    "8",
    "--normalize-observations",
    "true",
    "--eval-every",
    "2",
    "--eval-episodes",
    "3",
    "--no-progress",
)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """2 learning rates x 2 seeds, 4 updates each with evaluations after the 2nd and 4th,
    logged to offline W&B runs below WANDB_DIR."""
    out = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WANDB_MODE", "offline")
        patch.setenv("WANDB_DIR", str(out / "wandb-dir"))
        patch.setenv("WANDB_SILENT", "true")
        (out / "wandb-dir").mkdir()
        flags = ("--wandb", "--wandb-project", "tests", "--wandb-name", "evalsweep")
        assert main([*SWEEP, "--out", str(out), *flags]) == 0
    (run_dir,) = [path for path in out.iterdir() if path.name.startswith("CartPole")]
    return run_dir, out / "wandb-dir"


def test_metrics_csv_and_summary_hold_the_evaluations(swept):
    run_dir, _ = swept
    _, metrics = folder.read_metrics(run_dir / folder.METRICS_FILE)
    for name in EVAL_METRIC_NAMES:
        assert metrics[name].shape == (4, 4)
        assert np.isnan(metrics[name][:, [0, 2]]).all()
        assert np.isfinite(metrics[name][:, [1, 3]]).all()
    summary = folder.read_json(run_dir / folder.SUMMARY_FILE)
    finals = [value for row in summary["final_eval_return"] for value in row["per_seed"]]
    np.testing.assert_array_equal(finals, metrics["eval_return"][:, -1])
    assert [row["point"] for row in summary["final_eval_return"]] == [
        {"learning_rate": 1e-3},
        {"learning_rate": 3e-3},
    ]


def png_width(path: Path) -> int:
    return struct.unpack(">I", path.read_bytes()[16:20])[0]


def test_learning_curve_puts_the_evaluation_beside_the_training_curve(swept, tmp_path):
    run_dir, _ = swept
    returns = np.array([[np.nan, 10.0, 20.0, 30.0]])
    plots.plot_learning_curves({"x": returns}, np.arange(1, 5), tmp_path / "one.png", "t")
    assert png_width(run_dir / folder.CURVE_FILE) == 2 * png_width(tmp_path / "one.png")


def test_in_loop_evaluation_equals_ppojax_eval_of_the_loaded_policy(swept):
    """The last evaluation of two runs (other seeds and grid points), of their final
    checkpoint's policy with the key from their final state. Both programs take the same
    discrete actions, so the returns (sums of rewards of 1) are equal integers and their
    means over 3 episodes agree to float32 rounding (rtol 1e-6)."""
    run_dir, _ = swept
    _, metrics = folder.read_metrics(run_dir / folder.METRICS_FILE)
    experiment, _ = read_experiment(run_dir)
    states, _ = checkpoints.restore_checkpoint(run_dir, state_template(experiment))
    for run in (0, 3):
        config, act = load(run_dir, run=run)
        state = jax.tree.map(lambda leaf, run=run: leaf[run], states)
        returns = evaluate(config, act, 3, key=eval_key(state.key), deterministic=True)
        np.testing.assert_allclose(metrics["eval_return"][run, -1], returns.mean(), rtol=1e-6)


def wandb_records(path: Path):
    """The protobuf records of an offline ``run-*.wandb`` file: a 7-byte header, then LevelDB
    log blocks of 32 KiB whose records (4-byte CRC, 2-byte length, 1-byte type: full, first,
    middle, last) carry the serialized records."""
    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B"
    position, pending = 7, b""
    while position + 7 <= len(data):
        if block - position % block < 7:
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            record = wandb_proto.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def item_key(item) -> str:
    return item.key or "/".join(item.nested_key)


def offline_run(path: Path) -> dict:
    """An offline run's id, group, name, config, history {step: {key: value}} and summary."""
    run = {"history": {}, "summary": {}}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run["group"], run["name"] = record.run.run_group, record.run.display_name
            run["id"] = record.run.run_id
            run["config"] = {
                item.key: json.loads(item.value_json) for item in record.run.config.update
            }
        elif kind == "history":
            items = {item_key(item): json.loads(item.value_json) for item in record.history.item}
            run["history"][items["_step"]] = items
        elif kind == "summary":
            run["summary"].update(
                {item_key(item): json.loads(item.value_json) for item in record.summary.update}
            )
    return run


def test_offline_wandb_runs_hold_every_metric_of_every_update(swept):
    run_dir, wandb_dir = swept
    _, metrics = folder.read_metrics(run_dir / folder.METRICS_FILE)
    paths = sorted((wandb_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    runs = {run["config"]["run"]: run for run in map(offline_run, paths)}
    assert sorted(runs) == [0, 1, 2, 3]
    for index, run in runs.items():
        assert run["group"] == "evalsweep" and run["name"] == f"evalsweep-run{index}"
        assert run["config"]["seed"] == index % 2
        assert run["config"]["learning_rate"] == [1e-3, 3e-3][index // 2]
        assert run["config"]["grid_point"] == {"learning_rate": [1e-3, 3e-3][index // 2]}
        assert run["config"]["eval_every"] == 2
        assert sorted(run["history"]) == [1, 2, 3, 4]
        for name, values in metrics.items():
            logged = [run["history"][step].get(name, np.nan) for step in (1, 2, 3, 4)]
            # metrics.csv and W&B both get the float32 values as Python floats
            np.testing.assert_array_equal(logged, values[index], err_msg=name)
        assert "eval_return" not in run["history"][1]
        assert run["summary"]["final_eval_return"] == metrics["eval_return"][index, -1]
        expected = final_return(metrics["episode_return"][index])
        np.testing.assert_allclose(run["summary"]["final_return"], expected, rtol=1e-12)
        assert run["summary"]["diverged"] is False
    assert os.environ.get("WANDB_MODE") != "offline"  # the fixture restored the environment


def test_wandb_flags_without_wandb_are_a_clear_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--wandb-project", "x"])
    assert exit_info.value.code == 2
    assert "--wandb-project apply only with --wandb" in capsys.readouterr().err


TRAIN = (
    "train",
    "CartPole-v1",
    *("--seeds", "2", "--num-envs", "2", "--num-steps", "8", "--total-timesteps", "64"),
    *("--update-epochs", "1", "--num-minibatches", "2", "--hidden-sizes", "8"),
    *("--checkpoint-every", "2", "--no-progress"),
)


def test_a_resumed_run_logs_on_into_the_same_wandb_runs(tmp_path, monkeypatch):
    """run.json names the W&B runs; --resume (no --wandb needed) continues them by id and
    logs the updates after its checkpoint."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb-dir").mkdir()
    out = tmp_path / "runs"
    assert main([*TRAIN, "--out", str(out), "--wandb", "--wandb-project", "tests"]) == 0
    (run_dir,) = out.iterdir()
    saved = folder.read_json(run_dir / folder.RUN_FILE)["wandb"]
    assert saved["project"] == "tests" and len(saved["run_ids"]) == 2
    assert len(set(saved["run_ids"])) == 2
    assert all(len(run_id) == 16 for run_id in saved["run_ids"])  # 64 random bits each
    first = sorted((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert sorted(offline_run(path)["id"] for path in first) == sorted(saved["run_ids"])

    # as if killed before the last checkpoint: resume from update 2 of 4
    for path in (run_dir / folder.CHECKPOINT_DIR).iterdir():
        if path.name == "4":
            shutil.rmtree(path)
    assert main(["train", "--resume", str(run_dir), "--no-progress"]) == 0
    every = sorted((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*/run-*.wandb"))
    resumed = [offline_run(path) for path in every if path not in first]
    assert sorted(run["id"] for run in resumed) == sorted(saved["run_ids"])
    for run in resumed:
        assert sorted(run["history"]) == [3, 4]
        assert run["config"]["run"] == saved["run_ids"].index(run["id"])
    assert folder.read_json(run_dir / folder.RUN_FILE)["wandb"] == saved  # unchanged by the resume

    settings = folder.read_json(run_dir / folder.RUN_FILE)
    folder.write_json(
        run_dir / folder.RUN_FILE, {**settings, "wandb": {**saved, "run_ids": ["a b"]}}
    )
    with pytest.raises(ValueError, match=r"run.json: field 'wandb': run_ids must be .*\[.a b.\]"):
        read_experiment(run_dir)
    del settings["wandb"]  # run folders from before W&B resume have no such field
    folder.write_json(run_dir / folder.RUN_FILE, settings)
    assert read_experiment(run_dir)[1].wandb is None


PBT = (
    "pbt",
    "CartPole-v1",
    *("--population", "4", "--interval", "2", "--search", "learning_rate=1e-4:3e-3:log"),
    *("ent_coef=0:0.05", "--total-timesteps", "384", "--num-envs", "4", "--num-steps", "16"),
    *("--update-epochs", "1", "--num-minibatches", "2", "--hidden-sizes", "8"),
    *("--checkpoint-every", "2", "--keep-checkpoints", "0", "--no-progress"),
)


def pbt_table(run_dir: Path) -> dict[tuple[int, int], dict[str, float]]:
    """pbt.csv as {(member, interval): row}."""
    lines = (run_dir / "pbt.csv").read_text().splitlines()
    header = lines[0].split(",")
    rows = [dict(zip(header, map(float, line.split(",")), strict=True)) for line in lines[1:]]
    return {(int(row["member"]), int(row["interval"])): row for row in rows}


@pytest.mark.heavy
def test_pbt_logs_one_wandb_run_per_member_with_its_schedule(tmp_path, monkeypatch):
    """Each member's W&B run: its initial hyperparameters as config, every metric of every
    update, its hyperparameter of each update's interval, its score and source at each
    interval's end, and its rank; --resume logs on into the runs pbt.json names."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    (tmp_path / "wandb-dir").mkdir()
    out = tmp_path / "runs"
    assert main([*PBT, "--out", str(out), "--wandb", "--wandb-name", "pop"]) == 0
    (run_dir,) = out.iterdir()
    saved = folder.read_json(run_dir / "pbt.json")["wandb"]
    assert saved["name"] == "pop" and len(set(saved["run_ids"])) == 4
    first = sorted((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*/run-*.wandb"))
    runs = {run["config"]["run"]: run for run in map(offline_run, first)}
    assert sorted(runs) == [0, 1, 2, 3]
    _, metrics = folder.read_metrics(run_dir / folder.METRICS_FILE)
    table = pbt_table(run_dir)
    summary = folder.read_json(run_dir / folder.SUMMARY_FILE)
    for member, run in runs.items():
        assert run["id"] == saved["run_ids"][member] and run["group"] == "pop"
        assert run["config"]["learning_rate"] == pytest.approx(
            table[member, 0]["learning_rate"], rel=1e-6
        )
        assert sorted(run["history"]) == [1, 2, 3, 4, 5, 6]
        for step, row in run["history"].items():
            interval = (step - 1) // 2
            assert row["episode_return"] == metrics["episode_return"][member, step - 1]
            for name in ("learning_rate", "ent_coef"):
                expected = table[member, interval][name]
                assert row[f"pbt/{name}"] == pytest.approx(expected, rel=1e-6)
            if step % 2:
                assert "pbt/copied_from" not in row and "pbt/score" not in row
            else:
                assert row["pbt/copied_from"] == table[member, interval]["copied_from"]
        assert run["summary"]["pbt_best"] == (member == summary["best_member"])
    ranks = sorted(run["summary"]["pbt_rank"] for run in runs.values())
    assert ranks == [0, 1, 2, 3]

    # as if killed after the first interval: the resume logs intervals 2 and 3 into the runs
    for step in ("2", "3"):
        shutil.rmtree(run_dir / "checkpoints" / step)
    assert main(["pbt", "--resume", str(run_dir), "--no-progress"]) == 0
    every = sorted((tmp_path / "wandb-dir" / "wandb").glob("offline-run-*/run-*.wandb"))
    resumed = [offline_run(path) for path in every if path not in first]
    assert sorted(run["id"] for run in resumed) == sorted(saved["run_ids"])
    assert all(sorted(run["history"]) == [3, 4, 5, 6] for run in resumed)
