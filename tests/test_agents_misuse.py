"""Misuse of the agents refused with one line: a model context shorter than the episode, a
temperature of 0 (greedy play is its own flag, argmax with finite log-probs), an end-of-turn
token unlike the env's; and bad output of a Python env caught at any turn: a reward not
finite, a token id past the model's vocabulary, an exception named with the env's file and
line; a JAX env's such ids and rewards flagged in the program and raised after it; the command
exits 2 for both, not 3. The names docs/rlhf.md's agents section uses import from their rooms
(``ppojax.rlhf.envs``, ``core``, ``post``)."""

import dataclasses
import inspect
import json
import re
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppojax.rlhf.agents as agents  # its names only: each is deprecated
from ppojax.checks import ConfigError
from ppojax.rlhf import RLHFConfig
from ppojax.rlhf.core.episode_trainer import make_episode_trainer
from ppojax.rlhf.core.episodes import (
    EnvOutputError,
    EnvTraceError,
    check_env_faults,
    env_faults,
    episode_stats,
    previous_real,
    rollout_episodes,
)
from ppojax.rlhf.core.host_rollout import HostRollout
from ppojax.rlhf.core.turns import EpisodeLayout, EpisodeSettings, model_context
from ppojax.rlhf.envs import calculator as c
from ppojax.rlhf.envs import guessing as g
from ppojax.rlhf.envs.env import Tokens, register_text_env
from ppojax.rlhf.envs.host import HostEnvError, PythonTextEnv
from ppojax.rlhf.models.transformer import transformer

ROOT = Path(__file__).resolve().parents[1]
CONFIG = dict(
    pad_id=g.PAD, eos_id=g.EOS, response_len=2, algorithm="grpo", group_size=2, num_minibatches=1
)


def test_a_model_context_shorter_than_the_episode_is_refused_naming_both_lengths():
    env = g.NumberGuessing(num_values=3, max_turns=2)
    length = EpisodeLayout(env.prompt_len, 2, env.reply_len, 2).length
    short = transformer(g.VOCAB_SIZE, length - 1, d_model=8, num_heads=1, num_layers=1)
    assert model_context(short) == length - 1
    pretrained = types.SimpleNamespace(config=types.SimpleNamespace(max_positions=9))
    assert model_context(pretrained) == 9 and model_context(short.policy_apply) is None
    with pytest.raises(ValueError) as error:
        make_episode_trainer(
            RLHFConfig(**CONFIG), short.policy_apply, env, 4, 2, kv_cache=short.kv_cache,
            context_len=model_context(short),
        )  # fmt: skip
    assert str(error.value) == (
        f"make_episode_trainer: an episode takes up to {length} tokens (EpisodeLayout("
        f"prompt_len=1, turn_len=2, reply_len=1, max_turns=2).length), more than the model's "
        f"context of {length - 1}: build the model with max_len >= {length}, or play fewer "
        "or shorter turns"
    )
    fits = transformer(g.VOCAB_SIZE, length, d_model=8, num_heads=1, num_layers=1)
    make_episode_trainer(RLHFConfig(**CONFIG), fits.policy_apply, env, 4, 2,
                         context_len=model_context(fits))  # fmt: skip


def test_temperature_0_is_refused_with_the_greedy_flag_named():
    with pytest.raises(ConfigError) as error:
        EpisodeSettings(2, 2, 0.0, g.PAD, g.EOS)
    assert str(error.value) == (
        "EpisodeSettings.temperature must be a finite number > 0, got 0.0. For greedy "
        "decoding pass greedy=True instead."
    )
    with pytest.raises(ValueError, match="EpisodeSettings.greedy must be a bool, got 1"):
        EpisodeSettings(2, 2, 1.0, g.PAD, g.EOS, greedy=1)


def column_logits(params, tokens, mask):
    """Logits that depend on the column only (a fixed random table), a clear argmax each."""
    del params, mask
    table = 3.0 * jax.random.normal(jax.random.key(7), (tokens.shape[1], g.VOCAB_SIZE))
    return jnp.broadcast_to(table, (*tokens.shape, g.VOCAB_SIZE))


def test_greedy_play_takes_the_argmax_and_reports_its_finite_log_probs():
    env = g.NumberGuessing(num_values=3, max_turns=2)
    settings = EpisodeSettings(2, 2, 0.5, g.PAD, g.EOS, greedy=True)
    episodes = rollout_episodes(column_logits, None, env, jax.random.key(0), 4, settings)
    model = np.asarray(episodes.model_mask)
    assert model.sum() > 0 and np.isfinite(np.asarray(episodes.log_probs)).all()
    logits = column_logits(None, episodes.tokens, episodes.mask)
    predicting = jnp.take_along_axis(logits, previous_real(episodes.mask)[:, :, None], axis=1)
    argmax = np.asarray(predicting.argmax(-1))
    np.testing.assert_array_equal(np.asarray(episodes.tokens)[model], argmax[model])
    # the chosen tokens' log-probs at the settings' temperature, as the trainer reads them
    stats = episode_stats(column_logits, None, episodes.tokens, episodes.mask, 0.5)
    np.testing.assert_allclose(
        np.asarray(episodes.log_probs)[model], np.asarray(stats.log_probs)[model], atol=1e-5
    )


def test_the_command_can_play_its_held_out_episodes_greedily():
    from ppojax.runs.lm import episode_run, episode_settings, episode_setup

    args = episode_settings.build_parser().parse_args(["--env", "guessing", "--eval-greedy"])
    settings = episode_settings.settings_from_args(args)
    assert settings["episodes"]["eval_greedy"] is True
    prepared = episode_setup.prepare(settings)
    evaluate = episode_run.evaluator(prepared, 4, greedy=True)
    params = prepared.state.params["policy"]
    held_out = evaluate(params, jax.random.key(0))
    assert held_out["greedy"] is True and held_out["episodes"] == 4
    assert held_out == evaluate(params, jax.random.key(0))


def test_an_end_of_turn_unlike_the_envs_is_refused_for_jax_and_python_envs():
    settings = EpisodeSettings(2, 2, 1.0, g.PAD, g.EOS + 1)
    with pytest.raises(ValueError) as error:
        rollout_episodes(column_logits, None, g.NumberGuessing(), jax.random.key(0), 2, settings)
    assert str(error.value) == (
        f"text env NumberGuessing ends the model's turns at token {g.EOS}, the env's eos_id, "
        f"not at eos_id {g.EOS + 1}: set eos_id (the EpisodeSettings', or RLHFConfig's for the "
        f"trainer) to {g.EOS}"
    )
    config = RLHFConfig(**{**CONFIG, "eos_id": g.EOS + 1})
    with pytest.raises(ValueError, match="text env NumberGuessing ends the model's turns at"):
        make_episode_trainer(config, column_logits, g.NumberGuessing(), 4, 2)
    with pytest.raises(ValueError) as error:  # a Python env without a chat template
        HostRollout(column_logits, c.Calculator(), 2, EpisodeSettings(2, 2, 1.0, c.PAD, 3))
    assert "at token 2, the env's eos_id, not at eos_id 3" in str(error.value)
    assert "chat template" not in str(error.value)


class Scripted(PythonTextEnv):
    """One BOS prompt; each turn replies ``replies[turn]``, reward ``rewards[turn]``; done
    after ``len(replies)`` turns."""

    prompt_len = 1
    reply_len = 1

    def __init__(self, replies, rewards, prompt=(g.BOS,)):
        self.replies, self.rewards, self.prompt = replies, rewards, list(prompt)

    def reset(self, key):
        return {"turn": 0}, self.prompt

    def step(self, state, response):
        turn = state["turn"]
        state["turn"] += 1
        done = state["turn"] == len(self.replies)
        return state, [] if done else self.replies[turn], self.rewards[turn], done


def eos_first(params, tokens, mask):
    """A policy sure of EOS at every column: each turn is EOS alone."""
    del params, mask
    return 40.0 * jax.nn.one_hot(jnp.full(tokens.shape, g.EOS), g.VOCAB_SIZE)


SETTINGS = EpisodeSettings(3, 2, 1.0, g.PAD, g.EOS)


@pytest.mark.parametrize("reward", [float("nan"), float("inf")])
def test_a_reward_not_finite_at_a_later_turn_names_the_env_turn_and_episode(reward):
    env = Scripted([[g.HIGHER], [g.HIGHER], []], [0.0, reward, 0.0])
    with pytest.raises(HostEnvError) as error:  # through the API: rollout_episodes
        rollout_episodes(eos_first, None, env, jax.random.key(0), 2, SETTINGS, env_name="bad")
    assert str(error.value) == (
        f"text env bad: step() at turn 1, episode 0 returned reward {reward!r}; it must be finite"
    )


def test_token_ids_past_the_vocabulary_are_caught_at_any_turn():
    later = Scripted([[g.HIGHER], [g.VOCAB_SIZE], []], [0.0, 0.0, 0.0])
    with pytest.raises(HostEnvError) as error:
        HostRollout(eos_first, later, 2, SETTINGS)(None, jax.random.key(0))
    assert str(error.value) == (
        f"text env Scripted: step() at turn 1, episode 0 returned its reply wrongly: token id "
        f"{g.VOCAB_SIZE} is not below the model's vocabulary size {g.VOCAB_SIZE} (its logits' "
        "width)"
    )
    prompt = Scripted([[g.HIGHER], []], [0.0, 0.0], prompt=[g.VOCAB_SIZE + 3])
    with pytest.raises(HostEnvError, match="text env Scripted: reset\\(\\) of group 0 returned "
                       "its prompt wrongly: token id 20 is not below the model's vocabulary "
                       "size 17"):  # fmt: skip
        HostRollout(eos_first, prompt, 2, SETTINGS)(None, jax.random.key(0))


class Raising(Scripted):
    def step(self, state, response):
        if state["turn"] == 1:
            json.loads("not json")  # the env's bug: the error raises in the json module
        return super().step(state, response)


def test_an_env_exception_names_the_env_file_and_line_that_raised():
    env = Raising([[g.HIGHER], [g.HIGHER], []], [0.0, 0.0, 0.0])
    line = Raising.step.__code__.co_firstlineno + 2
    with pytest.raises(HostEnvError) as error:
        HostRollout(eos_first, env, 2, SETTINGS)(None, jax.random.key(0))
    assert re.fullmatch(
        f"text env Raising: step\\(\\) at turn 1, episode 0 raised JSONDecodeError at "
        f"{re.escape(__file__)}:{line}: Expecting value: line 1 column 1 \\(char 0\\)",
        str(error.value),
    ), str(error.value)


@dataclasses.dataclass(frozen=True)
class BadLater:
    """A JAX env whose turn-1 reply is an id past the vocabulary (``fault="token"``) or whose
    turn-1 reward is NaN (``fault="reward"``)."""

    fault: str = "token"
    prompt_len = 1
    reply_len = 1
    vocab_size, pad_id, eos_id = g.VOCAB_SIZE, g.PAD, g.EOS

    def reset(self, key):
        return jnp.int32(0), Tokens(jnp.full((1,), g.BOS, jnp.int32), jnp.ones((1,), bool))

    def step(self, state, response):
        later = state == 1
        reply = jnp.where(later & (self.fault == "token"), g.VOCAB_SIZE + 2, g.HIGHER)
        reward = jnp.where(later & (self.fault == "reward"), jnp.nan, 0.0)
        reply = Tokens(jnp.full((1,), reply, jnp.int32), jnp.ones((1,), bool))
        return state + 1, reply, reward.astype(jnp.float32), jnp.bool_(False)


def test_a_jax_envs_bad_ids_and_rewards_are_flagged_in_the_program_and_raised_after():
    layout = EpisodeLayout(1, 2, 1, 3)
    faults = {}
    for fault in ("token", "reward", "none"):
        episodes = rollout_episodes(eos_first, None, BadLater(fault), jax.random.key(0), 2,
                                    SETTINGS)  # fmt: skip
        faults[fault] = env_faults(episodes, layout, g.VOCAB_SIZE)
    assert {name: int(value) for name, value in faults["token"].items()} == {
        "env/bad_token_episode": 0, "env/bad_token_turn": 1, "env/bad_token_id": 19,
        "env/bad_reward_episode": -1, "env/bad_reward_turn": -1,
    }  # fmt: skip
    with pytest.raises(EnvOutputError) as error:
        check_env_faults(faults["token"], "'bad'", g.VOCAB_SIZE, first_step=4)
    assert str(error.value) == (
        "text env 'bad': step() at turn 1, episode 0 of training step 5 returned its reply "
        "wrongly: token id 19 is outside the model's vocabulary [0, 17)"
    )
    with pytest.raises(EnvOutputError) as error:
        check_env_faults(faults["reward"], "'bad'", g.VOCAB_SIZE)
    assert str(error.value) == (
        "text env 'bad': step() at turn 1, episode 0 of training step 1 returned a reward that "
        "is NaN or inf; it must be finite"
    )
    assert set(np.asarray(list(faults["none"].values())).tolist()) == {-1}
    check_env_faults(faults["none"], "'bad'", g.VOCAB_SIZE)


@pytest.mark.heavy
def test_the_command_stops_a_jax_env_at_the_chunks_end_with_exit_2(tmp_path, capsys):
    """Not exit 3 (a diverged run): the chunk is not kept, the folder at the checkpoint
    before it."""
    from ppojax.cli.commands import main

    register_text_env("bad-later", lambda: BadLater("token"))
    out = tmp_path / "runs"
    argv = ["rlhf", "--env", "bad-later", "--turns", "2", "--steps", "1", "--batch-size", "2",
            "--group-size", "2", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    (run_dir,) = out.iterdir()
    assert capsys.readouterr().err == (
        "ppojax rlhf: error: text env 'bad-later': step() at turn 1, episode 0 of training step "
        "1 returned its reply wrongly: token id 19 is outside the model's vocabulary [0, 17); "
        f"the run stopped there, {run_dir} keeps its last checkpoint: fix the env, then "
        f"continue with --resume {run_dir}\n"
    )
    assert not (run_dir / "metrics.csv").exists()


# Names of the section that are not the package's API: a tool's name in the calculator's
# text, and a function the section places in its module.
NOT_EXPORTED = {"add", "episode_gae"}


# The modules that were ppojax/rlhf/agents/, in their rooms now.
AGENT_MODULES = (
    *(f"envs/{name}.py" for name in ("env", "chat", "host", "guessing", "calculator", "one_turn")),
    *(
        f"core/{name}.py"
        for name in (
            "context", "turns", "host_rollout", "episodes", "prompts", "credit", "update",
            "episode_trainer",
        )
    ),
    "post/demos.py",
)  # fmt: skip


def test_the_agents_section_of_the_docs_imports_from_the_rooms():
    """Its code imports run, each from a room (``ppojax.rlhf.envs``, ``core`` or ``post``),
    and every name of the agents' modules it mentions was a name of ``ppojax.rlhf.agents``,
    whose deprecated package keeps them a release."""
    text = (ROOT / "docs" / "rlhf.md").read_text()
    start = text.index("## Multi-turn episodes")
    section = text[start : text.index("\n## ", start + 1)]
    assert not re.findall(r"^from ppojax\.rlhf\.agents", section, re.MULTILINE)
    imports = re.findall(
        r"^from ppojax\.rlhf\.(?:envs|core|post)\b.* import .*$", section, re.MULTILINE
    )
    assert imports
    for line in imports:
        exec(line, {})
    from ppojax.rlhf.post.demos import play_demos, train_on_demos  # named, not imported there

    assert callable(play_demos) and callable(train_on_demos)
    defined = set()
    for path in AGENT_MODULES:
        source = (ROOT / "ppojax" / "rlhf" / path).read_text()
        defined |= set(re.findall(r"^(?:def|class) (\w+)", source, re.MULTILINE))
    named = set(re.findall(r"`([A-Za-z_]\w*)[`(]", section)) & defined
    assert {"play_demos", "train_on_demos", "model_context", "EpisodeLayout"} <= named
    assert sorted(n for n in named - NOT_EXPORTED if n not in agents.__all__) == []


class NanLater(PythonTextEnv):
    """A Python env for the command whose reward turns NaN at turn 1 (turn 0 passes the
    check before training)."""

    prompt_len = 1
    reply_len = 1
    vocab_size, pad_id, eos_id = g.VOCAB_SIZE, g.PAD, g.EOS

    def reset(self, key):
        return {"turn": 0}, [g.BOS]

    def step(self, state, response):
        state["turn"] += 1
        return state, [g.HIGHER], float("nan") if state["turn"] == 2 else 0.0, False


class NanFirst(NanLater):
    def step(self, state, response):
        return state, [g.HIGHER], float("inf"), False


def test_the_command_refuses_an_env_whose_first_reward_is_not_finite(tmp_path, capsys):
    from ppojax.cli.commands import main

    register_text_env("inf-first", NanFirst)
    out = tmp_path / "runs"
    assert main(["rlhf", "--env", "inf-first", "--no-progress", "--out", str(out)]) == 2
    assert capsys.readouterr().err == (
        "ppojax rlhf: error: text env 'inf-first': step() at turn 0, episode 0 returned reward "
        "inf; it must be finite (in the check before training)\n"
    )
    assert not out.exists()


@pytest.mark.heavy
def test_the_command_stops_with_exit_2_at_a_nan_reward_the_folder_kept(tmp_path, capsys):
    """Not exit 3 (a diverged run): the env's output is at fault, named on one line."""
    from ppojax.cli.commands import main

    register_text_env("nan-later", NanLater)
    out = tmp_path / "runs"
    argv = ["rlhf", "--env", "nan-later", "--turns", "2", "--steps", "1", "--batch-size", "2",
            "--group-size", "2", "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    (run_dir,) = out.iterdir()
    assert capsys.readouterr().err == (
        "ppojax rlhf: error: text env NanLater: step() at turn 1, episode 0 returned reward nan; "
        f"it must be finite; the run stopped there, {run_dir} keeps its last checkpoint: fix "
        f"the env, then continue with --resume {run_dir}\n"
    )
    assert (run_dir / "config.json").exists()


class Armed(NanLater):
    """NanLater's fault only while ``ARMED``: a bug that appears mid-run and is then fixed."""

    ARMED = [False]

    def step(self, state, response):
        state, reply, reward, done = super().step(state, response)
        return state, reply, reward if self.ARMED[0] else 0.0, done


@pytest.mark.heavy
def test_a_fault_after_a_checkpoint_keeps_it_and_resume_goes_on_once_the_env_is_fixed(
    tmp_path, capsys, monkeypatch
):
    """The env turns bad once the first chunk's checkpoint is saved (the loop may have run the
    next chunk by then: it runs one ahead of its files): exit 2 (not 3) before the last of 3
    steps, the rows and checkpoint before the fault kept; fixed, ``--resume`` trains on from
    them to the end."""
    from ppojax.cli.commands import main
    from ppojax.runs import checkpoints

    register_text_env("armed-later", Armed)
    save = checkpoints.save_checkpoint

    def save_then_arm(*args, **kwargs):
        save(*args, **kwargs)
        Armed.ARMED[0] = True

    monkeypatch.setattr(checkpoints, "save_checkpoint", save_then_arm)
    monkeypatch.setattr(Armed, "ARMED", [False])
    out = tmp_path / "runs"
    argv = ["rlhf", "--env", "armed-later", "--turns", "2", "--steps", "3", "--batch-size", "2",
            "--group-size", "2", "--checkpoint-every", "1", "--eval-episodes", "2",
            "--no-progress", "--out", str(out)]  # fmt: skip
    assert main(argv) == 2
    (run_dir,) = out.iterdir()
    err = capsys.readouterr().err
    assert "returned reward nan" in err and f"--resume {run_dir}" in err
    kept = (run_dir / "metrics.csv").read_text().splitlines()
    assert 2 <= len(kept) <= 3  # the header and step 1's row, maybe step 2's: not step 3's

    monkeypatch.setattr(checkpoints, "save_checkpoint", save)
    Armed.ARMED[0] = False  # the env fixed
    assert main(["rlhf", "--resume", str(run_dir), "--no-progress"]) == 0
    resumed = (run_dir / "metrics.csv").read_text().splitlines()
    assert len(resumed) == 4 and resumed[: len(kept)] == kept


def test_a_jax_env_that_does_not_trace_is_named_with_its_own_line():
    """Through the API: a Python ``if`` on a traced value and a step that changes its state's
    dtype each raise an ``EnvTraceError`` naming the env and the env's own file and line,
    not a frame of the rollout or a ``lax.scan`` carry error."""

    class PythonIf(g.NumberGuessing):
        def step(self, state, response):
            if response.mask.sum() > 1:  # the faulty line
                pass
            return super().step(state, response)

    class Widening(g.NumberGuessing):
        def step(self, state, response):
            state, reply, reward, done = super().step(state, response)
            return state._replace(secret=state.secret.astype(jnp.float32)), reply, reward, done

    lm = transformer(g.VOCAB_SIZE, 1 + 2 * (3 + 1), d_model=16, num_heads=2, num_layers=1)
    settings = EpisodeSettings(2, 3, 1.0, g.PAD, g.EOS)

    def play(env):
        params = lm.init(jax.random.key(0))
        return jax.eval_shape(
            lambda k: rollout_episodes(lm.kv_cache, params, env, k, 2, settings), jax.random.key(1)
        )

    line = inspect.getsourcelines(PythonIf.step)[1] + 1
    with pytest.raises(EnvTraceError, match=rf"text env PythonIf: step\(\) raised "
                       rf"TracerBoolConversionError at {re.escape(__file__)}:{line} "):  # fmt: skip
        play(PythonIf(num_values=4, max_turns=2))
    where = f"{__file__}:{inspect.getsourcelines(Widening.step)[1]}"
    with pytest.raises(EnvTraceError, match=re.escape(
        f"text env Widening: step() ({where}) returned state {{.secret: float32[], .turn: "
        "int32[]}, unlike the {.secret: int32[], .turn: int32[]} it was given"
    )):  # fmt: skip
        play(Widening(num_values=4, max_turns=2))
