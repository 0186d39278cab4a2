"""ppojax.rlhf's trainer with a model and a reward written here, not the built-in transformer:
PPO, GRPO and RLOO learn; samplers agree; padding, LoRA, options and vmap do what they claim."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.rlhf import (
    RLHFConfig,
    SamplingSettings,
    make_trainer,
    run_steps,
    sample_responses,
)
from ppojax.rlhf.core.lora import tree_bytes
from ppojax.rlhf.core.objective import LossParts
from ppojax.rlhf.core.prompts import play_prompts
from ppojax.rlhf.core.trainer import policy_params_fn
from ppojax.rlhf.core.turns import EpisodeLayout
from ppojax.rlhf.core.update import collect_episodes, episode_loss
from ppojax.rlhf.models.transformer import transformer

VOCAB, PAD, EOS, GOOD = 6, 0, 1, 4
PROMPT_WIDTH, RESPONSE_LEN = 4, 5


class RunningMeanLM(nn.Module):
    """A causal MLP LM: each position sees its own embedding and the mean embedding of the
    real tokens up to it (so left padding changes nothing); logits [B, L, V], values [B, L]."""

    @nn.compact
    def __call__(self, tokens: jax.Array, mask: jax.Array) -> tuple[jax.Array, jax.Array]:
        embedded = nn.Embed(VOCAB, 16)(tokens)
        weights = mask[..., None].astype(jnp.float32)
        counts = jnp.maximum(jnp.cumsum(weights, axis=1), 1.0)
        running = jnp.cumsum(embedded * weights, axis=1) / counts
        hidden = jnp.tanh(nn.Dense(32, name="hidden")(jnp.concatenate([embedded, running], -1)))
        logits = nn.Dense(VOCAB, name="logits")(hidden)
        return logits, nn.Dense(1, name="value")(hidden)[..., 0]


MODEL = RunningMeanLM()


def policy_apply(params, tokens, mask):
    return MODEL.apply(params, tokens, mask)[0]


def critic_apply(params, tokens, mask):
    return MODEL.apply(params, tokens, mask)[1]


def good_tokens(prompts, prompt_mask, responses, response_mask):
    """The reward: the fraction of the response positions that hold GOOD."""
    return ((responses == GOOD) & response_mask).sum(axis=1) / responses.shape[1]


def init_params(seed: int) -> dict:
    tokens = jnp.zeros((1, PROMPT_WIDTH + RESPONSE_LEN), jnp.int32)
    return MODEL.init(jax.random.key(seed), tokens, jnp.ones_like(tokens, bool))


def prompt_batch(key: jax.Array, batch_size: int) -> tuple[jax.Array, jax.Array]:
    """Prompts of 1 to 4 real tokens (2..5), left-padded to PROMPT_WIDTH."""
    length_key, token_key = jax.random.split(key)
    lengths = jax.random.randint(length_key, (batch_size, 1), 1, PROMPT_WIDTH + 1)
    mask = jnp.arange(PROMPT_WIDTH)[None, :] >= PROMPT_WIDTH - lengths
    tokens = jax.random.randint(token_key, (batch_size, PROMPT_WIDTH), 2, VOCAB)
    return jnp.where(mask, tokens, PAD), mask


def config_for(algorithm: str, **changes) -> RLHFConfig:
    base = dict(
        algorithm=algorithm,
        group_size=1 if algorithm == "ppo" else 4,
        pad_id=PAD,
        eos_id=EOS,
        response_len=RESPONSE_LEN,
        update_epochs=2,
        num_minibatches=2,
        learning_rate=3e-3,
        kl_coef=0.01,
    )
    return RLHFConfig(**{**base, **changes})


def trainer_for(config: RLHFConfig):
    critic = critic_apply if config.algorithm == "ppo" else None
    return make_trainer(config, policy_apply, [good_tokens], critic_apply=critic)


@pytest.mark.parametrize("algorithm", ["ppo", "grpo", "rloo"])
def test_reward_rises_within_a_few_dozen_steps(algorithm):
    config = config_for(algorithm)
    trainer = trainer_for(config)
    batch_size = 16 // config.group_size

    def train(key):
        state = trainer.init(init_params(0), key)
        return run_steps(trainer, state, lambda k: prompt_batch(k, batch_size), key, 40)

    state, metrics = jax.jit(train)(jax.random.key(1))
    scores = np.asarray(metrics["rewards/good_tokens/mean"])
    np.testing.assert_array_equal(scores, metrics["objective/scores"])  # one fn, weight 1
    # Random init puts ~1/6 of the positions on GOOD; the last steps should be far above.
    assert scores[:5].mean() < 0.3 and scores[-5:].mean() > 0.5, scores
    assert int(state.step) == 40 and np.isfinite(metrics["objective/kl"]).all()


def test_full_recompute_and_kv_cache_samplers_agree():
    lm = transformer(VOCAB, PROMPT_WIDTH + RESPONSE_LEN, d_model=16, num_heads=2, num_layers=1)
    params = lm.init(jax.random.key(0))
    prompts, mask = prompt_batch(jax.random.key(1), 8)
    settings = SamplingSettings(RESPONSE_LEN, temperature=0.7, pad_id=PAD, eos_id=EOS)

    def both(key):
        full = sample_responses(lm.policy_apply, params, prompts, mask, key, settings)
        cached = sample_responses(lm.kv_cache, params, prompts, mask, key, settings)
        return full, cached

    full, cached = jax.jit(both)(jax.random.key(2))
    np.testing.assert_array_equal(full.tokens, cached.tokens)
    np.testing.assert_array_equal(full.mask, cached.mask)
    # Both are float32 log-softmaxes of O(1) logits reached by differently ordered sums.
    np.testing.assert_allclose(full.log_probs, cached.log_probs, atol=2e-5)
    assert (full.tokens[~full.mask] == PAD).all() and full.mask.any(axis=1).all()


def test_a_group_shares_its_prompts_prefill_and_gets_the_responses_of_repeated_prompts():
    lm = transformer(VOCAB, PROMPT_WIDTH + RESPONSE_LEN, d_model=16, num_heads=2, num_layers=1)
    params = lm.init(jax.random.key(0))
    prompts, mask = prompt_batch(jax.random.key(1), 4)
    settings = SamplingSettings(RESPONSE_LEN, temperature=0.7, pad_id=PAD, eos_id=EOS)
    group = 3

    def both(key):
        repeated = (jnp.repeat(prompts, group, axis=0), jnp.repeat(mask, group, axis=0))
        every_row = sample_responses(lm.kv_cache, params, *repeated, key, settings)
        shared = sample_responses(lm.kv_cache, params, prompts, mask, key, settings, group)
        full = sample_responses(lm.policy_apply, params, prompts, mask, key, settings, group)
        return every_row, shared, full

    every_row, shared, full = jax.jit(both)(jax.random.key(2))
    assert shared.tokens.shape == (4 * group, RESPONSE_LEN)
    # the same tokens; the log-probs of a prefill over 4 rows and over 12 differ by float32
    # rounding of O(1) logits (XLA blocks the two matmuls differently), as in the test above
    np.testing.assert_array_equal(shared.tokens, every_row.tokens)
    np.testing.assert_array_equal(shared.mask, every_row.mask)
    np.testing.assert_allclose(shared.log_probs, every_row.log_probs, atol=2e-5)
    np.testing.assert_array_equal(full.tokens, shared.tokens)
    prefills = []
    counting = lm.kv_cache._replace(
        prefill=lambda p, t, m, n: prefills.append(t.shape) or lm.kv_cache.prefill(p, t, m, n)
    )
    jax.eval_shape(
        lambda k: sample_responses(counting, params, prompts, mask, k, settings, group),
        jax.random.key(3),
    )
    assert prefills == [prompts.shape]  # [B, P], not [B * group, P]


def batch_and_loss(config, state, prompts, mask, key):
    """One step's one-turn batch of ``good_tokens`` episodes (sampled by recomputation) and
    the loss over all of it: what the trainer's step learns from."""
    full = policy_params_fn(config, state.reference)
    played = play_prompts(
        config, policy_apply, (good_tokens,), full(state.params), prompts, mask, key
    )
    critic = critic_apply if config.needs_critic else None
    parts = LossParts(policy_apply, critic, full, state.kl_coef, jnp.float32(1.0))
    start = prompts.shape[1]
    turns = EpisodeLayout(start, config.response_len, 0, 1).turn_index
    batch, _ = collect_episodes(
        config, parts, played.episodes, state, config.response_len, None, turns, start
    )
    loss, metrics = episode_loss(config, parts, state.params, batch, start=start)
    return batch, loss, metrics


def widen(prompts: jax.Array, mask: jax.Array, extra: int):
    """The same prompts left-padded by ``extra`` more columns."""
    pad = jnp.full((prompts.shape[0], extra), PAD, prompts.dtype)
    return jnp.concatenate([pad, prompts], 1), jnp.concatenate([jnp.zeros_like(pad, bool), mask], 1)


def test_left_padding_to_two_widths_changes_nothing():
    config = config_for("ppo", kl_in="loss", kl_estimator="k3")
    trainer = trainer_for(config)
    prompts, mask = prompt_batch(jax.random.key(3), 4)

    def rollout_and_loss(prompts, mask):
        state = trainer.init(init_params(0), jax.random.key(0))
        state = state.replace(params={"policy": init_params(5)})  # policy != reference
        return batch_and_loss(config, state, prompts, mask, jax.random.key(4))

    narrow = jax.jit(rollout_and_loss)(prompts, mask)
    wide = jax.jit(rollout_and_loss)(*widen(prompts, mask, 3))
    np.testing.assert_array_equal(narrow[0].targets, wide[0].targets)
    # The same float32 sums over the same real tokens, only at other offsets.
    for name in ("log_probs", "ref_log_probs", "advantages", "values", "returns"):
        np.testing.assert_allclose(
            getattr(narrow[0], name), getattr(wide[0], name), atol=1e-5, err_msg=name
        )
    # Two programs (other widths) sum terms of order 1 (log-probs, whitened advantages) in
    # other orders: the loss and metrics differ by float32 ulps of 1, not of their own value
    # near zero; atol 1e-5 is ~80 ulps of 1.
    np.testing.assert_allclose(narrow[1], wide[1], rtol=1e-5, atol=1e-5)
    chex.assert_trees_all_close(narrow[2], wide[2], rtol=1e-5, atol=1e-5)


@pytest.mark.heavy
def test_vmap_over_beta_and_seeds_compiles_once_and_warmup_trains_the_critic_only():
    config = config_for("ppo", critic_warmup_steps=1, adaptive_kl=True, kl_target=1.0)
    trainer = trainer_for(config)
    prompts, mask = prompt_batch(jax.random.key(6), 8)
    step = chex.assert_max_traces(trainer.step, n=1)
    sweep = jax.jit(jax.vmap(step, in_axes=(0, None, None, 0)))

    def start(beta, key):
        state = trainer.init(init_params(0), key, critic_params=init_params(7))
        return state.replace(kl_coef=beta)

    betas = jnp.array([0.0, 1.0])
    keys = jax.random.split(jax.random.key(8), 2)
    states = jax.vmap(start)(betas, keys)
    warm, warm_metrics = sweep(states, prompts, mask, keys)
    after, metrics = sweep(warm, prompts, mask, keys)  # a second call, no second trace
    chex.assert_trees_all_equal(warm.params["policy"], states.params["policy"])
    assert not np.allclose(
        warm.params["critic"]["params"]["value"]["kernel"],
        states.params["critic"]["params"]["value"]["kernel"],
    )
    np.testing.assert_array_equal(warm_metrics["objective/kl"], 0.0)  # policy = reference
    # KL 0 is far under target: the controller's error clips at -0.2, n = 8 rows.
    np.testing.assert_allclose(warm.kl_coef, betas * (1 - 0.2 * 8 / 1000.0), rtol=1e-6)
    for layer in ("hidden", "logits"):  # the policy's value head is unused: a separate critic
        old, new = warm.params["policy"]["params"][layer], after.params["policy"]["params"][layer]
        assert (old["kernel"] != new["kernel"]).any()
    assert (
        after.params["policy"]["params"]["hidden"]["kernel"][0]
        != after.params["policy"]["params"]["hidden"]["kernel"][1]
    ).any()
    single = jax.jit(trainer.step)(jax.tree.map(lambda x: x[1], warm), prompts, mask, keys[1])
    # vmap batches the matmuls, so float32 sums may round differently: values are O(1).
    chex.assert_trees_all_close(
        jax.tree.map(lambda x: x[1], (after, metrics)), single, rtol=1e-4, atol=1e-5
    )


def test_lora_reference_is_the_base_and_the_policy_starts_there():
    config = config_for("grpo", lora_rank=2, lora_targets=("hidden", "logits"))
    trainer = trainer_for(config)
    base = init_params(0)
    state = trainer.init(base, jax.random.key(9))
    assert set(state.params["policy"]) == {"params-hidden-kernel", "params-logits-kernel"}
    full = make_trainer(config.replace(lora_rank=0), policy_apply, [good_tokens]).init(
        base, jax.random.key(9)
    )
    assert tree_bytes(state) < tree_bytes(full)
    prompts, mask = prompt_batch(jax.random.key(10), 4)

    def first_step(state):
        merged = policy_params_fn(config, state.reference)(state.params)
        tokens = jnp.concatenate([prompts, prompts], axis=1)
        both = jnp.concatenate([mask, mask], axis=1)
        logits = (policy_apply(merged, tokens, both), policy_apply(base, tokens, both))
        return merged, logits, trainer.step(state, prompts, mask, jax.random.key(11))

    merged, (merged_logits, base_logits), (new, metrics) = jax.jit(first_step)(state)
    chex.assert_trees_all_equal(merged, base)  # W + scale * A @ 0 is W, bit for bit
    # XLA may fuse the merge into the matmul, so the logits (O(1)) round differently.
    np.testing.assert_allclose(merged_logits, base_logits, atol=1e-6)
    np.testing.assert_allclose(metrics["objective/kl"], 0.0, atol=1e-5)
    chex.assert_trees_all_equal(new.reference, base)  # the base stays frozen
    assert not np.allclose(new.params["policy"]["params-hidden-kernel"]["b"], 0.0)


@pytest.mark.heavy
def test_lora_full_lets_a_value_head_read_from_the_policy_learn():
    """PPO whose critic is the policy's own value head: under LoRA on the other layers that
    head stays at its initial values, and with lora_full=("value",) it is trained."""
    prompts, mask = prompt_batch(jax.random.key(14), 8)

    def heads_after_steps(config):
        trainer = trainer_for(config)

        def train(key):
            state = trainer.init(init_params(0), key)  # no critic params: the value head
            for step_key in jax.random.split(key, 3):
                state, metrics = trainer.step(state, prompts, mask, step_key)
            merged = policy_params_fn(config, state.reference)(state.params)
            return merged["params"]["value"], merged["params"]["hidden"], metrics

        return jax.jit(train)(jax.random.key(15))

    config = config_for("ppo", lora_rank=2, lora_targets=("hidden", "logits"))
    frozen_head, frozen_hidden, _ = heads_after_steps(config)
    head, hidden, metrics = heads_after_steps(config.replace(lora_full=("value",)))
    start = init_params(0)["params"]
    chex.assert_trees_all_equal(frozen_head, start["value"])
    assert not np.allclose(head["kernel"], start["value"]["kernel"])
    assert not np.allclose(head["bias"], start["value"]["bias"])
    assert not np.allclose(frozen_hidden["kernel"], start["hidden"]["kernel"])  # adapters move
    assert np.isfinite(metrics["loss/value_avg"]).all()


def test_kl_coef_and_kl_in_change_the_advantages_or_the_loss():
    reward_kl = config_for("ppo", kl_estimator="k3", loss_aggregation="sequence")
    loss_kl = reward_kl.replace(kl_in="loss")
    prompts, mask = prompt_batch(jax.random.key(12), 4)

    def advantages_and_loss(config, beta):
        trainer = trainer_for(config)
        state = trainer.init(init_params(0), jax.random.key(0))
        state = state.replace(params={"policy": init_params(5)}, kl_coef=jnp.float32(beta))
        return batch_and_loss(config, state, prompts, mask, jax.random.key(13))[:2]

    def all_three():
        return [
            advantages_and_loss(*args)
            for args in ((reward_kl, 0.0), (reward_kl, 1.0), (loss_kl, 1.0))
        ]

    (plain, plain_loss), (in_reward, in_reward_loss), (in_loss, in_loss_loss) = jax.jit(all_three)()
    assert not np.allclose(plain.advantages, in_reward.advantages)  # -beta KL_t in r_t
    np.testing.assert_array_equal(in_loss.advantages, plain.advantages)  # not in the reward
    kl = np.asarray(
        jnp.expm1(plain.ref_log_probs - plain.log_probs) - (plain.ref_log_probs - plain.log_probs)
    )
    real = np.asarray(plain.slot_mask)
    per_sequence = (kl * real).sum(1) / real.sum(1)
    # The loss adds beta * (mean over rows of the per-row mean of k3); float32 sums of O(1).
    np.testing.assert_allclose(in_loss_loss - plain_loss, per_sequence.mean(), rtol=1e-4, atol=1e-5)
    assert per_sequence.mean() > 1e-3 and in_reward_loss != plain_loss
