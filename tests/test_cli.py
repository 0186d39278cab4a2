import subprocess
import sys

import pytest

from ppojax.cli import build_parser, main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ppojax", *args], capture_output=True, text=True, timeout=300
    )


def test_train_prints_the_learning_curve_and_final_return():
    result = run_cli(
        "train",
        "CartPole-v1",
        "--seeds",
        "2",
        "--total-timesteps",
        "2048",
        "--num-envs",
        "4",
        "--num-steps",
        "32",
        "--hidden-sizes",
        "16,16",
    )
    assert result.returncode == 0, result.stderr
    assert "2 seed(s) x 16 updates x 128 steps" in result.stdout
    assert "final return, mean over seeds:" in result.stdout
    assert "env steps/s" in result.stdout


def test_bad_config_value_is_a_one_line_error_without_traceback():
    result = run_cli("train", "--num-minibatches", "3")
    assert result.returncode == 2
    assert "PPOConfig.num_minibatches" in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_env_is_a_clear_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "Cartpole-v1"])
    assert exit_info.value.code == 2
    assert "CartPole-v1" in capsys.readouterr().err


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


def test_envs_lists_ids(capsys):
    assert main(["envs"]) == 0
    assert "CartPole-v1  (tuned preset)" in capsys.readouterr().out
