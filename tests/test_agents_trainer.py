"""The one LM trainer: a one-turn env (``OneTurnEnv``) run through ``make_episode_trainer``
gives ``make_trainer``'s new state and metrics on the prompts it drew, bit for bit (GRPO; PPO
with a critic and its warm-up); a group's prompt read once in every rollout; a cache hook
without ``extend``; LoRA and the adaptive KL controller on multi-turn episodes; the slots the
update reads, by hand; the KV cache across turns against recomputing the context, logit by
logit."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.rlhf import RLHFConfig, make_trainer
from ppojax.rlhf.core.context import cached_context
from ppojax.rlhf.core.credit import model_slots
from ppojax.rlhf.core.episode_trainer import make_episode_trainer
from ppojax.rlhf.core.episodes import (
    EpisodeLayout,
    EpisodeSettings,
    previous_real,
    rollout_episodes,
)
from ppojax.rlhf.core.host_rollout import HostRollout
from ppojax.rlhf.core.lora import merge
from ppojax.rlhf.core.prompts import play_prompts
from ppojax.rlhf.core.turns import rollout_keys
from ppojax.rlhf.core.update import EpisodeBatch, slot_stats
from ppojax.rlhf.envs import calculator as c
from ppojax.rlhf.envs import guessing as g
from ppojax.rlhf.envs.one_turn import OneTurnEnv
from ppojax.rlhf.models.transformer import transformer

VOCAB, PROMPT, RESPONSE = 12, 3, 4
POOL = jnp.array([[0, 3, 4], [5, 6, 8], [0, 0, 9]])  # left-padded with pad_id 0


def token_sum(prompts, prompt_mask, responses, response_mask):
    """A reward that differs between responses: the mean response token id / 64."""
    return (responses * response_mask).sum(axis=1) / 64.0


def tiny_lm(length):
    lm = transformer(VOCAB, length, d_model=16, num_heads=2, num_layers=1)

    # plain functions: both trainers read the full logits (no chunked scoring)
    def policy_apply(params, tokens, mask):
        return lm.policy_apply(params, tokens, mask)

    def critic_apply(params, tokens, mask):
        return lm.critic_apply(params, tokens, mask)

    return lm, policy_apply, critic_apply


def differences(a, b):
    """The paths of the leaves of two pytrees that are not bit-identical."""
    return [
        jax.tree_util.keystr(path)
        for (path, x), y in zip(
            jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True
        )
        if not np.array_equal(x, y)
    ]


def both_trainers(config, num_episodes, critic=False, steps=2):
    """``steps`` steps of make_trainer and of the episode trainer on OneTurnEnv (max_turns 1),
    with the same config, params, keys and the prompts the env draws; the states and metrics
    of each step, side by side."""
    lm, policy_apply, critic_apply = tiny_lm(PROMPT + RESPONSE)
    env = OneTurnEnv(POOL, POOL != 0, token_sum)
    kwargs = {"critic_apply": critic_apply} if critic else {}
    one_turn = make_trainer(config, policy_apply, [token_sum], **kwargs)
    episodes = make_episode_trainer(config, policy_apply, env, num_episodes, 1, **kwargs)
    params = lm.init(jax.random.key(0))
    critic_params = lm.init(jax.random.key(5)) if critic else None
    states = [
        trainer.init(params, jax.random.key(1), critic_params) for trainer in (one_turn, episodes)
    ]
    groups = num_episodes // config.group_size

    @jax.jit
    def drawn_prompts(key):
        # the prompts the episode step's rollout draws: its sample key's reset keys
        _, resets = rollout_keys(jax.random.split(key)[0], 1, RESPONSE, groups)
        return jax.vmap(env.reset)(resets)[1]

    step_one, step_episodes = jax.jit(one_turn.step), jax.jit(episodes.step)
    history = []
    for index in range(steps):
        key = jax.random.key(10 + index)
        prompts = drawn_prompts(key)
        first, first_metrics = step_one(states[0], prompts.tokens, prompts.mask, key)
        second, second_metrics = step_episodes(states[1], key)
        states = [first, second]
        history.append((first, first_metrics, second, second_metrics))
    return params, critic_params, history


def assert_same_step(first, first_metrics, second, second_metrics):
    assert differences(first, second) == []
    common = set(first_metrics) & set(second_metrics)
    assert {"objective/kl", "objective/entropy", "objective/kl_coef", "grad_norm"} <= common
    assert {
        "loss/policy_avg",
        "policy/approxkl_avg",
        "val/ratio",
        "objective/rlhf_reward",
    } <= common
    for name in sorted(common):
        np.testing.assert_array_equal(first_metrics[name], second_metrics[name], err_msg=name)
    np.testing.assert_array_equal(
        first_metrics["objective/scores"], second_metrics["episodes/return"]
    )
    np.testing.assert_array_equal(
        first_metrics["completions/mean_length"], second_metrics["episodes/model_tokens"]
    )


# make_trainer and a OneTurnEnv share one learn step; what differs between them (where the
# prompts come from, the reward scored per episode or in one batch) does not depend on the KL's
# placement, its estimator or chunked scoring, which tests/test_rlhf.py, test_logit_chunks.py
# and test_rlhf_memory.py check on make_trainer: GRPO's defaults and PPO's critic suffice here.
@pytest.mark.heavy
def test_one_turn_env_gives_make_trainers_critic_free_step_bit_for_bit():
    """GRPO with its defaults (beta * the k1 KL taken from the reward), two steps: the
    params, optimizer state, beta and every shared metric equal bit for bit, and the steps
    do move the policy (the second step has a non-zero KL to weigh)."""
    config = RLHFConfig(
        algorithm="grpo", group_size=2, pad_id=0, eos_id=1, response_len=RESPONSE,
        update_epochs=2, num_minibatches=2, learning_rate=1e-2,
    )  # fmt: skip
    params, _, history = both_trainers(config, 8)
    for first, first_metrics, second, second_metrics in history:
        assert_same_step(first, first_metrics, second, second_metrics)
    assert differences(history[-1][0].params["policy"], params) != []
    assert float(history[-1][1]["objective/kl"]) > 0


@pytest.mark.heavy
def test_one_turn_env_gives_make_trainers_ppo_step_bit_for_bit_through_warm_up():
    """PPO with its own critic and one warm-up step: both steps equal make_trainer's bit for
    bit; during the warm-up the policy's params stay bit-identical while the critic's move,
    after it the policy moves too."""
    config = RLHFConfig(
        algorithm="ppo", pad_id=0, eos_id=1, response_len=RESPONSE, update_epochs=2,
        num_minibatches=2, learning_rate=1e-2, gamma=0.9, gae_lambda=0.8,
        critic_warmup_steps=1,
    )  # fmt: skip
    params, critic_params, history = both_trainers(config, 8, critic=True)
    for first, first_metrics, second, second_metrics in history:
        assert_same_step(first, first_metrics, second, second_metrics)
        assert "loss/value_avg" in second_metrics and "val/explained_variance" in first_metrics
    warm, after = history[0][2], history[1][2]
    assert differences(warm.params["policy"], params) == []
    assert differences(warm.params["critic"], critic_params) != []
    assert differences(after.params["policy"], params) != []


def test_chunked_slot_stats_on_multi_turn_episodes_equal_the_full_logits():
    """Three-turn guessing episodes: the slots' log-probs, entropy and the gradient of their
    sum, scored through the LM head in chunks of 5 tokens, against the full [N, L, V] logits.
    Both are the same float32 products and sums, in chunks or at once: a tolerance of 1e-5
    on log-probs of a few nats is ~100 ulps, far above reordering and far below any real
    difference (a wrong slot moves a log-prob by ~0.1)."""
    env = g.NumberGuessing(num_values=10, max_turns=3)
    settings = EpisodeSettings(3, 3, 1.0, g.PAD, g.EOS)
    layout = EpisodeLayout(1, 3, 1, 3)
    lm = transformer(g.VOCAB_SIZE, layout.length, d_model=16, num_heads=2, num_layers=1)
    params = lm.init(jax.random.key(0))
    episodes = jax.jit(
        lambda key: rollout_episodes(lm.policy_apply, params, env, key, 8, settings)
    )(jax.random.key(4))
    slots = model_slots(episodes.model_mask, 3 * 3)
    positions = jnp.take_along_axis(previous_real(episodes.mask), slots.columns, axis=1)
    zeros = jnp.zeros(slots.mask.shape)
    batch = EpisodeBatch(
        episodes.tokens, episodes.mask, positions, slots.gather(episodes.tokens), slots.mask,
        zeros, zeros, zeros, zeros, zeros,
    )  # fmt: skip
    assert int(slots.mask.sum()) > 8 * 3  # more than one turn's tokens

    @functools.partial(jax.jit, static_argnums=1)
    def scored(params, logit_chunk):
        def total(params):
            stats = slot_stats(lm.policy_apply, params, batch, 1.0, None, logit_chunk)
            return jnp.where(batch.slot_mask, stats.log_probs, 0.0).sum(), stats

        return jax.grad(total, has_aux=True)(params)

    full_grad, full = scored(params, 0)
    chunk_grad, chunked = scored(params, 5)
    real = np.asarray(slots.mask)
    for name in ("log_probs", "entropy"):
        got, want = getattr(chunked, name), getattr(full, name)
        np.testing.assert_allclose(np.asarray(got)[real], np.asarray(want)[real], atol=1e-5)
    for got, want in zip(jax.tree.leaves(chunk_grad), jax.tree.leaves(full_grad), strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)  # sums of ~50 such terms


def test_lora_and_the_adaptive_kl_controller_on_multi_turn_episodes():
    """The guessing game, GRPO with LoRA adapters on the attention's c_attn kernels and the
    adaptive controller: only the adapters train (the base, which is the reference, stays
    bit-identical, and the merged policy moves); beta follows beta * (1 + clip(KL / target -
    1, -0.2, 0.2) * n / horizon) with n = 8 episodes, horizon 40: step 1 plays the base
    itself (KL exactly 0: beta * (1 - 0.2 * 8 / 40) = 0.05 * 0.96 = 0.048), step 2 a moved
    policy whose KL is above the tiny target (beta rises by 4%)."""
    env = g.NumberGuessing(num_values=4, max_turns=2)
    config = RLHFConfig(
        pad_id=g.PAD, eos_id=g.EOS, response_len=2, algorithm="grpo", group_size=2,
        update_epochs=1, num_minibatches=2, learning_rate=3e-2, ent_coef=0.05,
        lora_rank=2, lora_targets=("c_attn",), adaptive_kl=True, kl_target=1e-6,
        kl_horizon=40.0,
    )  # fmt: skip
    length = EpisodeLayout(1, 2, 1, 2).length
    lm = transformer(g.VOCAB_SIZE, length, d_model=16, num_heads=2, num_layers=1)
    trainer = make_episode_trainer(config, lm.policy_apply, env, 8, 2, kv_cache=lm.kv_cache)
    params = lm.init(jax.random.key(0))
    state = trainer.init(params, jax.random.key(3))
    step = jax.jit(trainer.step)
    betas, kls = [float(state.kl_coef)], []
    for index in range(2):
        state, metrics = step(state, jax.random.key(20 + index))
        betas.append(float(state.kl_coef))
        kls.append(float(metrics["objective/kl"]))
    adapters = state.params["policy"]
    assert set(adapters) and all("c_attn" in name for name in adapters)
    assert differences(state.reference, params) == []  # the base: bit-identical
    scale = config.lora_alpha / config.lora_rank
    assert differences(merge(state.reference, adapters, scale), params) != []
    assert kls[0] == 0.0 and kls[1] > 1e-6
    np.testing.assert_allclose(betas[1], 0.05 * (1 - 0.2 * 8 / 40), rtol=1e-6)
    np.testing.assert_allclose(betas[2], betas[1] * (1 + 0.2 * 8 / 40), rtol=1e-6)


def test_model_slots_by_hand():
    """Each row's model tokens, in order, at the front: columns and fill by hand, and the
    scatter back to the columns."""
    model_mask = jnp.array([[0, 1, 1, 0, 1, 0], [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0]], bool)
    slots = model_slots(model_mask, 4)
    np.testing.assert_array_equal(slots.columns, [[1, 2, 4, 0], [4, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(slots.mask, [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    values = jnp.arange(18.0).reshape(3, 6) + 1
    np.testing.assert_array_equal(slots.gather(values), [[2, 3, 5, 0], [11, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(
        slots.scatter(slots.gather(values), 6), np.where(model_mask, values, 0.0)
    )


def test_kv_cache_across_turns_gives_the_logits_of_recomputing_the_context():
    """Episodes of three turns are read again through the KV cache, a prefill and then each
    turn's response slot and reply slot as chunks (masked gaps included): at every real
    column the cached logits are those of one forward pass over the whole episode."""
    env = g.NumberGuessing(num_values=10, max_turns=3)
    settings = EpisodeSettings(3, 3, 1.0, g.PAD, g.EOS)
    layout = EpisodeLayout(1, 3, 1, 3)
    lm = transformer(g.VOCAB_SIZE, layout.length, d_model=16, num_heads=2, num_layers=1)
    params = lm.init(jax.random.key(0))

    @jax.jit
    def read(key):
        episodes = rollout_episodes(lm.policy_apply, params, env, key, 4, settings)
        full = lm.policy_apply(params, episodes.tokens, episodes.mask)
        context = cached_context(lm.kv_cache, params, layout.length)
        prompt = (episodes.tokens[:, :1], episodes.mask[:, :1])
        cache, first = context.start(type(env.reset(key)[1])(*prompt))
        chunks = []
        for start in range(1, layout.length, 3 + 1):
            for begin, width in ((start, 3), (start + 3, 1)):
                columns = slice(begin, begin + width)
                cache, logits = context.feed(
                    cache, episodes.tokens[:, columns], episodes.mask[:, columns], begin
                )
                chunks.append(logits)
        return episodes, full, first, jnp.concatenate(chunks, axis=1)

    episodes, full, first, cached = read(jax.random.key(2))
    mask = np.asarray(episodes.mask)
    assert mask[:, 1 + 3 + 1 :].any()  # a later turn was played
    # float32 sums of O(1) logits in another order (as test_agents' cache tolerance)
    np.testing.assert_allclose(first, full[:, 0], atol=2e-5)
    real = mask[:, 1:]
    np.testing.assert_allclose(np.asarray(cached)[real], np.asarray(full)[:, 1:][real], atol=2e-5)


def test_a_group_reads_its_prompt_once_and_plays_as_if_each_row_had_read_it():
    """``make_trainer``'s play (``play_prompts``), a multi-turn rollout and a Python env's
    (``HostRollout``) prefill each group's prompt once, [groups, P], and copy the state to
    the group's rows: the tokens equal those of the prompts repeated group_size times, each
    read by its own row."""
    config = RLHFConfig(algorithm="grpo", group_size=3, response_len=RESPONSE, pad_id=0, eos_id=2)
    lm = transformer(VOCAB, PROMPT + RESPONSE, d_model=16, num_heads=2, num_layers=1)
    params = lm.init(jax.random.key(0))
    prompts, mask = POOL, POOL != 0

    def both(key):
        shared = play_prompts(config, lm.kv_cache, (token_sum,), params, prompts, mask, key)
        each = play_prompts(
            config.replace(algorithm="ppo", group_size=1), lm.kv_cache, (token_sum,), params,
            jnp.repeat(prompts, 3, axis=0), jnp.repeat(mask, 3, axis=0), key,
        )  # fmt: skip
        return shared.episodes, each.episodes

    shared, each = jax.jit(both)(jax.random.key(4))
    assert shared.tokens.shape == (9, PROMPT + RESPONSE)
    np.testing.assert_array_equal(shared.tokens, each.tokens)
    np.testing.assert_array_equal(shared.model_mask, each.model_mask)
    # the log-probs of a prefill over 3 rows and over 9 differ by float32 rounding of O(1)
    # logits (XLA may block the two matmuls differently)
    np.testing.assert_allclose(shared.log_probs, each.log_probs, atol=2e-5)

    prefills = []
    counting = lm.kv_cache._replace(
        prefill=lambda p, t, m, n: prefills.append(t.shape) or lm.kv_cache.prefill(p, t, m, n)
    )
    play = functools.partial(play_prompts, config, counting, (token_sum,), params, prompts, mask)
    jax.eval_shape(play, jax.random.key(3))
    env = g.NumberGuessing(num_values=8, max_turns=2)
    layout_len = env.prompt_len + 2 * (RESPONSE + env.reply_len)
    guesser = transformer(g.VOCAB_SIZE, layout_len, d_model=16, num_heads=2, num_layers=1)
    counting_guesser = guesser.kv_cache._replace(
        prefill=lambda p, t, m, n: prefills.append(t.shape) or guesser.kv_cache.prefill(p, t, m, n)
    )
    settings = EpisodeSettings(2, RESPONSE, 1.0, 0, 2)
    jax.eval_shape(
        lambda k: rollout_episodes(
            counting_guesser, guesser.init(jax.random.key(0)), env, k, 6, settings, group_size=3
        ),
        jax.random.key(5),
    )
    calculator = c.Calculator()
    host_lm = transformer(
        c.VOCAB_SIZE, calculator.prompt_len + 2 * (RESPONSE + calculator.reply_len),
        d_model=16, num_heads=2, num_layers=1,
    )  # fmt: skip
    host_hook = host_lm.kv_cache._replace(
        prefill=lambda p, t, m, n: prefills.append(t.shape) or host_lm.kv_cache.prefill(p, t, m, n)
    )
    host = HostRollout(host_hook, calculator, 6, settings, group_size=3)
    prompt = host.reset(jax.random.split(jax.random.key(6), 2))[1]
    jax.eval_shape(host.sample_first, host_lm.init(jax.random.key(0)), prompt, jax.random.key(7))
    # [groups, P], not [rows, P]
    assert prefills == [(3, PROMPT), (2, env.prompt_len), (2, calculator.prompt_len)]


def test_make_trainer_samples_through_a_cache_hook_without_extend():
    """``KVCacheHook(prefill, decode)``, the contract ``make_trainer`` promises, plays its
    one-turn episodes a token at a time: the step equals the one through ``extend`` to float32
    rounding; an env
    that replies needs ``extend`` and says so."""
    config = RLHFConfig(
        algorithm="grpo", group_size=2, response_len=RESPONSE, pad_id=0, eos_id=2,
        update_epochs=1, num_minibatches=1,
    )  # fmt: skip
    lm = transformer(VOCAB, PROMPT + RESPONSE, d_model=16, num_heads=2, num_layers=1)
    params = lm.init(jax.random.key(0))
    decode_only = lm.kv_cache._replace(extend=None)

    def step(hook):
        trainer = make_trainer(config, lm.policy_apply, [token_sum], kv_cache=hook)
        state = trainer.init(params, jax.random.key(1))
        return trainer.step(state, POOL, POOL != 0, jax.random.key(2))

    (extended, extended_metrics), (decoded, decoded_metrics) = jax.jit(
        lambda: (step(lm.kv_cache), step(decode_only))
    )()
    # the same tokens (the logits of decode and extend agree to float32 rounding, and no two
    # tokens tie at it here), so both learn steps read the same batch; they are two fused
    # copies of one computation, so allow float32 rounding: params and metrics are O(1) (ulp
    # ~1e-7), and Adam's normalized step at lr 1e-4 moves a rounding difference of the
    # gradients by far less than 1e-6
    close = functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-6)
    jax.tree.map(close, extended, decoded)
    for name in extended_metrics:
        close(extended_metrics[name], decoded_metrics[name], err_msg=name)
    settings = EpisodeSettings(2, RESPONSE, 1.0, 0, 2)
    env = g.NumberGuessing(num_values=8, max_turns=2)
    guesser = transformer(g.VOCAB_SIZE, 16, d_model=16, num_heads=2, num_layers=1)
    hook = guesser.kv_cache._replace(extend=None)
    with pytest.raises(ValueError, match="need KVCacheHook.extend"):
        jax.eval_shape(
            lambda k: rollout_episodes(hook, guesser.init(k), env, k, 2, settings),
            jax.random.key(0),
        )
