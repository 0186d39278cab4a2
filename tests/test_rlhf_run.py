"""``ppojax rlhf``: the run folder it writes, and a killed run resuming bit-exactly."""

import csv
import json
import shutil

import chex
import jax
import pytest

from ppojax import io
from ppojax.rlhf.__main__ import frozen_params, main, prepare

TINY_RUN = [
    "--small",
    "--task",
    "reversal",
    "--algorithm",
    "ppo",
    "--batch-size",
    "4",
    "--num-minibatches",
    "2",
    "--ppo-epochs",
    "1",
    "--steps",
    "4",
    "--checkpoint-every",
    "2",
    "--learning-rate",
    "0.01",
    "--no-progress",
]


def restore_state(run_dir, step):
    settings = io.read_json(run_dir / io.CONFIG_FILE)
    _, template, _ = prepare(settings, frozen_params(settings, run_dir, resume=True))
    return io.restore_checkpoint(run_dir, template, step)[0]


@pytest.mark.slow
def test_run_folder_and_bit_exact_resume(tmp_path, capsys):
    assert main([*TINY_RUN, "--out", str(tmp_path / "runs")]) == 0
    (full,) = (tmp_path / "runs").iterdir()
    assert "run folder:" in capsys.readouterr().out
    for name in ("config.json", "metrics.csv", "curves.png", "summary.json", "frozen"):
        assert (full / name).exists(), name
    assert sorted(int(p.name) for p in (full / "checkpoints").iterdir()) == [2, 4]
    with open(full / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["update"] for row in rows] == ["1", "2", "3", "4"]
    assert {"objective/kl", "policy/approxkl_avg", "val/ratio", "rewards/checker/mean"} <= set(
        rows[0]
    )
    summary = json.loads((full / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["response_tokens_per_s"] > 0

    # A run killed after its checkpoint at step 2: step 4's checkpoint and rows never came.
    killed = tmp_path / "killed"
    shutil.copytree(full, killed)
    shutil.rmtree(killed / "checkpoints" / "4")
    io.truncate_metrics(killed / "metrics.csv", 2)
    assert main(["--resume", str(killed), "--no-progress"]) == 0
    assert (killed / "metrics.csv").read_text() == (full / "metrics.csv").read_text()
    chex.assert_trees_all_equal(restore_state(killed, 4), restore_state(full, 4))
    assert not jax.tree.all(
        jax.tree.map(
            lambda a, b: bool((a == b).all()), restore_state(full, 2), restore_state(full, 4)
        )
    )


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="RLHFConfig.kl_estimator"):
        main(["--kl-estimator", "k9"])
    with pytest.raises(ValueError, match="not a run folder"):
        main(["--resume", "/nonexistent/run"])
