"""``ppojax rlhf --env``, the episode form: how the form is chosen, GRPO on the guessing game
and PPO on the calculator end to end into a run folder, a resume that computes what the
uninterrupted run did, an episode the env never ends, and each bad input's one line, exit
code 2 and no run folder."""

import csv
import dataclasses
import functools
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.cli.commands import main
from ppojax.rlhf.envs import guessing as g
from ppojax.rlhf.envs.env import Tokens, register_text_env
from ppojax.rlhf.envs.host import PythonTextEnv
from ppojax.runs import loop

TINY = ["--batch-size", "2", "--group-size", "2", "--eval-episodes", "8", "--no-progress"]
GUESSING = ["--env", "guessing", "--env-arg", "num_values=4", *TINY]


def rows(run_dir):
    with open(run_dir / "metrics.csv") as file:
        return list(csv.DictReader(file))


def only_run(out):
    (run_dir,) = out.iterdir()
    return run_dir


def test_the_episode_form_is_picked_by_its_flags_and_refuses_a_mix(tmp_path, capsys):
    from ppojax.cli import rlhf

    own = rlhf.own_flags(rlhf.form_parsers())
    assert {"--env", "--env-arg", "--turns", "--turn-len", "--token-budget"} <= own["episode"]
    assert not own["episode"] & (own["task"] | own["model"])
    assert rlhf.choose_form(["--env", "guessing", "--turns", "3"], own) == "episode"
    assert rlhf.choose_form(["--env=calculator"], own) == "episode"
    (tmp_path / "config.json").write_text(json.dumps({"env": {"id": "guessing"}}))
    assert rlhf.choose_form(["--resume", str(tmp_path)], own) == "episode"
    out = tmp_path / "runs"
    mixes = (
        (["--env", "guessing", "--task", "reversal", "--small"], "--task, --small are flags "
         "of the task form and --env of the episode form"),
        (["--env", "guessing", "--model", "m", "--prompts", "p.jsonl"], "--prompts is a flag "
         "of the model form and --env, --model of the episode form"),
        (["--task", "reversal", "--model", "m", "--turns", "3"], "--task is a flag of the task "
         "form and --model of the model form and --turns of the episode form"),
    )  # fmt: skip
    for argv, named in mixes:
        assert main(["rlhf", *argv, "--out", str(out)]) == 2
        assert capsys.readouterr().err == (
            f"ppojax rlhf: error: {named}; give the flags of one form (ppojax rlhf --help "
            "shows every form's)\n"
        )
    assert main(["rlhf", "--turns", "3", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "ppojax rlhf: error: --turns is a flag of the episode form, which trains on a text "
        "env: add --env ID\n"
    )
    assert not out.exists()


@pytest.mark.slow
def test_grpo_on_the_guessing_game_writes_the_run_folder_and_resumes_exactly(tmp_path, capsys):
    """A 2-step run (LoRA adapters on the attention's c_attn) writes the RLHF layout; a copy
    killed after step 1 (its checkpoint 2 gone) resumed to step 3 writes step 2's metrics
    row as the uninterrupted run did, then step 3; summary.json holds the held-out episodes."""
    out = tmp_path / "runs"
    argv = ["rlhf", *GUESSING, "--checkpoint-every", "1", "--ent-coef", "0.1", "--steps", "2",
            "--lora-rank", "2", "--lora-targets", "c_attn"]  # fmt: skip
    assert main([*argv, "--out", str(out)]) == 0
    whole = only_run(out)
    files = {path.name for path in whole.iterdir()}
    assert files == {"config.json", "metrics.csv", "curves.png", "checkpoints", "summary.json"}
    config = json.loads((whole / "config.json").read_text())
    assert config["env"] == {"id": "guessing", "args": {"num_values": 4}, "modules": []}
    assert config["sft"] is None
    assert config["rlhf"]["algorithm"] == "grpo" and config["rlhf"]["eos_id"] == g.EOS
    assert all(float(r["grad_norm"]) > 0 for r in rows(whole))  # the entropy bonus: it trained
    killed = tmp_path / "killed"
    shutil.copytree(whole, killed)
    shutil.rmtree(killed / "checkpoints" / "2")
    capsys.readouterr()
    assert main(["rlhf", "--resume", str(killed), "--steps", "3", "--no-progress"]) == 0
    assert "held-out success" in capsys.readouterr().out
    assert sorted(p.name for p in (killed / "checkpoints").iterdir()) == ["1", "2", "3"]
    resumed = rows(killed)
    assert [r["update"] for r in resumed] == ["1", "2", "3"]
    assert resumed[:2] == rows(whole)  # step 2 again, bit for bit
    assert json.loads((killed / "config.json").read_text())["run"]["steps"] == 3
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["resumed_from_step"] == 1 and summary["timed_steps"] == 2
    for part in ("held_out_start", "held_out"):
        held = summary[part]
        assert held["episodes"] == 8 and 0 <= held["success"] <= 1
        assert held["success_rule"] == "return >= 1"  # the game's success_return
        assert 1 <= held["turns"] <= 2 and held["truncated"] == 0  # the game ends itself


def noisy_step(frozen, state, key):
    noise = jax.random.uniform(key)
    return state + noise, {"noise": noise}


def test_the_host_loop_steps_as_the_compiled_loop_and_keeps_the_chunk_before_a_failure():
    """``host_chunk`` (a Python env's step, called step by step) draws the keys the compiled
    ``scan_chunk`` draws; a runner that raises still has the chunk before it delivered."""
    numbered = loop.keyed_step(noisy_step)
    inputs = (jax.random.key(0), None)
    compiled = jax.jit(functools.partial(loop.scan_chunk, numbered, length=3))
    state, metrics = compiled(inputs, jnp.float32(0), 2, 3)
    host_state, host_metrics = loop.host_chunk(numbered, inputs, jnp.float32(0), 2, 3)
    assert host_metrics["noise"].shape == (1, 3)
    np.testing.assert_array_equal(host_metrics["noise"], metrics["noise"])
    # three uniforms in [0, 1) summed in the same order: float32 rounding of a sum below 3
    np.testing.assert_allclose(host_state, state, rtol=0, atol=3e-7)
    delivered = []

    def runner(inputs, state, first, count):
        if first == 2:
            raise RuntimeError("the env failed")
        return loop.host_chunk(numbered, inputs, state, first, count)

    with pytest.raises(RuntimeError, match="the env failed"):
        loop.train_chunks(
            runner,
            inputs,
            jnp.float32(0),
            [(0, 2), (2, 2)],
            [lambda *chunk: delivered.append(chunk)],
        )
    ((first, _, kept),) = delivered
    expected = [jax.random.uniform(jax.random.fold_in(inputs[0], n)) for n in range(5)]
    assert first == 0
    np.testing.assert_array_equal(kept["noise"], [expected[:2]])  # step n on fold_in(key, n)
    np.testing.assert_array_equal(host_metrics["noise"], [expected[2:]])


@pytest.mark.heavy
def test_ppo_on_the_calculator_steps_the_python_env_on_the_host(tmp_path):
    """PPO with a critic on the Python env, one turn an episode (one compiled sampling call):
    an answer ends the episode, anything else is cut at the turn limit, and every metrics row
    counts both."""
    out = tmp_path / "runs"
    calculator = ["--env", "calculator", "--env-arg", "num_digits=1", "--turns", "1"]
    argv = ["rlhf", *calculator, "--turn-len", "4", "--algorithm", "ppo", "--steps", "2"]
    argv += ["--out", str(out), *TINY]
    assert main(argv) == 0
    run_dir = only_run(out)
    assert run_dir.name.startswith("rlhf-calculator-ppo-")
    metrics = rows(run_dir)
    assert len(metrics) == 2 and "loss/value_avg" in metrics[0]
    for row in metrics:
        total = float(row["episodes/terminated"]) + float(row["episodes/truncated"])
        assert total == pytest.approx(1.0)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["held_out"]["episodes"] == 8


@dataclasses.dataclass(frozen=True)
class Endless:
    """A JAX env that never says done: every reply is one HIGHER token, reward 0."""

    prompt_len: int = 1
    reply_len: int = 1
    vocab_size = g.VOCAB_SIZE
    pad_id = g.PAD
    eos_id = g.EOS

    def reset(self, key):
        return jnp.int32(0), Tokens(jnp.full((1,), g.BOS, jnp.int32), jnp.ones((1,), bool))

    def step(self, state, response):
        reply = Tokens(jnp.full((1,), g.HIGHER, jnp.int32), jnp.ones((1,), bool))
        return state + 1, reply, jnp.float32(0.0), jnp.bool_(False)


def test_an_endless_env_is_truncated_and_counted_and_a_diverged_run_exits_3(tmp_path, capsys):
    """Every episode of an env that never says done stops at --turns, counted in
    episodes/truncated; at a learning rate of 1e30 every update overflows and is skipped, so
    the run says it never recovered (exit 3), its rows and curves kept, no summary.json."""
    register_text_env("endless", Endless)
    out = tmp_path / "runs"
    argv = ["rlhf", "--env", "endless", "--algorithm", "rloo", "--turns", "3", "--steps", "1",
            "--ent-coef", "1", "--learning-rate", "1e30", "--out", str(out), *TINY]  # fmt: skip
    assert main(argv) == 3
    skipped, error = capsys.readouterr().err.splitlines()
    assert skipped.startswith("ppojax: step 1 skipped 1 of its 1 update(s) for a NaN or inf")
    assert error.startswith(
        "ppojax rlhf: error: the run diverged and never recovered: from step 1 on updates were "
        "skipped for a NaN or inf, and its last step, 1, skipped all 1; 1 of its 1 steps "
        "trained nothing. Its newest checkpoint holds the model it started from."
    )
    run_dir = only_run(out)
    (row,) = rows(run_dir)
    assert float(row["episodes/truncated"]) == 1.0 and float(row["episodes/turns"]) == 3.0
    assert float(row["nonfinite_steps"]) == 1.0 and float(row["gradient_steps"]) == 0.0
    assert (run_dir / "curves.png").exists() and not (run_dir / "summary.json").exists()


@dataclasses.dataclass(frozen=True)
class Broken(Endless):
    """``Endless`` with one thing wrong, named by ``fault``."""

    fault: str = "prompt dtype"

    def reset(self, key):
        state, prompt = super().reset(key)
        if self.fault == "prompt dtype":
            prompt = prompt._replace(tokens=prompt.tokens.astype(jnp.float32))
        return state, prompt

    def step(self, state, response):
        state, reply, reward, done = super().step(state, response)
        if self.fault == "reply width":
            reply = Tokens(jnp.zeros((3,), jnp.int32), jnp.ones((3,), bool))
        if self.fault == "reward shape":
            reward = jnp.zeros((2,))
        if self.fault == "state":
            state = state.astype(jnp.float32)
        if self.fault == "python if" and reward > 0:  # a Python if on a traced value
            reward = reward * 2
        return state, reply, reward, done


class NoVocabulary(PythonTextEnv):
    prompt_len = 1
    reply_len = 1


class WrongReply(PythonTextEnv):
    """A Python env whose reply is a string, not token ids."""

    prompt_len = 1
    reply_len = 1
    vocab_size, pad_id, eos_id = 5, 0, 2

    def reset(self, key):
        return None, [1]

    def step(self, state, response):
        return state, "ok", 0.0, True


def register_broken(fault=None):
    register_text_env("broken", lambda max_turns: Broken(fault=fault))
    register_text_env("no-vocabulary", lambda: NoVocabulary())
    register_text_env("wrong-reply", lambda: WrongReply())


BAD = [
    (["--env", "guesing"], "--env: unknown text env 'guesing'; known: ["),
    (["--env", "guessing", "--env-arg", "num_digits=2"],
     "--env-arg num_digits: text env 'guessing' takes num_values, max_turns, not num_digits"),
    (["--env", "guessing", "--env-arg", "num_values"],
     "--env-arg 'num_values': give NAME=VALUE, such as num_values=4"),
    (["--env", "guessing", "--env-arg", "max_turns=5"],
     "--env-arg max_turns=5 and --turns 2 disagree: give --turns alone (it sets the env's "
     "max_turns too)"),
    (["--env", "guessing", "--env-arg", "num_values=0"],
     "--env guessing --env-arg num_values=0: NumberGuessing.num_values must be an int >= 1, "
     "got 0"),
    (["--env", "broken:prompt dtype"],
     "text env 'broken': reset() returned observation tokens of shape (1,) and dtype float32; "
     "it must be [1] of int"),
    (["--env", "broken:reply width"],
     "text env 'broken': step() returned observation tokens of shape (3,) and dtype int32; it "
     "must be [1] of int"),
    (["--env", "broken:reward shape"],
     "text env 'broken': step() returned reward of shape (2,); it must be a scalar"),
    (["--env", "broken:state"],
     "returned state {.: float32[]}, unlike the {.: int32[]} it was given"),
    (["--env", "broken:python if"],
     f"text env 'broken': step() raised TracerBoolConversionError at {__file__}:"),
    (["--env", "no-vocabulary"],
     "text env 'no-vocabulary': NoVocabulary must say its vocabulary as int attributes "
     "vocab_size, pad_id and eos_id (the command builds a model for it); vocab_size, pad_id, "
     "eos_id are missing or not an int >= 0"),
    (["--env", "wrong-reply"],
     "text env 'wrong-reply': step() at turn 0, episode 0 returned its reply wrongly: token ids "
     "must be a list of ints >= 0, got 'ok' (in the check before training)"),
    (["--env", "guessing", "--turns", "0"], "--turns must be at least 1, got 0"),
    (["--env", "guessing", "--missing-eos-penalty", "1"],
     "--missing-eos-penalty: episodes do not read it"),
    (["--env", "guessing", "--reward-weights", "1"], "episode rewards come from the env"),
    (["--env", "guessing", "--num-minibatches", "3"],
     "num_episodes 4 must be a multiple of group_size x num_minibatches = 2 x 3."),
]  # fmt: skip


@pytest.mark.parametrize("argv, message", BAD, ids=[" ".join(a[1:]) for a, _ in BAD])
def test_bad_input_is_one_line_exit_2_and_no_run_folder(tmp_path, capsys, argv, message):
    env = argv[1]
    if env.startswith("broken:"):
        register_broken(env.split(":")[1])
        argv = ["--env", "broken", *argv[2:]]
    else:
        register_broken()
    out = tmp_path / "runs"
    assert main(["rlhf", *argv, *TINY, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("ppojax rlhf: error: ") and error.count("\n") == 1
    assert message in error
    assert not out.exists()


def test_a_resume_refuses_flags_that_would_change_the_folders_settings(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"env": {"id": "guessing"}}))
    assert main(["rlhf", "--resume", str(tmp_path), "--turns", "3"]) == 2
    assert capsys.readouterr().err == (
        f"ppojax rlhf: error: --resume continues {tmp_path} with its own settings (its "
        "config.json): --turns cannot change them; --steps can raise its step count\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


def test_the_guessing_and_calculator_envs_say_their_vocabulary():
    from ppojax.rlhf.envs import calculator as c

    for module, env in ((g, g.NumberGuessing()), (c, c.Calculator())):
        assert (env.vocab_size, env.pad_id, env.eos_id) == (
            module.VOCAB_SIZE, module.PAD, module.EOS
        )  # fmt: skip
    assert np.all([f.name != "vocab_size" for f in dataclasses.fields(g.NumberGuessing)])
