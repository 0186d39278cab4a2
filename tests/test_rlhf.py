"""Unit tests of ppojax.rlhf: task, model and sampling, losses, rewards, GAE, KL controller."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerance import assert_close, assert_trees_close

from ppojax.rlhf import (
    PPOBatch,
    RLHFConfig,
    bradley_terry_loss,
    build_model,
    collect_batch,
    gold_score,
    init_model_params,
    init_rlhf_state,
    kl_estimate,
    ppo_loss,
    response_stats,
    reward_scores,
    sample_prompts,
    sample_responses,
    sft_loss,
    target_responses,
    token_advantages,
    token_rewards,
    update_kl_coef,
)
from ppojax.rlhf.ppo import policy_stats
from ppojax.rlhf.task import BOS, EOS, PAD, response_mask
from ppojax.update import shuffle_into_minibatches

TINY = dict(
    num_digits=6,
    prompt_len=4,
    response_len=5,
    d_model=16,
    num_heads=2,
    num_layers=2,
    batch_size=8,
    num_minibatches=2,
    ppo_epochs=2,
)


@pytest.fixture(scope="module")
def config() -> RLHFConfig:
    return RLHFConfig(**TINY)


@pytest.fixture(scope="module")
def params(config):
    return init_model_params(config, jax.random.key(0))


@pytest.fixture(scope="module")
def prompts(config):
    return sample_prompts(jax.random.key(1), config.batch_size, config.prompt_len, 6)


@pytest.fixture(scope="module")
def reward_params(config):
    """A random network whose value head (zero at init) is drawn at random, so scores vary."""
    params = init_model_params(config, jax.random.key(10))
    head = params["params"]["value_head"]
    kernel = jax.random.normal(jax.random.key(11), head["kernel"].shape)
    return {"params": {**params["params"], "value_head": {**head, "kernel": kernel}}}


def test_prompts_are_bos_then_distinct_digits(prompts):
    chex.assert_shape(prompts, (8, 4))
    assert (prompts[:, 0] == BOS).all()
    for row in np.asarray(prompts[:, 1:]):
        assert len(set(row)) == 3 and row.min() >= 3


def test_gold_score_hand_values():
    prompt = jnp.array([[BOS, 5, 3, 4]] * 6)
    responses = jnp.array(
        [
            [3, 4, 5, EOS, PAD],  # exact: 3 / 3
            [3, 5, 4, EOS, PAD],  # one match: 1 / 3
            [3, 4, EOS, PAD, PAD],  # too short: 2 / max(2, 3)
            [3, 4, 5, 5, EOS],  # one extra token: 3 / 4
            [3, 4, 5, 3, 4],  # no EOS: 3 / 5
            [EOS, PAD, PAD, PAD, PAD],  # empty: 0 / 3
        ]
    )
    np.testing.assert_allclose(gold_score(prompt, responses), [1, 1 / 3, 2 / 3, 3 / 4, 3 / 5, 0])
    np.testing.assert_allclose(gold_score(prompt, target_responses(prompt, 5)), 1.0)


def test_response_mask_covers_tokens_up_to_first_eos():
    responses = jnp.array([[3, EOS, PAD, PAD], [3, 4, 5, 6], [EOS, 3, EOS, 4]])
    expected = [[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]]
    np.testing.assert_array_equal(response_mask(responses), np.array(expected, bool))


@pytest.mark.parametrize(
    "field, value",
    [
        ("response_len", 3),
        ("num_heads", 3),
        ("num_minibatches", 3),
        ("kl_estimator", "k2"),
        ("kl_coef", -0.1),
        ("temperature", 0.0),
        ("gae_lambda", 1.5),
        ("prompt_len", 8),
    ],
)
def test_invalid_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RLHFConfig(**{**TINY, field: value})


def naive_sample(model, params, prompts, key, response_len, temperature):
    """Reference sampler: a full forward pass over the whole prefix at every step, no cache."""
    tokens = prompts
    done = jnp.zeros((prompts.shape[0],), bool)
    sampled, log_probs = [], []
    for step_key in jax.random.split(key, response_len):
        logits, _, _ = model.apply(params, tokens)
        scaled = jax.nn.log_softmax(logits[:, -1] / temperature, axis=-1)
        token = jax.random.categorical(step_key, scaled)
        log_prob = jnp.take_along_axis(scaled, token[:, None], axis=1)[:, 0]
        token = jnp.where(done, PAD, token)
        sampled.append(token)
        log_probs.append(jnp.where(done, 0.0, log_prob))
        done = done | (token == EOS)
        tokens = jnp.concatenate([tokens, token[:, None]], axis=1)
    return jnp.stack(sampled, 1), jnp.stack(log_probs, 1)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_kv_cache_sampling_matches_full_forward(config, params, prompts, temperature):
    model = build_model(config)
    key = jax.random.key(2)
    samples = jax.jit(sample_responses, static_argnums=(0, 4))(
        model, params, prompts, key, config.response_len, temperature
    )
    tokens, log_probs = jax.jit(naive_sample, static_argnums=(0, 4))(
        model, params, prompts, key, config.response_len, temperature
    )
    # Cached and naive sampling are two programs whose logits agree to float32 rounding; the
    # Gumbel-argmax draw picks the same token unless two candidates tie within that, and the
    # log-probs (of order 1-3: log-softmax over a small vocabulary) agree to ulps of 1-3.
    np.testing.assert_array_equal(samples.tokens, tokens)
    np.testing.assert_allclose(samples.log_probs, log_probs, atol=1e-5)
    stats = jax.jit(response_stats, static_argnums=0)(
        model, params, prompts, samples.tokens, temperature
    )
    np.testing.assert_allclose(  # one forward pass against the cache: as above, atol ~80 ulps
        jnp.where(samples.mask, stats.log_probs, 0.0), samples.log_probs, atol=1e-5
    )
    np.testing.assert_array_equal(samples.mask, response_mask(samples.tokens))


def test_sampling_shapes_and_determinism(config, params, prompts):
    model = build_model(config)
    sample = jax.jit(sample_responses, static_argnums=(0, 4))
    first = sample(model, params, prompts, jax.random.key(3), config.response_len, 1.0)
    again = sample(model, params, prompts, jax.random.key(3), config.response_len, 1.0)
    other = sample(model, params, prompts, jax.random.key(4), config.response_len, 1.0)
    chex.assert_shape([first.tokens, first.log_probs, first.mask], (8, config.response_len))
    chex.assert_trees_all_equal(first, again)
    assert not (first.tokens == other.tokens).all()
    assert (jnp.where(first.mask, 0, first.tokens) == PAD).all()


def test_bradley_terry_loss_hand_values():
    chosen = jnp.array([0.0, 1.0, 0.0, 2.0])
    rejected = jnp.array([0.0, 0.0, 1.0, -1.0])
    per_pair = [np.log(2.0), np.log1p(np.exp(-1.0)), np.log1p(np.exp(1.0)), np.log1p(np.exp(-3))]
    np.testing.assert_allclose(bradley_terry_loss(chosen, rejected), np.mean(per_pair), rtol=1e-6)
    mask = jnp.array([1.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(
        bradley_terry_loss(chosen, rejected, mask), np.mean(per_pair[:2]), rtol=1e-6
    )


@pytest.mark.parametrize(
    "kl, expected_factor",
    [
        (2.0, 1.0),  # on target: unchanged
        (3.0, 1.0 + 0.2 * 64 / 320),  # 50% over: error clipped at +0.2, beta up
        (2.2, 1.0 + 0.1 * 64 / 320),  # 10% over: beta up by e * n / horizon
        (1.8, 1.0 - 0.1 * 64 / 320),  # 10% under: beta down
        (0.0, 1.0 - 0.2 * 64 / 320),  # far under: error clipped at -0.2
        (100.0, 1.0 + 0.2 * 64 / 320),
    ],
)
def test_adaptive_kl_controller_table(kl, expected_factor):
    beta = update_kl_coef(jnp.float32(0.1), jnp.float32(kl), 2.0, 320.0, 64)
    np.testing.assert_allclose(beta, 0.1 * expected_factor, rtol=1e-6)


def test_kl_estimators_hand_values():
    log_probs = jnp.array([[-1.0, -2.0]])
    ref_log_probs = jnp.array([[-1.5, -1.0]])
    np.testing.assert_allclose(kl_estimate(log_probs, ref_log_probs, "k1"), [[0.5, -1.0]])
    k3 = [np.expm1(-0.5) + 0.5, np.expm1(1.0) - 1.0]
    np.testing.assert_allclose(kl_estimate(log_probs, ref_log_probs, "k3"), [k3], rtol=1e-6)


def test_token_rewards_put_score_at_last_real_token():
    mask = jnp.array([[True, True, True, False], [True, True, True, True]])
    kl = jnp.array([[0.1, 0.2, 0.3, 0.4], [0.1, 0.1, 0.1, 0.1]])
    rewards = token_rewards(jnp.array([2.0, 1.0]), kl, mask, 0.5, jnp.array([0.0, 0.25]))
    expected = [[-0.05, -0.1, -0.15 + 2.0, 0.0], [-0.05, -0.05, -0.05, -0.05 + 0.75]]
    np.testing.assert_allclose(rewards, expected, rtol=1e-6)


def numpy_gae(rewards, values, mask, gamma, lam):
    advantages = np.zeros_like(rewards)
    for b in range(rewards.shape[0]):
        length = int(mask[b].sum())
        running = 0.0
        for t in reversed(range(length)):
            next_value = values[b, t + 1] if t + 1 < length else 0.0
            delta = rewards[b, t] + gamma * next_value - values[b, t]
            running = delta + gamma * lam * running
            advantages[b, t] = running
    return advantages


def test_token_gae_matches_numpy_loop_and_ignores_padding(config):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(3, 5)).astype(np.float32)
    values = rng.normal(size=(3, 5)).astype(np.float32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], bool)
    advantages, returns = token_advantages(
        jnp.asarray(rewards * mask), jnp.asarray(values), jnp.asarray(mask), config
    )
    expected = numpy_gae(rewards * mask, values, mask, 1.0, 0.95)
    np.testing.assert_allclose(np.where(mask, advantages, 0.0), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(returns, advantages + values, rtol=1e-6)


def random_ppo_batch(config, prompts, responses, key) -> PPOBatch:
    mask = response_mask(responses)
    keys = jax.random.split(key, 4)
    shape = responses.shape
    return PPOBatch(
        prompts=prompts,
        responses=responses,
        mask=mask,
        log_probs=jnp.where(mask, -jax.random.uniform(keys[0], shape, maxval=3.0), 0.0),
        values=jnp.where(mask, jax.random.normal(keys[1], shape), 0.0),
        advantages=jnp.where(mask, jax.random.normal(keys[2], shape), 0.0),
        returns=jnp.where(mask, jax.random.normal(keys[3], shape), 0.0),
    )


def pad_right(array: jax.Array, extra: int, value) -> jax.Array:
    padding = jnp.full((array.shape[0], extra), value, array.dtype)
    return jnp.concatenate([array, padding], axis=1)


def test_padding_changes_no_loss(config, prompts):
    extra = 3
    long_config = config.replace(response_len=config.response_len + extra)
    model = build_model(long_config)
    params = init_model_params(long_config, jax.random.key(5))
    responses = jax.jit(sample_responses, static_argnums=(0, 4))(
        model, params, prompts, jax.random.key(6), 5, 1.0
    ).tokens
    batch = random_ppo_batch(config, prompts, responses, jax.random.key(7))
    padded = PPOBatch(
        prompts, *(pad_right(x, extra, PAD if x.dtype == jnp.int32 else 0) for x in batch[1:])
    )
    full = {"policy": params}
    loss_fn = jax.jit(ppo_loss, static_argnums=(0, 1))
    loss, metrics = loss_fn(model, config, full, batch)
    padded_loss, padded_metrics = loss_fn(model, config, full, padded)
    # Other shapes, so another program: the loss and metrics are masked means of per-token
    # terms of order 1 (ratios near 1, advantages, log-probs), some near zero (the policy loss,
    # approx_kl), so ulps of 1 rather than of each value.
    assert_close(padded_loss, loss, ulps=128)
    assert_trees_close(padded_metrics, metrics, ulps=128)
    targets = target_responses(prompts, 5)
    sft_fn = jax.jit(sft_loss, static_argnums=0)
    np.testing.assert_allclose(  # a cross-entropy of order log(vocabulary), far from zero
        sft_fn(model, params, prompts, pad_right(targets, extra, PAD)),
        sft_fn(model, params, prompts, targets),
        rtol=1e-5,
    )
    scores_fn = jax.jit(reward_scores, static_argnums=0)
    np.testing.assert_allclose(  # scores of order 1 from other shapes: ~8 ulps of 1 and 80 of each
        scores_fn(model, params, prompts, pad_right(responses, extra, PAD)),
        scores_fn(model, params, prompts, responses),
        rtol=1e-5,
        atol=1e-6,
    )


# With one minibatch the loss sees the batch in the shape the rollout did (the same program
# for the log-probs), and the ratio is exactly 1; a smaller minibatch changes the matmul
# shapes and so the float rounding: log-probs of order 1-3 then differ by ulps of them, and
# 1e-5 is ~80 ulps of 1. approx_kl ~ mean(log_ratio^2) / 2 is second order in that.
@pytest.mark.parametrize(
    "separate_critic, num_minibatches, tolerance", [(False, 1, 0.0), (True, 2, 1e-5)]
)
def test_first_minibatch_has_ratio_one_and_zero_kl_when_policy_is_reference(
    config, params, reward_params, prompts, separate_critic, num_minibatches, tolerance
):
    config = config.replace(separate_critic=separate_critic, num_minibatches=num_minibatches)
    model = build_model(config)
    state = init_rlhf_state(config, params, reward_params, 0.1)
    assert ("critic" in state.params) == separate_critic
    batch, metrics = jax.jit(collect_batch, static_argnums=(0, 1))(
        model, config, state, prompts, jax.random.key(8)
    )
    assert float(metrics["kl"]) == 0.0
    first = jax.tree.map(
        lambda x: x[0], shuffle_into_minibatches(jax.random.key(9), batch, num_minibatches)
    )
    stats = jax.jit(policy_stats, static_argnums=(0, 1))(
        model, config, state.params, first.prompts, first.responses
    )
    log_ratio = jnp.where(first.mask, stats.log_probs - first.log_probs, 0.0)
    np.testing.assert_allclose(jnp.exp(log_ratio), 1.0, rtol=0, atol=tolerance)
    _, loss_metrics = jax.jit(ppo_loss, static_argnums=(0, 1))(model, config, state.params, first)
    assert float(loss_metrics["clip_fraction"]) == 0.0
    np.testing.assert_allclose(loss_metrics["approx_kl"], 0.0, atol=tolerance**2)
    chex.assert_shape([batch.advantages, batch.returns, batch.log_probs], (8, 5))
    masked_advantages = batch.advantages[batch.mask]
    np.testing.assert_allclose(masked_advantages.mean(), 0.0, atol=1e-5)
    np.testing.assert_allclose(masked_advantages.std(), 1.0, atol=1e-3)
