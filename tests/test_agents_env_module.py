"""``ppojax rlhf --env-module FILE --env ID``: a user's text env imported from a file, trained
after SFT on its demonstrations (``--sft-steps``) and resumed without redoing the SFT; the
held-out success as the env defines it; a bad module path and an env without demonstrations
refused before any run folder is made."""

import json
import sys
import textwrap

import numpy as np
import pytest

from ppojax.cli.commands import main
from ppojax.rlhf.envs import env as env_module

# A JAX env with partial credit: each turn scores 0.25, the right answer (token A) 1 and ends
# the episode, so every return is positive but only a right answer is a success.
ENV_FILE = """
import jax.numpy as jnp

from ppojax.rlhf.envs.env import Tokens, register_text_env

PAD, BOS, EOS, A, B = range(5)


class Partial:
    prompt_len = 1
    reply_len = 1
    vocab_size = 5
    pad_id = PAD
    eos_id = EOS
    success_return = 1.0

    def __init__(self, max_turns=2):
        self.max_turns = max_turns

    def reset(self, key):
        return jnp.int32(0), Tokens(jnp.array([BOS], jnp.int32), jnp.array([True]))

    def step(self, turn, response):
        right = response.mask[0] & (response.tokens[0] == A)
        turn = turn + 1
        reply = Tokens(jnp.array([BOS], jnp.int32), jnp.array([True]))
        return turn, reply, jnp.where(right, 1.0, 0.25), right | (turn >= self.max_turns)


class Demonstrated(Partial):
    def demonstrate(self, rng, prompt, history):
        return [A, EOS]


register_text_env("partial", Demonstrated)
register_text_env("undemonstrated", Partial)
"""
TINY = ["--batch-size", "2", "--group-size", "2", "--eval-episodes", "8", "--no-progress"]


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "partial_env.py"
    path.write_text(textwrap.dedent(ENV_FILE))
    yield path
    sys.modules.pop("partial_env", None)
    if str(tmp_path) in sys.path:  # where the import found it: another test's file is new
        sys.path.remove(str(tmp_path))
    for env_id in ("partial", "undemonstrated"):
        env_module._FACTORIES.pop(env_id, None)


def test_a_users_env_module_trains_after_sft_and_resumes_without_redoing_it(
    tmp_path, env_file, capsys
):
    out = tmp_path / "runs"
    sft = ["--sft-steps", "5", "--sft-demos", "8", "--sft-batch-size", "4"]
    argv = ["rlhf", "--env-module", str(env_file), "--env", "partial", *sft]
    assert main([*argv, "--sft-learning-rate", "0.01", "--steps", "2", "--checkpoint-every",
                 "1", *TINY, "--out", str(out)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "held-out success (return >= 1), mean return and turns of 8 episodes" in printed
    assert "after SFT" in printed and "step 2" in printed
    (run_dir,) = out.iterdir()
    config = json.loads((run_dir / "config.json").read_text())
    assert config["env"]["modules"] == [str(env_file.resolve())]
    assert config["sft"] == {"steps": 5, "demos": 8, "batch_size": 4, "learning_rate": 0.01}
    record = json.loads((run_dir / "sft.json").read_text())
    assert len(record["loss"]) == 5 and record["loss_last"] < record["loss_first"]
    summary = json.loads((run_dir / "summary.json").read_text())
    start, after_sft = summary["held_out_start"], summary["held_out_sft"]
    assert start["success_rule"] == "return >= 1"
    assert start["return"] > 0 and start["success"] < 1  # partial credit is no success
    assert after_sft == record["held_out"]
    written = (run_dir / "sft.json").stat().st_mtime_ns
    sys.modules.pop("partial_env")  # the resume imports the env module again, from config
    env_module._FACTORIES.pop("partial")
    assert main(["rlhf", "--resume", str(run_dir), "--steps", "3", "--no-progress"]) == 0
    assert (run_dir / "sft.json").stat().st_mtime_ns == written  # no second SFT
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["held_out_sft"] == after_sft


def test_ppojax_envs_lists_the_text_envs_an_env_module_registers(env_file, capsys):
    assert main(["envs", "--env-module", str(env_file)]) == 0
    out = capsys.readouterr().out
    listed = out.split("text envs (ppojax rlhf --env; register_text_env, --env-module):\n")[1]
    ids = [line.strip() for line in listed.split("suites (suite/name):")[0].splitlines()]
    # other tests of the same process may have registered envs of their own: the built-in
    # and the module's are listed among them, in order
    assert {"calculator", "guessing", "partial", "undemonstrated"} <= set(ids)
    assert ids == sorted(ids)


def test_a_bad_env_module_or_sft_without_demonstrations_is_exit_2_and_no_folder(
    tmp_path, env_file, capsys
):
    out = tmp_path / "runs"
    missing = tmp_path / "missing_env.py"
    assert main(["rlhf", "--env-module", str(missing), "--env", "x", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        f"ppojax rlhf: error: --env-module: env module {missing} does not exist; give the path "
        "of a .py file or a module name such as mypackage.envs\n"
    )
    argv = ["rlhf", "--env-module", str(env_file), "--env", "undemonstrated", "--sft-steps", "2"]
    assert main([*argv, *TINY, "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "ppojax rlhf: error: --sft-steps: text env 'undemonstrated' has no demonstrations; "
        "give it a method demonstrate(rng, prompt, history) -> response ids (docs/rlhf.md, SFT "
        "on demonstrations), or leave --sft-steps out\n"
    )
    assert main([*argv[:-2], "--sft-demos", "4", "--out", str(out)]) == 2
    assert "--sft-demos set(s) up SFT: give --sft-steps N too" in capsys.readouterr().err
    assert not out.exists()


def test_success_is_the_envs_rule_and_said_when_it_has_none():
    rewards = np.array([[0.25, 0.25], [0.25, 1.0], [0.0, 0.0]], np.float32)
    turns, ended = np.array([2, 2, 1]), np.array([False, True, True])

    class Threshold:
        success_return = 1.0

    class Hook:
        def success(self, rewards, terminated):
            return terminated and rewards[-1] == 1.0

    rule = env_module.success_rule(Threshold())
    assert rule.says == "return >= 1"
    assert rule.judge(rewards, turns, ended).tolist() == [False, True, False]
    rule = env_module.success_rule(Hook())
    assert rule.says == "the env's success()"
    assert rule.judge(rewards, turns, ended).tolist() == [False, True, False]
    rule = env_module.success_rule(object())
    assert rule.says == "return > 0: the env defines no success"
    assert rule.judge(rewards, turns, ended).tolist() == [True, True, False]
    Hook.success = lambda self, rewards, terminated: rewards[5]
    with pytest.raises(ValueError, match=r"Hook: success\(\[0.25, 0.25\], False\) of episode 0 "):
        env_module.success_rule(Hook()).judge(rewards, turns, ended)
    Threshold.success_return = "high"
    with pytest.raises(ValueError, match="success_return must be a number"):
        env_module.success_rule(Threshold())
