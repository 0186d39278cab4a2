"""The key-lookup worked example (examples/keylookup.py, docs/rlhf.md "A worked example: key
lookup"): its solver wins every episode the env plays, and the command the guide gives runs
from the shell at a few steps, printing the table the guide shows."""

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.envs.registry import import_env_modules
from ppojax.rlhf.core.turns import EpisodeSettings
from ppojax.rlhf.envs import Tokens
from ppojax.rlhf.envs import env as env_module
from ppojax.rlhf.post.demos import env_script, play_demos

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "rlhf.md"
SECTION = "### A worked example: key lookup"


@pytest.fixture
def keylookup():
    import_env_modules([str(ROOT / "examples" / "keylookup.py")], "test")
    yield sys.modules["keylookup"]
    sys.modules.pop("keylookup", None)
    env_module._FACTORIES.pop("keylookup", None)


def test_the_solver_wins_every_episode_and_a_wrong_turn_gets_no_value(keylookup):
    k = keylookup
    env = env_module.make_text_env("keylookup", num_keys=3, max_value=4)
    assert env.vocab_size == k.FIRST_KEY + 3 + 7  # digits up to the largest sum, 6
    settings = EpisodeSettings(4, 3, 1.0, k.PAD, k.EOS)
    demos = play_demos(env, env_script(env), jax.random.key(0), 64, settings)
    assert np.asarray(demos.rewards).sum(axis=1).tolist() == [1.0] * 64
    assert np.asarray(demos.num_turns).tolist() == [3] * 64
    assert env.success([0.0, 0.0, 1.0], True) and not env.success([0.0, 0.0], False)
    state, prompt = env.reset(jax.random.key(1))
    asked = np.asarray(prompt.tokens)[1:] - k.FIRST_KEY
    turn = Tokens(jnp.array([k.GET, k.FIRST_KEY + asked[0], k.EOS]), jnp.ones(3, bool))
    _, reply, reward, done = env.step(state, turn)
    assert int(reply.tokens[0]) == env.first_digit + int(state.values[asked[0]])
    assert (float(reward), bool(done)) == (0.0, False)
    for wrong in ([k.GET, k.EOS, k.PAD], [k.ANS, k.FIRST_KEY, k.EOS], [k.GET, k.FIRST_KEY, k.PAD]):
        mask = jnp.array([True, True, wrong[2] != k.PAD])
        _, reply, reward, done = env.step(state, Tokens(jnp.array(wrong), mask))
        assert (int(reply.tokens[0]), float(reward), bool(done)) == (k.QUERY, 0.0, False)


def guide_command() -> list[str]:
    """The worked example's command, as docs/rlhf.md gives it, without ``ppojax rlhf``."""
    section = GUIDE.read_text().split(SECTION, 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    words = shlex.split(block.replace("\\\n", " "))
    assert words[:2] == ["ppojax", "rlhf"], block
    return words[2:]


@pytest.mark.heavy
def test_the_guides_command_runs_from_the_shell_at_a_few_steps(tmp_path):
    command = guide_command()
    assert command[:4] == ["--env-module", "examples/keylookup.py", "--env", "keylookup"]
    # the guide's flags, then smaller sizes: argparse keeps a flag's last value
    tiny = ["--sft-steps", "3", "--sft-demos", "8", "--steps", "2", "--batch-size", "2",
            "--group-size", "2", "--eval-episodes", "8", "--no-progress", "--out",
            str(tmp_path / "runs")]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "ppojax", "rlhf", *command, *tiny],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    printed = result.stdout.splitlines()
    assert printed[1] == (
        "held-out success (the env's success()), mean return and turns of 8 episodes (sampled):"
    )
    labels = [re.match(r"  (step 0|after SFT|step 2) +success ", line) for line in printed[2:]]
    assert all(labels) and len(labels) == 3
    (run_dir,) = (tmp_path / "runs").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["held_out_sft"]["success_rule"] == "the env's success()"
    # the guide shows the full run's table in the same format
    shown = GUIDE.read_text().split(SECTION, 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    assert shown.splitlines()[1] == printed[1].replace("of 8 episodes", "of 256 episodes")
