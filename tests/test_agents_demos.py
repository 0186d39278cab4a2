"""Demonstrations for SFT on agents (ppojax/rlhf/post/demos.py): the scripted episodes are
valid and win at the rate their script should; the SFT loss reads the model's tokens only
and equals a hand computation; ``make_sft_step``'s ``loss`` option takes it."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ppojax.rlhf.core.turns import EpisodeLayout, Episodes, EpisodeSettings
from ppojax.rlhf.envs import calculator as calc
from ppojax.rlhf.envs import guessing as g
from ppojax.rlhf.post import demos as d
from ppojax.rlhf.post.sft import make_sft_step


def guesses_and_replies(tokens: np.ndarray, turns: int) -> list[tuple[int, int]]:
    """(guess, reply) per turn of a guessing demo with 2-token turns and 1-token replies."""
    return [(int(tokens[1 + 3 * k]) - g.FIRST_DIGIT, int(tokens[3 + 3 * k])) for k in range(turns)]


def test_guessing_demos_are_valid_and_win_as_the_script_should():
    # Secrets in {0, 1, 2}, 2 turns. By hand: the first guess wins 1/3; a first guess of 1
    # leaves one number, won next turn (1/3 x 2/3); a first guess of 0 or 2 leaves two,
    # won next turn half the time (2/3 x 2/3 x 1/2). In all 1/3 + 2/9 + 2/9 = 7/9.
    settings = EpisodeSettings(2, 2, 1.0, g.PAD, g.EOS)
    demos = d.play_demos(
        g.NumberGuessing(3, 2), d.consistent_guesser(3), jax.random.key(0), 400, settings
    )
    tokens, won = np.asarray(demos.tokens), np.asarray(demos.rewards.sum(axis=1))
    # 400 draws: the standard error of the rate is 0.021; 4 of them
    assert abs(won.mean() - 7 / 9) < 0.084
    assert demos.tokens.shape == (400, EpisodeLayout(1, 2, 1, 2).length)
    assert np.asarray(demos.terminated).all()
    for row in range(400):
        turns = int(demos.num_turns[row])
        played = guesses_and_replies(tokens[row], turns)
        # every guess lies among the numbers the earlier replies leave, and the replies
        # agree with one secret; the last reply is CORRECT exactly when the episode won
        low, high = 0, 2
        for guess, reply in played:
            assert low <= guess <= high
            low, high = (guess + 1, high) if reply == g.HIGHER else (low, high)
            low, high = (low, guess - 1) if reply == g.LOWER else (low, high)
        assert (played[-1][1] == g.CORRECT) == (won[row] == 1.0)
        assert turns == 2 or won[row] == 1.0
    # one row by hand: [BOS, guess, EOS, reply, (guess, EOS, reply)], the masks to match
    row = int(np.flatnonzero(np.asarray(demos.num_turns) == 1)[0])
    assert tokens[row].tolist()[:4] == [g.BOS, tokens[row, 1], g.EOS, g.CORRECT]
    assert tokens[row].tolist()[4:] == [g.PAD] * 3
    assert np.asarray(demos.mask[row]).tolist() == [True] * 4 + [False] * 3
    assert np.asarray(demos.model_mask[row]).tolist() == [False, True, True] + [False] * 4


def test_calculator_demos_call_the_tool_then_answer():
    settings = EpisodeSettings(3, 7, 1.0, calc.PAD, calc.EOS)
    env = calc.Calculator(2)
    demos = d.play_demos(env, d.tool_then_answer, jax.random.key(1), 5, settings)
    assert np.asarray(demos.rewards.sum(axis=1)).tolist() == [1.0] * 5
    assert np.asarray(demos.num_turns).tolist() == [2] * 5
    for row, mask in zip(np.asarray(demos.tokens), np.asarray(demos.mask), strict=True):
        # prompt [6] = BOS "a+b"; turn 0 [7] = "a+b=" EOS; reply [3]; turn 1 [7] = the sum, EOS
        prompt = calc.decode(row[1:6].tolist())
        a, b = (int(x) for x in prompt.split("+"))
        assert calc.decode(row[6:13].tolist()) == prompt + "="
        assert calc.decode(row[13:16][mask[13:16]].tolist()) == str(a + b)
        assert calc.decode(row[16:23].tolist()) == str(a + b)


def test_a_script_turn_without_eos_and_a_token_budget_are_refused():
    env, settings = g.NumberGuessing(3, 2), EpisodeSettings(2, 2, 1.0, g.PAD, g.EOS)
    with pytest.raises(ValueError, match="must end with eos_id"):
        d.play_demos(env, lambda *_: [g.FIRST_DIGIT], jax.random.key(0), 1, settings)
    budget = EpisodeSettings(2, 2, 1.0, g.PAD, g.EOS, token_budget=3)
    with pytest.raises(ValueError, match="no token budget"):
        d.play_demos(env, d.consistent_guesser(3), jax.random.key(0), 1, budget)


def logits_as_params(params, tokens, mask):
    """A 'model' whose logits are its params [B, L, V]: gradients land on positions."""
    return params


def tiny_batch() -> d.DemoBatch:
    # 3-token turns: BOS | "4" EOS pad | HIGHER | "8" EOS pad | CORRECT
    tokens = [
        g.BOS,
        g.FIRST_DIGIT + 4,
        g.EOS,
        g.PAD,
        g.HIGHER,
        g.FIRST_DIGIT + 8,
        g.EOS,
        g.PAD,
        g.CORRECT,
    ]
    mask = [1, 1, 1, 0, 1, 1, 1, 0, 1]
    model = [0, 1, 1, 0, 0, 1, 1, 0, 0]
    return d.DemoBatch(
        jnp.asarray([tokens], jnp.int32), jnp.asarray([mask], bool), jnp.asarray([model], bool)
    )


def test_demo_loss_reads_the_model_tokens_only_and_matches_a_hand_computation():
    batch = tiny_batch()
    logits = jax.random.normal(jax.random.key(2), (1, 9, g.VOCAB_SIZE))
    loss = d.demo_loss(logits_as_params, logits, batch)
    # The model tokens at columns 1, 2, 5, 6 are predicted by the real columns 0, 1, 4, 5
    # (column 5's predecessor is the env's reply at 4, the pad at 3 skipped).
    x = np.asarray(logits[0], np.float64)
    log_softmax = x - x.max(axis=1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(axis=1, keepdims=True))
    tokens = np.asarray(batch.tokens[0])
    hand = -np.mean([log_softmax[p, tokens[c]] for p, c in ((0, 1), (1, 2), (4, 5), (5, 6))])
    assert float(loss) == pytest.approx(hand, rel=1e-6)
    grads = jax.grad(d.demo_loss, argnums=1)(logits_as_params, logits, batch)
    touched = np.abs(np.asarray(grads[0])).sum(axis=1) > 0
    assert touched.tolist() == [True, True, False, False, True, True, False, False, False]


def test_the_sft_step_takes_the_demo_loss():
    batch = tiny_batch()
    logits = jax.random.normal(jax.random.key(3), (1, 9, g.VOCAB_SIZE))
    step = make_sft_step(logits_as_params, optax.sgd(1.0), loss=d.demo_loss)
    params, _, metrics = step(logits, optax.sgd(1.0).init(logits), batch)
    grads = jax.grad(d.demo_loss, argnums=1)(logits_as_params, logits, batch)
    np.testing.assert_allclose(params, logits - grads, rtol=1e-6, atol=1e-7)
    assert float(metrics["loss"]) == pytest.approx(
        float(d.demo_loss(logits_as_params, logits, batch))
    )


def test_train_on_demos_descends_the_demo_loss():
    batch = tiny_batch()
    demos = Episodes(
        *batch,
        jnp.zeros((1, 9)),
        jnp.zeros((1, 2)),
        jnp.asarray([2]),
        jnp.asarray([True]),
    )
    logits = jax.random.normal(jax.random.key(4), (1, 9, g.VOCAB_SIZE))
    params, curve = d.train_on_demos(
        logits_as_params, logits, demos, jax.random.key(5), steps=20, batch_size=1,
        learning_rate=0.1,
    )  # fmt: skip
    # the curve is the demo loss before each step: it starts at the initial params' loss
    start = float(d.demo_loss(logits_as_params, logits, batch))
    assert float(curve[0]) == pytest.approx(start, rel=1e-6)
    assert float(d.demo_loss(logits_as_params, params, batch)) < 0.5 * start
