"""Evaluation inside the compiled loop (PPOConfig.eval_every) and its equality with
``ppojax eval``."""

import functools

import jax
import numpy as np
import pytest

import ppojax
from ppojax.ppo.config import ConfigError
from ppojax.ppo.evaluation import EVAL_METRIC_NAMES, eval_key
from ppojax.ppo.train import init_state, make_agent, update_step
from ppojax.ppo.update import make_optimizer
from ppojax.runs.loop import ProgressBar
from ppojax.runs.policy import evaluate, make_act
from ppojax.runs.progress import BAR_METRICS, TensorBoardLog


def assert_trees_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.fixture(scope="module")
def config(tiny_config):
    """Four updates with an evaluation after the 3rd (a multiple of eval_every) and the 4th
    (the last), of 3 sampled episodes."""
    return tiny_config.replace(
        total_timesteps=4 * tiny_config.batch_size,
        normalize_observations=True,
        eval_every=3,
        eval_episodes=3,
        eval_deterministic=False,
    )


@pytest.fixture(scope="module")
def evaluated(config):
    return jax.jit(ppojax.train)(config, jax.random.key(0))


def test_evaluation_metrics_are_nan_between_evaluations(config, evaluated):
    assert set(evaluated.metrics) == set(ppojax.METRIC_NAMES) | set(EVAL_METRIC_NAMES)
    for name in EVAL_METRIC_NAMES:
        values = np.asarray(evaluated.metrics[name])
        assert values.shape == (config.num_updates,)
        assert np.isnan(values[:2]).all() and np.isfinite(values[2:]).all(), name
    # CartPole's episodes last at least 8 steps, each worth a reward of 1
    assert (np.asarray(evaluated.metrics["eval_return"])[2:] >= 8).all()


def test_in_loop_evaluation_equals_ppojax_eval_of_the_same_params_and_key(config, evaluated):
    """The evaluation after the last update is ``evaluate`` (what ``ppojax eval`` runs) of the
    final state's policy, its frozen observation statistics and ``eval_key(state.key)``.

    The two are differently compiled programs, but CartPole's actions are discrete and its
    rewards 1: a last-bit difference in the logits could change a return only by flipping an
    action at an exact tie, so returns and lengths are equal integers. Their mean over 3
    episodes is the same float32 sum divided by 3, within one float32 ulp (rtol 1e-6)."""
    state = evaluated.state
    assert float(state.obs_stats.count) > 0
    act = make_act(config, state)
    returns = evaluate(config, act, config.eval_episodes, key=eval_key(state.key))
    np.testing.assert_allclose(evaluated.metrics["eval_return"][-1], returns.mean(), rtol=1e-6)
    deterministic = evaluate(config, act, 3, key=eval_key(state.key), deterministic=True)
    assert not np.array_equal(returns, deterministic)  # the sampled policy was evaluated


def test_a_recurrent_policy_is_evaluated_with_its_hidden_state_in_the_loop_and_by_eval(config):
    """The evaluation carries a GRU's state (zeros at each episode's start) inside the loop and
    in ``evaluate``; the same reasoning as above gives equal integer returns."""
    recurrent = config.replace(recurrent="gru", recurrent_size=8, num_minibatches=2)
    out = jax.jit(ppojax.train)(recurrent, jax.random.key(1))
    act = make_act(recurrent, out.state)
    returns = evaluate(recurrent, act, recurrent.eval_episodes, key=eval_key(out.state.key))
    np.testing.assert_allclose(out.metrics["eval_return"][-1], returns.mean(), rtol=1e-6)


def todays_updates(config, state, num_updates):
    """The training loop without any evaluation hook: a scan of ``update_step``."""
    step = functools.partial(update_step, make_agent(config), make_optimizer(config), config)
    return jax.lax.scan(lambda carry, _: step(carry), state, None, num_updates)


def todays_train(config, key):
    return todays_updates(config, init_state(config, key), config.num_updates)


@pytest.fixture(scope="module")
def plain(config):
    return jax.jit(ppojax.train)(config.replace(eval_every=None), jax.random.key(0))


def test_eval_every_none_compiles_exactly_the_loop_without_evaluation(config, plain):
    """No evaluation: the updates are op for op the scan of update_step, so the final state
    of train is bit for bit that of init_state and the loop without the hook."""
    config = config.replace(eval_every=None)
    state = init_state(config, jax.random.key(0))
    ours = jax.make_jaxpr(ppojax.run_updates, static_argnums=2)(config, state, 4)
    reference = jax.make_jaxpr(todays_updates, static_argnums=2)(config, state, 4)
    assert str(ours) == str(reference)
    assert set(plain.metrics) == set(ppojax.METRIC_NAMES)
    final, metrics = jax.jit(todays_train)(config, jax.random.key(0))
    assert_trees_equal((plain.state, plain.metrics), (final, metrics))


def test_evaluation_leaves_training_and_its_keys_unchanged(plain, evaluated):
    """With evaluation the update steps are the same ops fed the same keys: the keys are
    bit-equal (integer PRNG arithmetic); parameters, of scale ~1, may differ in their last
    bits only through how XLA fuses the other program (float32 eps 1.2e-7, a few ulps of
    accumulation over 16 steps: rtol 1e-5, atol 1e-6)."""
    assert_trees_equal(plain.state.key, evaluated.state.key)
    for x, y in zip(
        jax.tree.leaves(plain.state.params), jax.tree.leaves(evaluated.state.params), strict=True
    ):
        np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        plain.metrics["policy_loss"], evaluated.metrics["policy_loss"], rtol=1e-5, atol=1e-6
    )


def primitive_paths(jaxpr, path=()):
    """(primitive name, names of the primitives it is nested in) for every equation."""
    for eqn in jaxpr.eqns:
        yield eqn.primitive.name, path
        for value in eqn.params.values():
            for sub in value if isinstance(value, (tuple, list)) else (value,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    yield from primitive_paths(inner, path + (eqn.primitive.name,))


def test_under_vmap_over_seeds_the_evaluation_stays_behind_a_cond(config):
    """vmap turns a lax.cond with a batched predicate into a select that runs both branches
    every update; the predicate must stay unbatched so that updates without evaluation skip
    the episode loop, in vmap(train) as in the experiment's vmap over runs."""
    keys = jax.random.split(jax.random.key(0), 2)
    jaxpr = jax.make_jaxpr(jax.vmap(ppojax.train, in_axes=(None, 0)))(config, keys).jaxpr
    loops = [path for name, path in primitive_paths(jaxpr) if name == "while"]
    assert loops and all("cond" in path for path in loops)
    plain = jax.make_jaxpr(jax.vmap(ppojax.train, in_axes=(None, 0)))(
        config.replace(eval_every=None), keys
    )
    assert not [name for name, _ in primitive_paths(plain.jaxpr) if name == "while"]


def test_vmapped_evaluation_equals_separate_runs(config, evaluated):
    """Same tolerance as the vmap test of train: one program batched, the other not."""
    keys = jax.random.split(jax.random.key(0), 2)
    batched = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))(config, keys)
    single = jax.jit(ppojax.train)(config, keys[1])
    for name in EVAL_METRIC_NAMES:
        np.testing.assert_allclose(
            batched.metrics[name][1], single.metrics[name], rtol=2e-5, atol=1e-6, err_msg=name
        )


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"eval_every": 0}, "eval_every", "positive int .* or None"),
        ({"eval_every": 2.0}, "eval_every", "positive int"),
        ({"eval_every": True}, "eval_every", "positive int"),
        ({"eval_episodes": 0}, "eval_episodes", "positive int"),
        ({"eval_deterministic": "yes"}, "eval_deterministic", "True or False"),
    ],
)
def test_bad_evaluation_settings_name_the_field(tiny_config, changes, field, message):
    with pytest.raises(ConfigError, match=message) as error:
        tiny_config.replace(**changes)
    assert error.value.field == field


def test_progress_bar_shows_the_latest_evaluation_return():
    bar = ProgressBar(4, 0, BAR_METRICS, scale=10, description="x")
    bar.open()
    nan = np.array([np.nan, np.nan])
    bar.report(np.int32(1), {"episode_return": np.array([20.0, 22.0]), "eval_return": nan})
    assert bar.bar.postfix == "return 21.0"
    bar.report(np.int32(2), {"episode_return": np.array([24.0, 26.0]), "eval_return": [100, 200]})
    chunk = {"episode_return": np.array([[30.0], [np.nan]]), "eval_return": nan[:, None]}
    bar(2, None, {**chunk, "episode_length": np.array([[12.0], [14.0]])})
    assert bar.bar.postfix == "return 30.0, eval 150.0, length 13.0"
    assert bar.bar.n == 3 * 10
    bar.close()


class RecordingWriter:
    def __init__(self):
        self.scalars = []

    def add_scalar(self, name, value, step):
        self.scalars.append((name, value, step))


def test_tensorboard_leaves_out_the_updates_without_an_evaluation(tmp_path):
    pytest.importorskip("tensorboardX")
    log = TensorBoardLog(tmp_path, [{"run": 0, "seed": 0}])
    log.close()
    log.writers = [RecordingWriter()]
    metrics = {
        "episode_return": np.array([[np.nan, 12.0, 14.0]]),
        "eval_return": np.array([[np.nan, 30.0, np.nan]]),
    }
    log.write(4, metrics, batch_size=8)
    scalars = log.writers[0].scalars
    assert [entry for entry in scalars if entry[0] == "eval_return"] == [("eval_return", 30.0, 48)]
    # a training metric keeps its NaN (no episode ended), as before
    assert [step for name, _, step in scalars if name == "episode_return"] == [40, 48, 56]
