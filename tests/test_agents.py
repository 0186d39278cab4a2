"""Language-model agents: the text env registry, the guessing game's rules against hand-played
episodes, and multi-turn rollouts: hand-checked layouts and masks with a scripted model,
budgets, the KV cache across turns against recomputation, vmap and determinism."""

import dataclasses
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.checks import ConfigError
from ppojax.rlhf import RLHFConfig
from ppojax.rlhf.core.credit import episode_gae, model_slots, turn_advantages
from ppojax.rlhf.core.episode_trainer import check_turn_weight, make_episode_trainer
from ppojax.rlhf.core.episodes import (
    EpisodeLayout,
    EpisodeSettings,
    episode_stats,
    episode_values,
    previous_real,
    rollout_episodes,
)
from ppojax.rlhf.core.objective import LossParts
from ppojax.rlhf.core.update import (
    EpisodeBatch,
    at_positions,
    credit,
    episode_advantages,
    episode_loss,
)
from ppojax.rlhf.envs import guessing as g
from ppojax.rlhf.envs.env import Tokens, make_text_env, register_text_env, text_env_ids
from ppojax.rlhf.models.transformer import transformer

D5 = g.FIRST_DIGIT + 5


def play(env, secret, guesses):
    """The env's (reply token, reward, done) for each response, from secret ``secret``."""
    state = g.GuessingState(jnp.int32(secret), jnp.int32(0))
    seen = []
    for response in guesses:
        state, reply, reward, done = env.step(state, response)
        assert bool(reply.mask.all()) and reply.tokens.shape == (1,)
        seen.append((int(reply.tokens[0]), float(reward), bool(done)))
    return seen, int(state.turn)


def raw(tokens, real):
    return Tokens(jnp.asarray(tokens, jnp.int32), jnp.asarray(real, bool))


def test_guessing_rules_against_a_hand_played_episode():
    env = g.NumberGuessing(num_values=100, max_turns=6)
    digit = g.FIRST_DIGIT
    guesses = [
        g.guess_tokens(50, 3),  # 37 < 50
        g.guess_tokens(25, 3),  # 37 > 25
        g.guess_tokens(137, 4),  # three digits: invalid, the turn still counts
        raw([digit + 9, digit + 9, g.EOS], [1, 1, 0]),  # "99" cut at the turn limit: lower
        raw([g.EOS, digit + 3, digit + 7], [1, 0, 0]),  # nothing before EOS: invalid
        raw([digit + 3, digit + 7, g.EOS, digit + 1], [1, 1, 1, 0]),  # "37": correct
    ]
    steps, turns = play(env, 37, guesses)
    assert steps == [
        (g.LOWER, 0.0, False),
        (g.HIGHER, 0.0, False),
        (g.INVALID, 0.0, False),
        (g.LOWER, 0.0, False),
        (g.INVALID, 0.0, False),
        (g.CORRECT, 1.0, True),
    ]
    assert turns == 6


def test_guessing_turn_budget_leading_zeros_and_range():
    env = g.NumberGuessing(num_values=40, max_turns=2)
    assert env.num_digits == 2
    digit = g.FIRST_DIGIT
    guesses = [
        raw([digit, digit + 7, g.EOS], [1, 1, 1]),  # "07" is 7
        g.guess_tokens(50, 3),  # >= num_values: invalid; the second turn ends the game
    ]
    assert play(env, 7, guesses)[0] == [(g.CORRECT, 1.0, True), (g.INVALID, 0.0, True)]
    assert play(env, 8, guesses)[0] == [(g.HIGHER, 0.0, False), (g.INVALID, 0.0, True)]
    assert g.read_guess(raw([digit + 3, g.HIGHER, g.EOS], [1, 1, 1]), 2)[1].item() is False
    state, prompt = env.reset(jax.random.key(0))
    assert prompt.tokens.tolist() == [g.BOS] and 0 <= int(state.secret) < 40


def test_text_env_registry():
    assert "guessing" in text_env_ids()
    env = make_text_env("guessing", num_values=10, max_turns=3)
    assert (env.num_values, env.max_turns, env.prompt_len, env.reply_len) == (10, 3, 1, 1)
    with pytest.raises(KeyError, match="Did you mean 'guessing'"):
        make_text_env("guesing")
    register_text_env("test/no-step", lambda: object())
    with pytest.raises(TypeError, match="'test/no-step'.*no method reset"):
        make_text_env("test/no-step")
    register_text_env("test/guess4", lambda: g.NumberGuessing(num_values=4))
    assert make_text_env("test/guess4").num_values == 4


def scripted_apply(params, tokens, mask):
    """Guesses 5 every turn: after the digit 5 it says EOS, after anything else 5, with a
    logit gap of 40 (other tokens have probability < 1e-16)."""
    del params, mask
    following = jnp.where(tokens == D5, g.EOS, D5)
    return 40.0 * jax.nn.one_hot(following, g.VOCAB_SIZE)


@dataclasses.dataclass(frozen=True)
class FiveOrSeven(g.NumberGuessing):
    """The guessing game with the secret 5 or 7, so every row's episode is known by hand."""

    def reset(self, key):
        state, prompt = super().reset(key)
        secret = 5 + 2 * jax.random.randint(key, (), 0, 2, jnp.int32)
        return state._replace(secret=secret), prompt


def scripted_episodes(max_turns, token_budget=None, batch_size=8, turn_len=3):
    env = FiveOrSeven(num_values=10, max_turns=3)
    settings = EpisodeSettings(max_turns, turn_len, 1.0, g.PAD, g.EOS, token_budget)
    run = jax.jit(
        lambda key: rollout_episodes(scripted_apply, None, env, key, batch_size, settings)
    )
    return run(jax.random.key(4))


def hand_rows(turns):
    """(tokens, mask, model_mask) of each hand-written row: per turn (response, real, reply)."""
    tokens, mask, model = [g.BOS], [1], [0]
    for response, real, reply in turns:
        tokens += [t if r else g.PAD for t, r in zip(response, real, strict=True)] + [
            reply or g.PAD
        ]
        mask += list(real) + [int(reply is not None)]
        model += list(real) + [0]
    return np.array(tokens), np.array(mask, bool), np.array(model, bool)


def check_rows(episodes, expected, turn_len=3):
    """Every row is one of ``expected`` (keyed by its first reply token), and each occurs."""
    seen = set()
    for row in range(episodes.tokens.shape[0]):
        first_reply = int(episodes.tokens[row, 1 + turn_len])
        seen.add(first_reply)
        tokens, mask, model, rewards, turns, terminated = expected[first_reply]
        np.testing.assert_array_equal(episodes.tokens[row], tokens)
        np.testing.assert_array_equal(episodes.mask[row], mask)
        np.testing.assert_array_equal(episodes.model_mask[row], model)
        np.testing.assert_array_equal(episodes.rewards[row], rewards)
        assert (int(episodes.num_turns[row]), bool(episodes.terminated[row])) == (turns, terminated)
    assert seen == set(expected)
    # the scripted model's choices are sure: log-probs 0 on its tokens, 0 off them too
    np.testing.assert_allclose(episodes.log_probs, 0.0, atol=1e-6)


GUESS = ((D5, g.EOS, g.PAD), (1, 1, 0))
EMPTY = ((g.PAD,) * 3, (0, 0, 0), None)


def test_rollout_layout_and_masks_by_hand():
    episodes = scripted_episodes(max_turns=4)
    correct = hand_rows([(*GUESS, g.CORRECT), EMPTY, EMPTY, EMPTY])
    higher = hand_rows([(*GUESS, g.HIGHER)] * 3 + [EMPTY])  # the env's 3 turns end it
    check_rows(
        episodes,
        {
            g.CORRECT: (*correct, [1, 0, 0, 0], 1, True),
            g.HIGHER: (*higher, [0, 0, 0, 0], 3, True),
        },
    )
    layout = EpisodeLayout(1, 3, 1, 4)
    assert episodes.tokens.shape == (8, layout.length) == (8, 17)
    # env tokens are never model tokens: model tokens sit in response columns only
    assert not (episodes.model_mask & ~layout.response_columns).any()
    assert layout.turn_index.tolist() == [-1] + [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4


def test_turn_and_token_budgets_end_episodes():
    by_turns = scripted_episodes(max_turns=2)
    higher = hand_rows([(*GUESS, g.HIGHER)] * 2)
    correct = hand_rows([(*GUESS, g.CORRECT), EMPTY])
    check_rows(
        by_turns,
        {g.CORRECT: (*correct, [1, 0], 1, True), g.HIGHER: (*higher, [0, 0], 2, False)},
    )
    # 3 model tokens: the second turn's "5" is cut before its EOS, the env never reads it
    by_tokens = scripted_episodes(max_turns=3, token_budget=3)
    cut = ((D5, g.PAD, g.PAD), (1, 0, 0), None)
    higher = hand_rows([(*GUESS, g.HIGHER), cut, EMPTY])
    correct = hand_rows([(*GUESS, g.CORRECT), EMPTY, EMPTY])
    check_rows(
        by_tokens,
        {g.CORRECT: (*correct, [1, 0, 0], 1, True), g.HIGHER: (*higher, [0, 0, 0], 1, False)},
    )


def test_a_turn_at_its_token_limit_goes_to_the_env_without_eos():
    """One token per turn: the scripted "5" fills the turn, which the env reads as a guess."""
    episodes = scripted_episodes(max_turns=3, turn_len=1)
    five = ((D5,), (1,))
    correct = hand_rows([(*five, g.CORRECT), ((g.PAD,), (0,), None), ((g.PAD,), (0,), None)])
    higher = hand_rows([(*five, g.HIGHER)] * 3)
    check_rows(
        episodes,
        {g.CORRECT: (*correct, [1, 0, 0], 1, True), g.HIGHER: (*higher, [0, 0, 0], 3, True)},
        turn_len=1,
    )


def test_previous_real_column():
    mask = jnp.array([[0, 1, 1, 0, 0, 1, 0, 1]], bool)
    assert previous_real(mask).tolist() == [[0, 0, 1, 2, 2, 2, 5, 5]]


def test_kv_cache_across_turns_matches_recomputation_vmaps_and_repeats():
    env = g.NumberGuessing(num_values=10, max_turns=3)
    settings = EpisodeSettings(4, 3, 1.0, g.PAD, g.EOS, token_budget=10)
    length = EpisodeLayout(1, 3, 1, 4).length
    lm = transformer(g.VOCAB_SIZE, length, d_model=16, num_heads=2, num_layers=1)
    params = lm.init(jax.random.key(0))

    def run(model, key):
        return rollout_episodes(model, params, env, key, 6, settings, group_size=2)

    @jax.jit
    def both(keys):
        cached = jax.vmap(lambda key: run(lm.kv_cache, key))(keys)
        full = run(lm.policy_apply, keys[1])
        stats = episode_stats(lm.policy_apply, params, full.tokens, full.mask, 1.0)
        return cached, full, stats

    keys = jax.random.split(jax.random.key(1), 2)
    cached, full, stats = both(keys)
    first = jax.tree.map(lambda leaf: leaf[1], cached)
    for name in ("tokens", "mask", "model_mask", "rewards", "num_turns", "terminated"):
        np.testing.assert_array_equal(getattr(first, name), getattr(full, name), err_msg=name)
    # float32 log-softmaxes of O(1) logits reached by differently ordered sums
    np.testing.assert_allclose(first.log_probs, full.log_probs, atol=2e-5)
    # one forward pass over the finished episodes gives the log-probs sampled turn by turn
    recomputed = np.where(full.model_mask, stats.log_probs, 0.0)
    np.testing.assert_allclose(recomputed, full.log_probs, atol=2e-5)
    assert (np.asarray(full.tokens)[~np.asarray(full.mask)] == g.PAD).all()
    assert not (full.model_mask & ~full.mask).any() and full.model_mask.any(axis=1).all()
    assert (full.model_mask.sum(axis=1) <= 10).all()  # the token budget
    again = both(keys)[0]
    jax.tree.map(np.testing.assert_array_equal, cached, again)  # same key, same episodes
    assert not np.array_equal(cached.tokens[0], cached.tokens[1])  # other key, others


@dataclasses.dataclass(frozen=True)
class WideReply(g.NumberGuessing):
    """Replies two tokens where it promises one."""

    def step(self, state, response):
        state, reply, reward, done = super().step(state, response)
        return state, Tokens(jnp.tile(reply.tokens, 2), jnp.tile(reply.mask, 2)), reward, done


def test_a_wrong_reply_shape_names_the_env():
    settings = EpisodeSettings(2, 3, 1.0, g.PAD, g.EOS)
    env = WideReply(num_values=10)
    with pytest.raises(ValueError, match="text env guess-wide: step.*shape \\(2,\\).*\\[1\\]"):
        jax.eval_shape(
            lambda key: rollout_episodes(
                scripted_apply, None, env, key, 2, settings, env_name="guess-wide"
            ),
            jax.random.key(0),
        )


def test_hugging_face_extend_skips_masked_gaps():
    """A Llama checkpoint's ``extend`` (RoPE: positions must count real tokens only): a chunk
    with a masked gap, fed after the prefill, gives the logits of the compact sequence."""
    from ppojax.rlhf import from_pretrained

    lm = from_pretrained(Path(__file__).resolve().parent / "fixtures" / "hf" / "llama")
    hook = lm.kv_cache

    @jax.jit
    def both(params):
        _, cache = hook.prefill(params, jnp.array([[5, 6]]), jnp.ones((1, 2), bool), 6)
        chunk, chunk_mask = jnp.array([[7, 0, 0, 8]]), jnp.array([[1, 0, 0, 1]], bool)
        logits, _ = hook.extend(params, cache, chunk, chunk_mask, 2)
        compact = lm.policy_apply(params, jnp.array([[5, 6, 7, 8]]), jnp.ones((1, 4), bool))
        return logits[:, jnp.array([0, 3])], compact[:, 2:]

    gapped, compact = both(lm.params)
    # the same float32 sums in another order (see test_hf_models' tolerance)
    np.testing.assert_allclose(gapped, compact, atol=2e-4)


def test_episode_loss_gives_gradient_to_model_tokens_only():
    """The logits of a position get gradient exactly where they predict a model token: a
    zero probe added to the logits [N, L, V] has a nonzero gradient at previous_real(c) for
    every model column c and nowhere else (not at a position predicting an env token), with
    GRPO's loss and with PPO's; so does a zero probe added to PPO's values [N, L] (the value
    loss reads V before model tokens only)."""
    cut = ((D5, g.PAD, g.PAD), (1, 0, 0), None)
    rows = [
        hand_rows([(*GUESS, g.CORRECT), EMPTY, EMPTY, EMPTY]),
        hand_rows([(*GUESS, g.HIGHER)] * 3 + [EMPTY]),
        hand_rows([(*GUESS, g.HIGHER), cut, EMPTY, EMPTY]),
        hand_rows([(*GUESS, g.LOWER)] * 4),
    ]
    tokens, mask, model_mask = (jnp.asarray(np.stack(part)) for part in zip(*rows, strict=True))
    config = RLHFConfig(
        pad_id=g.PAD, eos_id=g.EOS, response_len=3, algorithm="grpo", group_size=2,
        kl_in="loss", kl_estimator="k3", ent_coef=0.1,
    )  # fmt: skip
    lm = transformer(g.VOCAB_SIZE, tokens.shape[1], d_model=16, num_heads=2, num_layers=1)

    def probed(params, tokens, mask):
        return lm.policy_apply(params["lm"], tokens, mask) + params["probe"]

    def probed_critic(params, tokens, mask):
        return lm.critic_apply(params["lm"], tokens, mask) + params["value_probe"]

    params = {
        "lm": lm.init(jax.random.key(0)),
        "probe": jnp.zeros((4, 17, g.VOCAB_SIZE)),
        "value_probe": jnp.zeros((4, 17)),
    }
    ppo = config.replace(algorithm="ppo")

    @jax.jit
    def probe_gradients(params):
        # the old log-probs are the current ones (ratio 1), so no token is clipped off
        old = episode_stats(probed, params, tokens, mask, 1.0).log_probs
        advantages = jnp.where(model_mask, jnp.array([1.0, -1.0, 2.0, -0.5])[:, None], 0.0)
        values = episode_values(probed_critic, params, tokens, mask)
        slots = model_slots(model_mask, 12)
        positions = at_positions(previous_real(mask), slots.columns)
        batch = EpisodeBatch(
            tokens, mask, positions, slots.gather(tokens), slots.mask,
            *(slots.gather(x) for x in (old, old - 0.3, advantages, values, values + advantages)),
        )  # fmt: skip

        def loss(params, config, critic):
            parts = LossParts(probed, critic, lambda p: p["policy"], jnp.float32(0.5), 1.0)
            return episode_loss(config, parts, {"policy": params}, batch)[0]

        grpo_grad = jax.grad(loss)(params, config, None)
        ppo_grad = jax.grad(loss)(params, ppo, probed_critic)
        return grpo_grad["probe"], ppo_grad["probe"], ppo_grad["value_probe"]

    grpo_probe, ppo_probe, value_probe = map(np.asarray, probe_gradients(params))
    expected = np.zeros((4, 17), bool)
    prev = np.asarray(previous_real(mask))
    for row, column in zip(*np.nonzero(np.asarray(model_mask)), strict=True):
        expected[row, prev[row, column]] = True
    env_tokens = np.array(mask & ~model_mask)
    env_tokens[:, 0] = False  # the prompt has no predecessor
    rows_of, columns_of = np.nonzero(env_tokens)
    for touched in (np.abs(grpo_probe).sum(axis=-1) > 0, np.abs(ppo_probe).sum(axis=-1) > 0):
        np.testing.assert_array_equal(touched, expected)
        assert len(rows_of) and not touched[rows_of, prev[rows_of, columns_of]].any()
    np.testing.assert_array_equal(value_probe != 0, expected)


def test_an_episode_trainer_step_updates_the_policy():
    env = g.NumberGuessing(num_values=4, max_turns=2)
    config = RLHFConfig(
        pad_id=g.PAD, eos_id=g.EOS, response_len=2, algorithm="rloo", group_size=2,
        update_epochs=1, num_minibatches=2, learning_rate=1e-2, ent_coef=0.01,
    )  # fmt: skip
    length = EpisodeLayout(1, 2, 1, 2).length
    lm = transformer(g.VOCAB_SIZE, length, d_model=16, num_heads=2, num_layers=1)
    trainer = make_episode_trainer(
        config, lm.policy_apply, env, 8, 2, kv_cache=lm.kv_cache, turn_weight=0.5
    )
    params = lm.init(jax.random.key(0))
    state = trainer.init(params, jax.random.key(0))
    state, metrics = jax.jit(trainer.step)(state, jax.random.key(1))
    assert int(state.step) == 1 and int(metrics["gradient_steps"]) == 2
    assert all(np.isfinite(value) for value in metrics.values()), metrics
    assert 0.0 <= float(metrics["episodes/return"]) <= 1.0
    moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), state.params["policy"], params)
    assert max(jax.tree.leaves(moved)) > 0  # the entropy bonus moves it, rewards or not


def test_a_ppo_episode_trainer_step_trains_the_critic():
    """PPO on the guessing game: a step runs with the critic's own params, which move (its
    value head starts nonzero, so V differs from the GAE returns even with no reward yet);
    what episodes cannot train yet is still refused."""
    env = g.NumberGuessing(num_values=4, max_turns=2)
    config = RLHFConfig(
        pad_id=g.PAD, eos_id=g.EOS, response_len=2, algorithm="ppo", group_size=1,
        update_epochs=1, num_minibatches=2, learning_rate=1e-2, gamma=0.9, gae_lambda=0.8,
    )  # fmt: skip
    length = EpisodeLayout(1, 2, 1, 2).length
    lm = transformer(g.VOCAB_SIZE, length, d_model=16, num_heads=2, num_layers=1)
    trainer = make_episode_trainer(config, lm.policy_apply, env, 4, 2, critic_apply=lm.critic_apply)
    params = lm.init(jax.random.key(0))
    critic = lm.init(jax.random.key(1))
    head = critic["params"]["value_head"]
    head["kernel"] = jax.random.normal(jax.random.key(2), head["kernel"].shape)
    state = trainer.init(params, jax.random.key(0), critic)
    state, metrics = jax.jit(trainer.step)(state, jax.random.key(1))
    assert int(state.step) == 1 and int(metrics["gradient_steps"]) == 2
    assert all(np.isfinite(value) for value in metrics.values()), metrics
    assert float(metrics["loss/value_avg"]) > 0
    for name, before in (("policy", params), ("critic", critic)):
        moved = jax.tree.map(lambda a, b: float(jnp.abs(a - b).max()), state.params[name], before)
        assert max(jax.tree.leaves(moved)) > 0, name
    refused = {
        "critic_apply": (config, {}),
        "algorithm": (config, {"critic_apply": lm.critic_apply, "turn_weight": 0.5}),
    }
    for field, (bad, kwargs) in refused.items():
        with pytest.raises(ConfigError) as info:
            make_episode_trainer(bad, lm.policy_apply, env, 4, 2, **kwargs)
        assert info.value.field == field


def test_episode_gae_by_hand():
    """GAE over each episode's model tokens in order, env tokens skipped: layout prompt 1,
    turns of 2 tokens, replies of 1, 2 turns (turn index [-1, 0, 0, 0, 1, 1, 1]). Row 0 writes
    columns 1, 2 (turn 0), the env replies at 3, then column 4 (turn 1; 5 unwritten), reply
    at 6; rewards [0.5, 1.0]. Row 1 writes column 1 only and ends. beta 0.5, gamma 0.9,
    lambda 0.8 (gamma * lambda = 0.72); junk (9) in KL and values off the model's tokens.

    Row 0: r = -0.5 KL + the turn's reward on its last token: r1 = -0.05, r2 = -0.1 + 0.5 =
    0.4, r4 = -0.15 + 1.0 = 0.85; V1, V2, V4 = 0.2, 0.4, -0.1.
    d4 = 0.85 - (-0.1) = 0.95 (terminal);  A4 = 0.95
    d2 = 0.4 + 0.9 * (-0.1) - 0.4 = -0.09 (V4 bootstraps across the reply);  A2 = -0.09 +
    0.72 * 0.95 = 0.594
    d1 = -0.05 + 0.9 * 0.4 - 0.2 = 0.11;  A1 = 0.11 + 0.72 * 0.594 = 0.53768
    Row 1: r1 = -0.1 + 0.3 = 0.2, V1 = 0.6: A1 = -0.4. Returns A + V."""
    model_mask = jnp.array([[0, 1, 1, 0, 1, 0, 0], [0, 1, 0, 0, 0, 0, 0]], bool)
    junk = 9.0
    kl = jnp.array([[junk, 0.1, 0.2, junk, 0.3, junk, junk], [junk, 0.2] + [junk] * 5])
    values = jnp.array([[junk, 0.2, 0.4, junk, -0.1, junk, junk], [junk, 0.6] + [junk] * 5])
    rewards = jnp.array([[0.5, 1.0], [0.3, 0.0]])
    turn_index = EpisodeLayout(1, 2, 1, 2).turn_index
    advantages, returns = jax.jit(episode_gae, static_argnums=4)(
        rewards, kl, values, model_mask, tuple(turn_index), 0.5, 0.9, 0.8
    )
    expected = np.zeros((2, 7))
    expected[0, [1, 2, 4]] = [0.53768, 0.594, 0.95]
    expected[1, 1] = -0.4
    np.testing.assert_allclose(advantages, expected, atol=1e-6)
    expected_returns = np.where(model_mask, expected + np.asarray(values), 0.0)
    np.testing.assert_allclose(returns, expected_returns, atol=1e-6)


def test_episode_advantages_by_hand():
    """GRPO over groups of 2: (r - mean) / (std + 1e-6) of score - beta * sum of model-token
    KL; RLOO: r - the other's r; on model tokens only."""
    config = RLHFConfig(pad_id=g.PAD, eos_id=g.EOS, algorithm="grpo", group_size=2)
    model_mask = jnp.array([[0, 1, 1, 0], [0, 1, 0, 0], [0, 1, 1, 1], [0, 1, 1, 1]], bool)
    kl = jnp.full((4, 4), 0.5)  # sums over model tokens: 1.0, 0.5, 1.5, 1.5
    scores = jnp.array([1.0, 0.0, 1.0, 1.0])
    grpo = episode_advantages(config, scores, kl, model_mask, jnp.float32(0.2))
    # rewards 0.8, -0.1 (group mean 0.35, std 0.45); 0.7, 0.7 (std 0: advantage 0)
    expected = np.array([0.45 / (0.45 + 1e-6), -0.45 / (0.45 + 1e-6), 0.0, 0.0])
    np.testing.assert_allclose(grpo, np.where(model_mask, expected[:, None], 0.0), rtol=1e-5)
    rloo = episode_advantages(
        config.replace(algorithm="rloo", kl_in="loss"), scores, kl, model_mask, jnp.float32(0.2)
    )
    np.testing.assert_allclose(rloo, np.where(model_mask, [[1.0], [-1.0], [0.0], [0.0]], 0.0))


def credit_case():
    """Four episodes in two groups (prompt 1, turns of 2 tokens and a 1-token reply, 3 turns),
    rows 0 and 2 by hand below; KL 0.5 on every token."""
    model_mask = np.zeros((4, 10), bool)
    for row, columns in enumerate([[1, 2, 4], [1, 4, 5, 7], [1, 2], [1, 4]]):
        model_mask[row, columns] = True
    rewards = jnp.array([[1.0, 0, 0], [0, 0, 1], [1, 0, 0], [0, 0, 0]])
    turn_index = EpisodeLayout(1, 2, 1, 3).turn_index
    return jnp.asarray(model_mask), rewards, jnp.full((4, 10), 0.5), turn_index


def test_turn_advantages_by_hand():
    """MT-GRPO-style credit, beta 0.2 (0.1 per model token): returns from turn k G_ik:
    row 0 [0.7, -0.1, 0], row 1 [0.6, 0.7, 0.9], row 2 [0.8, 0, 0], row 3 [-0.2, -0.1, 0].
    GRPO per turn among the group's episodes that reached it: group 0 turn 0 +-0.05 / (0.05 +
    eps), turn 1 -+0.4 / (0.4 + eps), turn 2 row 1 alone: 0; group 1 turn 0 +-0.5 / (0.5 +
    eps), turn 1 row 3 alone: 0. The episode advantages are the turn-0 ones."""
    model_mask, rewards, kl, turn_index = credit_case()
    config = RLHFConfig(pad_id=0, eos_id=2, algorithm="grpo", group_size=2)
    episodes = types.SimpleNamespace(rewards=rewards, model_mask=model_mask)

    @jax.jit
    def mixed(weight):
        # the trainer's credit reads slots; scattered back to the columns here
        slots = model_slots(model_mask, 4)
        advantages = credit(
            config, episodes, slots.gather(kl), slots, jnp.float32(0.2), weight, turn_index
        )
        return slots.scatter(advantages, 10)

    def unit(d):
        return d / (d + 1e-6)

    a, b, c = unit(0.05), unit(0.4), unit(0.5)
    w = 0.25
    expected = np.zeros((4, 10))
    expected[0, [1, 2]], expected[0, 4] = a, (1 - w) * a - w * b
    expected[1, 1], expected[1, [4, 5]], expected[1, 7] = -a, -(1 - w) * a + w * b, -(1 - w) * a
    expected[2, [1, 2]] = c
    expected[3, 1], expected[3, 4] = -c, -(1 - w) * c
    np.testing.assert_allclose(mixed(jnp.float32(w)), expected, rtol=1e-5, atol=1e-6)

    # w = 0 is today's episode-level credit, bit for bit (one program, so that both read the
    # same compiled sums)
    @jax.jit
    def both(weight):
        slots = model_slots(model_mask, 4)
        scores, beta = rewards.sum(axis=1), jnp.float32(0.2)
        today = episode_advantages(config, scores, slots.gather(kl), slots.mask, beta)
        return mixed(weight), slots.scatter(today, 10)

    np.testing.assert_array_equal(*both(jnp.float32(0.0)))
    # RLOO among the members of each turn, without KL: G row 0 [1, 0, 0], row 1 [1, 1, 1]
    rloo = turn_advantages("rloo", 2, True, rewards, kl, 0.0, model_mask, turn_index)
    expected = np.zeros((4, 10))
    expected[0, 4], expected[1, [4, 5]] = -1.0, 1.0
    expected[2, [1, 2]], expected[3, 1] = 1.0, -1.0
    np.testing.assert_allclose(rloo, expected, atol=1e-6)
    with pytest.raises(ValueError, match="turn_weight must be in \\[0, 1\\]"):
        check_turn_weight(1.5)
