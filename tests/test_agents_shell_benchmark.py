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


# Stands in for each ``ppojax rlhf`` process: prints its command and fails, so that the
# script stops at its first run having shown the flags it passes.
PRINT_COMMAND = """
import subprocess
class Failed:
    returncode, stdout, stderr = 1, "", "stopped by the test"
def run(command, **kwargs):
    print(" ".join(command[3:]))  # after python -m ppojax
    return Failed
subprocess.run = run
"""


@pytest.mark.parametrize("toy", [False, True])
def test_algorithm_ppo_runs_ppo_with_a_critic_at_agents_sfts_ppo_sizes(toy):
    """--algorithm ppo's runs parse, flag by flag as ppojax rlhf reads them (a later flag
    wins), to PPO with a warmed-up critic and one episode per reset, as many a step as GRPO's
    8 x 8 (the toy: its own few)."""
    from ppojax.runs.lm import episode_settings

    extra = ["--toy"] if toy else []
    shown = run_benchmark("agents_shell", "--algorithm", "ppo", *extra, before=PRINT_COMMAND,
                          check=False)  # fmt: skip
    assert shown.returncode != 0 and "stopped by the test" in shown.stderr
    flags = shown.stdout.splitlines()[0].split()[1:]  # after "rlhf"
    args = episode_settings.build_parser().parse_args(flags)
    assert (args.env, args.algorithm, args.group_size) == ("guessing", "ppo", 1)
    assert args.critic_warmup_steps == (1 if toy else 10)
    assert args.batch_size == (2 if toy else 64)
    grpo = run_benchmark("agents_shell", *extra, before=PRINT_COMMAND, check=False)
    args = episode_settings.build_parser().parse_args(grpo.stdout.splitlines()[0].split()[1:])
    assert args.algorithm is None and args.group_size == (2 if toy else 8)  # the form's grpo
