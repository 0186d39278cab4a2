"""Python text envs and tools on the host: the guessing game written in Python plays the same
episodes as the JAX env in one program (same key, same model), the calculator's rules by hand,
a tool or env that fails or returns the wrong type names itself, the turn and the episode, and
the episode trainer steps on a Python env."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.rlhf import RLHFConfig
from ppojax.rlhf.core.episode_trainer import make_episode_trainer
from ppojax.rlhf.core.episodes import EpisodeLayout, EpisodeSettings, rollout_episodes
from ppojax.rlhf.core.host_rollout import HostRollout
from ppojax.rlhf.envs import calculator as c
from ppojax.rlhf.envs import guessing as g
from ppojax.rlhf.envs.env import make_text_env
from ppojax.rlhf.envs.host import HostEnvError, PythonTextEnv
from ppojax.rlhf.models.transformer import transformer


class PyGuessing(PythonTextEnv):
    """``guessing.NumberGuessing`` in plain Python, its state a mutable dict (a group's
    episodes must each get their own copy)."""

    prompt_len = 1
    reply_len = 1

    def __init__(self, num_values, max_turns):
        self.num_values, self.max_turns = num_values, max_turns

    def reset(self, key):
        secret = int(jax.random.randint(key, (), 0, self.num_values, jnp.int32))
        return {"secret": secret, "turn": 0}, [g.BOS]

    def step(self, state, response):
        digits = []
        for token in response:
            if token == g.EOS:
                break
            digits.append(token - g.FIRST_DIGIT)
        width = len(str(self.num_values - 1))
        valid = 1 <= len(digits) <= width and all(0 <= d < 10 for d in digits)
        guess = int("".join(map(str, digits))) if valid else -1
        if not (valid and guess < self.num_values):
            answer = g.INVALID
        elif guess == state["secret"]:
            answer = g.CORRECT
        else:
            answer = g.HIGHER if state["secret"] > guess else g.LOWER
        state["turn"] += 1
        correct = answer == g.CORRECT
        return state, [answer], float(correct), correct or state["turn"] >= self.max_turns


def leaning(outputs, lean):
    logits, cache = outputs
    return logits + lean, cache


def test_python_env_plays_the_jax_envs_episodes():
    """Same key, same model, through the KV cache: the host path (a compiled call per turn,
    the cache carried between calls, compiled once) gives the one-program rollout's
    episodes."""
    settings = EpisodeSettings(4, 2, 1.0, g.PAD, g.EOS, token_budget=5)
    length = EpisodeLayout(1, 2, 1, 4).length
    lm = transformer(g.VOCAB_SIZE, length, d_model=16, num_heads=2, num_layers=1)
    params = lm.init(jax.random.key(0))
    # a lean towards valid guesses, so that episodes win early, run out of turns (the env's
    # 3) or are cut by the budget
    digits = jnp.arange(g.FIRST_DIGIT, g.FIRST_DIGIT + 3)
    lean = 4.0 * jax.nn.one_hot(digits, g.VOCAB_SIZE).sum(0) + 3.0 * jax.nn.one_hot(g.EOS, 17)
    hook = lm.kv_cache._replace(
        prefill=lambda *args: leaning(lm.kv_cache.prefill(*args), lean),
        extend=lambda *args: leaning(lm.kv_cache.extend(*args), lean),
    )
    key = jax.random.key(3)  # a key whose episodes win early, run out of turns and are cut
    jax_env, py_env = g.NumberGuessing(num_values=3, max_turns=3), PyGuessing(3, 3)
    one_program = jax.jit(
        lambda params, key: rollout_episodes(hook, params, jax_env, key, 16, settings, 2)
    )(params, key)
    rollout = HostRollout(hook, py_env, 16, settings, group_size=2)
    calls = []
    next_turn = rollout.next_turn
    rollout.next_turn = lambda *args: calls.append(int(args[3])) or next_turn(*args)
    host = rollout(params, key)
    # one compiled call per turn; the 4th turn is skipped: the env ends every episode by its 3rd
    assert calls == [1, 2]
    for name in ("tokens", "mask", "model_mask", "rewards", "num_turns", "terminated"):
        np.testing.assert_array_equal(getattr(host, name), getattr(one_program, name), name)
    # float32 log-softmaxes of O(1) logits from programs compiled apart
    np.testing.assert_allclose(host.log_probs, one_program.log_probs, atol=2e-5)
    turns, ended = np.asarray(host.num_turns), np.asarray(host.terminated)
    # wins at the first turn, the env's limit of 3, and episodes cut by the budget
    assert {1, 3} <= set(turns[ended].tolist()) and not ended.all()
    assert np.asarray(host.rewards).sum() >= 1
    other = rollout(params, jax.random.key(2))
    assert not np.array_equal(other.tokens, host.tokens)
    # each compiled piece compiled once, for every turn and every call
    assert rollout.first_turn._cache_size() == next_turn._cache_size() == 1
    assert host.tokens.shape == (16, length)


def test_calculator_rules_by_hand():
    env = make_text_env("calculator", num_digits=3)
    state = c.Sum(865, 330)
    call = c.encode("865+330=") + [c.EOS]
    assert env.step(state, call) == (state, c.encode("1195"), 0.0, False)
    assert env.step(state, c.encode("1195") + [c.EOS, c.FIRST_CHAR]) == (state, [], 1.0, True)
    assert env.step(state, c.encode("1194") + [c.EOS]) == (state, [], 0.0, True)
    question = c.encode("?")
    for text in ("1+", "1234+1=", "+1=", "1+1", ""):  # malformed calls: not sent to the tool
        assert env.step(state, c.encode(text) + [c.EOS]) == (state, question, 0.0, False), text
    assert env.step(state, [c.BOS, c.EOS]) == (state, question, 0.0, False)
    state, prompt = env.reset(jax.random.key(3))
    assert prompt == [c.BOS, *c.encode(f"{state.a}+{state.b}")]
    assert len(prompt) == env.prompt_len == 8 and 100 <= min(state) and max(state) <= 999
    big = c.Calculator(num_digits=30)
    state, _ = big.reset(jax.random.key(0))
    assert len(str(state.a)) == 30  # Python ints: sums past int64
    reply = big.step(state, c.encode(f"{state.a}+{state.b}=") + [c.EOS])[1]
    assert c.decode(reply) == str(state.a + state.b)


def positional_apply(script, prompt_len):
    """A policy that writes ``script`` from the first response column on, sure of each token."""
    table = np.full(64, c.EOS)
    table[prompt_len - 1 : prompt_len - 1 + len(script)] = script

    def apply(params, tokens, mask):
        del params, mask
        following = jnp.asarray(table[: tokens.shape[1]])
        return 40.0 * jax.nn.one_hot(jnp.broadcast_to(following, tokens.shape), c.VOCAB_SIZE)

    return apply


def boom(expression):
    raise ZeroDivisionError("the tool broke")


@pytest.mark.parametrize(
    ("tool", "message"),
    [
        (boom, "turn 0, episode 0 raised ToolError: tool 'add' \\(defined at .*"
         "test_agents_host.py:\\d+\\) raised ZeroDivisionError at .*test_agents_host.py:"
         "\\d+: the tool broke \\(input '1\\+1'\\)"),
        (lambda expression: 2, "tool 'add' \\(defined at .*\\) returned int, not str "
         "\\(input '1\\+1'\\)"),
        (lambda expression: "12345", "tool 'add' returned 5 characters, more than"),
    ],
)  # fmt: skip
def test_a_failing_tool_names_itself_the_env_the_turn_and_the_episode(tool, message):
    env = c.Calculator(num_digits=2, tool=tool)
    settings = EpisodeSettings(2, 5, 1.0, c.PAD, c.EOS)
    script = c.encode("1+1=") + [c.EOS]
    rollout = HostRollout(positional_apply(script, env.prompt_len), env, 2, settings)
    with pytest.raises(HostEnvError, match=f"text env Calculator: step\\(\\) .*{message}"):
        rollout(None, jax.random.key(0))


class BadReply(PyGuessing):
    def step(self, state, response):
        state, reply, reward, done = super().step(state, response)
        return state, np.float32(reply[0]), reward, done


def test_a_wrong_reply_type_names_the_env_and_the_turn_and_jit_is_refused():
    settings = EpisodeSettings(2, 3, 1.0, g.PAD, g.EOS)
    five = [g.FIRST_DIGIT + 5, g.EOS]
    apply, env = positional_apply(five, 1), BadReply(10, 3)
    with pytest.raises(HostEnvError, match="text env bad: step\\(\\) at turn 0, episode 0 "
                       "returned its reply wrongly: token ids must be a list of ints"):  # fmt: skip
        # rollout_episodes hands a Python env to the host rollout
        rollout_episodes(apply, None, env, jax.random.key(0), 2, settings, env_name="bad")
    rollout = HostRollout(apply, env, 2, settings, env_name="bad")
    with pytest.raises(TypeError, match="text env bad is a Python env, stepped on the host"):
        jax.jit(rollout)(None, jax.random.key(0))


@pytest.mark.heavy
def test_episode_trainer_steps_on_the_calculator():
    env = c.Calculator(num_digits=1)
    config = RLHFConfig(
        pad_id=c.PAD, eos_id=c.EOS, response_len=5, algorithm="grpo", group_size=2,
        update_epochs=1, num_minibatches=1, learning_rate=1e-2, ent_coef=0.01,
    )  # fmt: skip
    length = EpisodeLayout(env.prompt_len, 5, env.reply_len, 2).length
    lm = transformer(c.VOCAB_SIZE, length, d_model=16, num_heads=2, num_layers=1)
    trainer = make_episode_trainer(config, lm.policy_apply, env, 4, 2, kv_cache=lm.kv_cache)
    params = lm.init(jax.random.key(0))
    state = trainer.init(params, jax.random.key(0))
    for seed in (1, 2):  # the second step reuses the compiled pieces
        state, metrics = trainer.step(state, jax.random.key(seed))
    assert int(state.step) == 2 and int(metrics["gradient_steps"]) == 1
    assert all(np.isfinite(value) for value in metrics.values()), metrics
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), state.params["policy"], params)
    assert max(jax.tree.leaves(moved)) > 0


class LongPrompt(PyGuessing):
    def reset(self, key):
        return super().reset(key)[0], [g.BOS, g.BOS]


class TextReward(PyGuessing):
    def step(self, state, response):
        state, reply, reward, done = super().step(state, response)
        return state, reply, str(reward), done


def test_a_wrong_prompt_or_reward_names_the_env():
    settings = EpisodeSettings(2, 3, 1.0, g.PAD, g.EOS)
    apply = positional_apply([g.FIRST_DIGIT + 5, g.EOS], 1)
    long_prompt = HostRollout(apply, LongPrompt(10, 3), 4, settings, group_size=2)
    message = "LongPrompt: reset\\(\\) of group 0 returned its prompt wrongly: 2 token ids, more"
    with pytest.raises(HostEnvError, match=f"text env {message} than the env's width 1"):
        long_prompt(None, jax.random.key(0))
    text_reward = HostRollout(apply, TextReward(10, 3), 2, settings)
    with pytest.raises(HostEnvError, match="TextReward: step\\(\\) at turn 0, episode 0 "
                       "returned reward '0.0'; it must be a float"):  # fmt: skip
        text_reward(None, jax.random.key(0))
