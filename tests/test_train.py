import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerance import TRAINING_ULPS, assert_close, assert_trees_close, assert_trees_equal

import ppojax


def test_metrics_have_every_name_and_one_row_per_update(tiny_config, tiny_train):
    out = tiny_train(tiny_config, jax.random.key(0))
    assert set(out.metrics) == set(ppojax.METRIC_NAMES)
    for name, values in out.metrics.items():
        chex.assert_shape(values, (tiny_config.num_updates,))
        if name in ("kl", "penalty_kl"):  # PPO-Clip computes no analytic KL
            assert np.isnan(values).all(), name
        elif name not in ("episode_return", "episode_length"):  # NaN where no episode ended
            assert np.isfinite(values).all(), name
    np.testing.assert_array_equal(
        out.metrics["env_steps"], np.arange(1, 4) * tiny_config.batch_size
    )
    assert int(out.state.update_step) == tiny_config.num_updates
    assert int(out.state.env_steps) == tiny_config.num_updates * tiny_config.batch_size


def test_same_key_gives_identical_output(tiny_config, tiny_train):
    first = tiny_train(tiny_config, jax.random.key(7))
    second = tiny_train(tiny_config, jax.random.key(7))
    assert_trees_equal(first, second)  # one executable run twice: every bit
    other = tiny_train(tiny_config, jax.random.key(8))
    assert not np.array_equal(first.metrics["policy_loss"], other.metrics["policy_loss"])


def test_old_style_uint32_keys_give_the_same_run_as_typed_keys(tiny_config, tiny_train):
    typed = tiny_train(tiny_config, jax.random.key(7))
    raw = tiny_train(tiny_config, jax.random.PRNGKey(7))
    assert jnp.issubdtype(raw.state.key.dtype, jax.dtypes.prng_key)
    # Compiled twice, but the raw key is wrapped at the entry into the same uint32 data and
    # every float op after it is the same program: bit-exact.
    assert_trees_equal(typed, raw)


def test_a_diverging_run_skips_its_steps_and_leaves_the_runs_beside_it_alone(tiny_config):
    """A learning rate of 1e30 drives one run's value loss to inf: the guard skips its steps
    and its parameters stay finite, while the run vmapped beside it is bit for bit the same as
    beside a healthy twin (one compiled program for both sweeps)."""
    keys = jax.random.split(jax.random.key(0), 2)
    guarded = tiny_config.replace(divergence_guard=True)
    healthy = ppojax.sweep(guarded, keys, learning_rate=[2.5e-4, 2.5e-4])
    mixed = ppojax.sweep(guarded, keys, learning_rate=[2.5e-4, 1e30])
    assert_trees_equal(
        jax.tree.map(lambda leaf: leaf[0], (healthy.state, healthy.metrics)),
        jax.tree.map(lambda leaf: leaf[0], (mixed.state, mixed.metrics)),
    )
    assert not np.asarray(healthy.metrics["nonfinite_steps"]).any()
    skipped = np.asarray(mixed.metrics["nonfinite_steps"][1])  # [seeds, updates]
    steps = guarded.update_epochs * guarded.num_minibatches
    assert (skipped[:, 1:] == steps).all() and (skipped[:, 0] > 0).all()
    for leaf in jax.tree.leaves((mixed.state.params, mixed.state.opt_state)):
        assert np.isfinite(np.asarray(leaf)).all()


def test_without_the_guard_a_diverging_run_ends_in_nan_and_counts_its_steps(tiny_config):
    """PPOConfig's default: the classic program applies the 1e30 step, so the run's parameters
    become NaN (and ``nonfinite_steps`` says from when), while the healthy run is untouched."""
    assert not tiny_config.divergence_guard
    keys = jax.random.split(jax.random.key(0), 1)
    out = ppojax.sweep(tiny_config, keys, learning_rate=[2.5e-4, 1e30])
    params = jax.tree.leaves(out.state.params)
    assert all(np.isfinite(np.asarray(leaf[0])).all() for leaf in params)
    assert not all(np.isfinite(np.asarray(leaf[1])).all() for leaf in params)
    counts = np.asarray(out.metrics["nonfinite_steps"])  # [points, seeds, updates]
    assert not counts[0].any() and counts[1, :, -1].all()


def test_vmap_over_seeds_equals_separate_runs(tiny_config, tiny_train):
    keys = jax.random.split(jax.random.key(0), 4)
    batched = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))(tiny_config, keys)
    # Two programs (batched and not) that reduce in other orders: the metrics are means of
    # per-sample terms of order 1 (normalized advantages, ratios near 1, log-probs) or larger
    # (returns, value losses: the relative part covers them), the parameters are of order 1.
    for i in range(4):
        single = tiny_train(tiny_config, keys[i])
        for name in ppojax.METRIC_NAMES:
            assert_close(
                batched.metrics[name][i], single.metrics[name], ulps=TRAINING_ULPS, err_msg=name
            )
        own = jax.tree.map(lambda leaf, i=i: leaf[i], batched.state.params)
        assert_trees_close(own, single.state.params, ulps=TRAINING_ULPS)


def test_train_traces_once_for_new_keys_and_hyperparameter_values(tiny_config):
    traced = jax.jit(chex.assert_max_traces(ppojax.train, n=1))
    traced(tiny_config, jax.random.key(0))
    traced(tiny_config, jax.random.key(1))
    traced(tiny_config.replace(learning_rate=1e-3, clip_eps=0.1, gamma=0.9), jax.random.key(2))
    chex.clear_trace_counter()


def test_hyperparameters_are_traced_and_change_the_result(tiny_config, tiny_train):
    base = tiny_train(tiny_config, jax.random.key(0))
    faster = tiny_train(tiny_config.replace(learning_rate=1e-2), jax.random.key(0))
    assert not np.allclose(base.metrics["policy_loss"][1:], faster.metrics["policy_loss"][1:])


def test_old_style_uint32_keys_work(tiny_config, tiny_train):
    out = tiny_train(tiny_config, jax.random.PRNGKey(0))
    assert np.isfinite(out.metrics["value_loss"]).all()


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "Acrobot-v1", "Breakout-MinAtar"])
def test_trains_on_other_action_and_observation_spaces(env_id):
    config = ppojax.PPOConfig(
        env_id=env_id,
        num_envs=2,
        num_steps=8,
        total_timesteps=32,
        update_epochs=1,
        num_minibatches=2,
        hidden_sizes=(16,),
    )
    out = jax.jit(ppojax.train)(config, jax.random.key(0))
    assert np.isfinite(out.metrics["policy_loss"]).all()
    assert np.isfinite(out.metrics["entropy"]).all()


def test_learning_rate_metric_follows_the_annealing(tiny_config, tiny_train):
    out = tiny_train(tiny_config, jax.random.key(0))
    steps_per_update = tiny_config.update_epochs * tiny_config.num_minibatches
    expected = [
        tiny_config.learning_rate * (1 - u * steps_per_update / tiny_config.num_gradient_steps)
        for u in range(tiny_config.num_updates)
    ]
    # float32 arithmetic on values of order learning_rate, none near zero: 8 ulps of each.
    np.testing.assert_allclose(out.metrics["learning_rate"], expected, rtol=1e-6)


def test_training_in_chunks_equals_one_call(tiny_config, tiny_train):
    whole = tiny_train(tiny_config, jax.random.key(3))
    chunk = jax.jit(ppojax.run_updates, static_argnums=2)
    state = ppojax.init_state(tiny_config, jax.random.key(3))
    state, first = chunk(tiny_config, state, 1)
    state, rest = chunk(tiny_config, state, 2)
    # Three programs (scans of 1, 2 and 3 updates) around one update body; they agree bit for
    # bit on this machine, but XLA may fuse a loop body differently for another trip count, so
    # the check allows float32 rounding of terms of order 1 (see the vmap test above).
    for name in ppojax.METRIC_NAMES:
        assert_close(
            np.concatenate([first[name], rest[name]]),
            whole.metrics[name],
            ulps=TRAINING_ULPS,
            err_msg=name,
        )
    assert_trees_close(state.params, whole.state.params, ulps=TRAINING_ULPS)


def test_penalty_coefficient_follows_the_adaptive_rule_during_training(tiny_config, tiny_train):
    config = tiny_config.replace(policy_objective="penalty", penalty_target=0.001)
    out = tiny_train(config, jax.random.key(0))
    beta, kl = np.asarray(out.metrics["kl_coef"]), np.asarray(out.metrics["kl"])
    assert np.isfinite(kl).all() and np.isfinite(out.metrics["penalty_kl"]).all()
    assert beta[0] == config.penalty_coef
    for u in range(len(beta) - 1):
        expected = ppojax.adaptive_kl_update(beta[u], kl[u], config.penalty_target)
        np.testing.assert_allclose(beta[u + 1], expected, rtol=1e-6)
    np.testing.assert_allclose(
        out.state.kl_coef, ppojax.adaptive_kl_update(beta[-1], kl[-1], 0.001), rtol=1e-6
    )
    fixed = tiny_train(config.replace(adaptive_penalty=False), jax.random.key(0))
    assert (np.asarray(fixed.metrics["kl_coef"]) == config.penalty_coef).all()
    clip = tiny_train(tiny_config, jax.random.key(0))
    assert (np.asarray(clip.metrics["kl_coef"]) == tiny_config.penalty_coef).all()


def test_entropy_bonus_keeps_the_policy_more_random():
    config = ppojax.PPOConfig(
        num_envs=4,
        num_steps=32,
        total_timesteps=4 * 32 * 20,
        learning_rate=3e-3,
        anneal_lr=False,
        hidden_sizes=(16,),
    )
    run = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))
    keys = jax.random.split(jax.random.key(0), 4)
    # entropy of the last 5 updates, per seed
    without = run(config.replace(ent_coef=0.0), keys).metrics["entropy"][:, -5:].mean(1)
    strong = run(config.replace(ent_coef=0.5), keys).metrics["entropy"][:, -5:].mean(1)
    assert (strong > without).all()
    # the strong bonus holds the two-action policy near its maximum entropy, log 2
    np.testing.assert_allclose(strong, np.log(2), rtol=0.1)


def test_switching_off_advantage_normalization_changes_the_policy_loss(tiny_config, tiny_train):
    normalized = tiny_train(tiny_config, jax.random.key(0))
    raw = jax.jit(ppojax.train)(tiny_config.replace(normalize_advantages=False), jax.random.key(0))
    assert not np.allclose(normalized.metrics["policy_loss"], raw.metrics["policy_loss"])
    # The rollouts before the first update are the same, computed by two programs: the
    # explained variance, 1 - var(targets - values) / var(targets), is a ratio of means of
    # terms of order 1 and may lie near zero for a fresh critic, so ulps of 1.
    assert_close(
        normalized.metrics["explained_variance"][0],
        raw.metrics["explained_variance"][0],
        ulps=TRAINING_ULPS,
    )
