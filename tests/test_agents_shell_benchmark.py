"""benchmarks/agents_shell.py at toy size: each env's ``ppojax rlhf`` command runs from the
shell, and the result file keeps its command, seconds and the held-out rows before SFT, after
SFT and after RL, read from the run folder. That RL learns is the benchmark's to show
(benchmarks/results/agents_shell.json)."""

import json

import pytest
from benchmark_script import run_benchmark


@pytest.mark.heavy
def test_the_toy_run_writes_each_runs_command_and_held_out_rows(tmp_path):
    out = tmp_path / "agents_shell.json"
    done = run_benchmark("agents_shell", "--toy", "--seeds", "1", "--out", str(out))
    result = json.loads(out.read_text())
    assert result["command"] == f"python benchmarks/agents_shell.py --toy --seeds 1 --out {out}"
    assert {"cpu", "cores", "jax"} <= set(result["machine"]) and result["versions"]
    assert [(run["env"], run["seed"]) for run in result["runs"]] == [
        ("guessing", 0),
        ("calculator", 0),
    ]
    for run in result["runs"]:
        assert run["command"].startswith(f"ppojax rlhf --env {run['env']} ")
        assert run["command"].endswith("--seed 0") and run["seconds"] > 0
        assert set(run["held_out"]) == {"start", "sft", "rl"} and run["episodes"] == 8
        assert all(0 <= row["success"] <= 1 for row in run["held_out"].values())
        assert run["success_rule"] == "return >= 1"
    assert set(result["rl_beats_sft_on_every_seed"]) == {"guessing", "calculator"}
    table = run_benchmark("agents_shell", "--table", "--out", str(out)).stdout
    assert table.splitlines()[0].startswith("| env | seed | success at step 0 |")
    assert table in done.stdout
