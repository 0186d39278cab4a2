"""Recurrent PPO: the hidden state across steps and episode ends, sequence minibatches, runs."""

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import environment, spaces

import ppojax
from ppojax.envs import PPOEnv
from ppojax.networks import NetworkSettings, build_network, init_params, observation_template
from ppojax.networks.distributions import policy_distribution
from ppojax.ppo.loss import policy_outputs, replay_sequences
from ppojax.ppo.rollout import draw_noise, env_step, rollout_start
from ppojax.ppo.train import init_state, make_agent, make_batch, run_updates
from ppojax.ppo.types import Agent, Batch, SequenceBatch
from ppojax.ppo.update import shuffle_sequences
from ppojax.runs import Experiment, RunOptions, resume_experiment, run_experiment

RECURRENT = ppojax.PPOConfig(
    num_envs=4,
    num_steps=32,
    total_timesteps=4 * 32 * 3,
    update_epochs=2,
    num_minibatches=2,
    hidden_sizes=(16,),
    recurrent="gru",
    recurrent_size=8,
)


@struct.dataclass
class TimerState(environment.EnvState):
    time: int


@struct.dataclass
class TimerParams(environment.EnvParams):
    max_steps_in_episode: int = 100


class Timer(environment.Environment):
    """Observes its step count plus one (a zero observation would leave a zero state at
    zero); terminates after ``stop`` steps, truncates at
    ``max_steps_in_episode``: episodes end at hand-known steps."""

    def __init__(self, stop: int) -> None:
        super().__init__()
        self.stop = stop

    @property
    def default_params(self) -> TimerParams:
        return TimerParams()

    def step_env(self, key: jax.Array, state: TimerState, action: Any, params: TimerParams):
        state = TimerState(time=state.time + 1)
        obs = jnp.asarray([state.time + 1], jnp.float32)
        return obs, state, jnp.float32(1.0), state.time == self.stop, {}

    def reset_env(self, key: jax.Array, params: TimerParams):
        return jnp.ones((1,), jnp.float32), TimerState(time=jnp.int32(0))

    def action_space(self, params: TimerParams | None = None) -> spaces.Discrete:
        return spaces.Discrete(2)

    def observation_space(self, params: TimerParams) -> spaces.Box:
        return spaces.Box(0.0, 100.0, (1,), jnp.float32)


@pytest.mark.parametrize("stop, max_steps, kind", [(3, 100, "terminated"), (100, 4, "truncated")])
def test_hidden_state_resets_exactly_where_episodes_end(stop, max_steps, kind):
    config = RECURRENT.replace(num_envs=2)
    env = PPOEnv(Timer(stop), TimerParams(max_steps_in_episode=max_steps), "Timer")
    agent = Agent(env, build_network(NetworkSettings.from_fields(config), env, config.env_id))
    state = init_state(config, jax.random.key(0))  # CartPole's state; replaced below
    params = init_params(jax.random.key(1), agent.network, observation_template(env))
    obs, env_state = jax.vmap(env.reset)(jax.random.split(jax.random.key(2), 2))
    carry = rollout_start(state)._replace(env_state=env_state, obs=obs)
    step = jax.jit(functools.partial(env_step, agent, config, params))
    length = min(stop, max_steps)
    noises = jax.jit(draw_noise, static_argnums=(0, 2, 3))(agent, jax.random.key(3), 3 * length, 2)
    for t in range(3 * length):
        noise = jax.tree.map(lambda x, t=t: x[t], noises)
        before = carry.hidden
        carry, transition = step(carry, noise)
        ended = (t + 1) % length == 0  # the hand-made pattern: every ``length`` steps
        np.testing.assert_array_equal(getattr(transition, kind), [ended, ended])
        assert not (transition.terminated | transition.truncated).any() or ended
        hidden, next_hidden = np.asarray(carry.hidden), np.asarray(transition.next_hidden)
        if ended:
            np.testing.assert_array_equal(hidden, 0.0)  # the next episode starts afresh
            assert np.abs(next_hidden).min() > 0  # V(final obs) reads the state before reset
        else:
            np.testing.assert_array_equal(hidden, next_hidden)
            assert not np.array_equal(np.asarray(before), hidden)  # the state carries memory


def test_replay_resets_the_state_where_an_episode_started():
    """A hand-made reset pattern over [T=5, B=2]: replaying it equals stepping the network
    by hand, zeroing the state before the marked steps."""
    agent = make_agent(RECURRENT)
    params = init_params(jax.random.key(0), agent.network, observation_template(agent.env))
    obs = jax.random.normal(jax.random.key(1), (5, 2, 4))
    starts = jnp.asarray([[0, 0], [1, 0], [0, 0], [0, 1], [1, 1]], bool)
    hidden = jax.random.normal(jax.random.key(2), (2, 16))
    zeros = jnp.zeros((5, 2))
    data = Batch(obs, zeros, zeros, zeros, zeros, zeros, zeros, None)
    heads, _, values = replay_sequences(agent, params, SequenceBatch(data, starts, hidden))
    state = hidden
    for t in range(5):
        state = jnp.where(starts[t][:, None], 0.0, state)
        head, _, value, state = agent.network.apply(params, obs[t], state)
        # The reference runs op by op, the replay as one compiled scan whose fused tanh,
        # sigmoid and sums may round differently: a few float32 ulps (1.2e-7) of each value;
        # rtol 1e-5 allows ~80, atol 1e-8 ~40 ulps of the 1e-3-sized policy heads. A missed
        # or misplaced reset changes them at the 1e-1 relative level.
        np.testing.assert_allclose(heads[t], head, rtol=1e-5, atol=1e-8)
        np.testing.assert_allclose(values[t], value, rtol=1e-5, atol=1e-8)


def test_replaying_the_first_minibatch_reproduces_the_rollout_exactly():
    """The first minibatch's sequences replayed from the stored hidden state give the
    rollout's own log-probabilities and values: the ratio is exactly 1."""
    config = RECURRENT
    agent = make_agent(config)
    state = init_state(config, jax.random.key(0))
    state, _ = jax.jit(run_updates, static_argnums=(0, 2))(config, state, 1)
    assert np.abs(np.asarray(state.hidden)).max() > 0  # a rollout that starts mid-memory

    @jax.jit
    def first_minibatch(state):
        from ppojax.ppo.rollout import collect_rollout

        _, transitions = collect_rollout(agent, config, state.params, rollout_start(state))
        batch = make_batch(agent, config, state.params, transitions, state.hidden)
        minibatch = jax.tree.map(lambda x: x[0], shuffle_sequences(state.key, batch, 2))
        samples, head, log_std, values = policy_outputs(agent, state.params, minibatch)
        distribution = policy_distribution(agent.env.spec, head, log_std)
        return minibatch, samples, distribution.log_prob(samples.action), values

    minibatch, samples, log_prob, values = first_minibatch(state)
    assert minibatch.starts.shape == (config.num_steps, 2) and minibatch.starts.any()
    np.testing.assert_array_equal(np.exp(log_prob - samples.log_prob), 1.0)
    np.testing.assert_array_equal(log_prob, samples.log_prob)
    np.testing.assert_array_equal(values, samples.value)


def test_sequence_minibatches_shuffle_whole_envs():
    t, b = 3, 4
    steps = jnp.arange(t)[:, None] * 10 + jnp.arange(b)[None, :]  # 10 t + env
    data = Batch(steps, steps, steps, steps, steps, steps, steps, None)
    hidden = jnp.arange(b)[:, None] * jnp.ones((1, 5))
    batch = SequenceBatch(data, jnp.zeros((t, b), bool), hidden)
    mini = shuffle_sequences(jax.random.key(0), batch, 2)
    assert mini.data.obs.shape == (2, t, 2) and mini.hidden.shape == (2, 2, 5)
    envs = np.asarray(mini.data.obs[:, 0, :])  # each minibatch's envs, read at t = 0
    assert sorted(envs.ravel()) == list(range(b)) and envs.ravel().tolist() != list(range(b))
    for m in range(2):
        for j in range(2):
            env = envs[m, j]
            np.testing.assert_array_equal(mini.data.obs[m, :, j], np.arange(t) * 10 + env)
            np.testing.assert_array_equal(mini.hidden[m, j], env)


@pytest.mark.heavy
def test_recurrent_runs_vmapped_over_seeds_equal_separate_runs():
    keys = jax.random.split(jax.random.key(0), 2)
    batched = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))(RECURRENT, keys)
    single = jax.jit(ppojax.train)
    for i in range(2):
        one = single(RECURRENT, keys[i])
        # Different programs (batched against single matmuls) may sum in other orders: the
        # metrics are means of order-1 terms, so they differ by a few float32 ulps of 1
        # (1.2e-7); atol 1e-6 allows ~8, rtol 2e-5 covers value losses and returns of 10-100.
        for name in ppojax.METRIC_NAMES:
            np.testing.assert_allclose(
                batched.metrics[name][i], one.metrics[name], rtol=2e-5, atol=1e-6, err_msg=name
            )
        np.testing.assert_allclose(batched.state.hidden[i], one.state.hidden, rtol=2e-5, atol=1e-6)


@pytest.mark.heavy
def test_a_recurrent_run_resumes_bit_exactly(tmp_path, monkeypatch):
    """Interrupted in its second chunk (checkpoint at update 1) and resumed, a recurrent
    run ends exactly where the same run without the interruption ends: the hidden state is in
    the checkpoint."""
    from ppojax.runs import folder

    config = RECURRENT.replace(num_steps=8, total_timesteps=4 * 8 * 3, update_epochs=1)
    options = RunOptions(progress=False, checkpoint_every=1)
    whole = run_experiment(Experiment(config, seeds=2), tmp_path / "whole", options)
    real_append = folder.append_metrics
    chunks = []

    def append_then_interrupt(*args):
        chunks.append(args)
        real_append(*args)
        if len(chunks) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(folder, "append_metrics", append_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(Experiment(config, seeds=2), tmp_path / "cut", options)
    monkeypatch.setattr(folder, "append_metrics", real_append)
    resumed = resume_experiment(tmp_path / "cut")
    assert resumed.resumed_from == 1
    assert np.abs(np.asarray(whole.state.hidden)).max() > 0
    for want, have in zip(
        jax.tree.leaves(whole.state), jax.tree.leaves(resumed.state), strict=True
    ):
        if jax.dtypes.issubdtype(want.dtype, jax.dtypes.prng_key):
            want, have = jax.random.key_data(want), jax.random.key_data(have)
        np.testing.assert_array_equal(np.asarray(want), np.asarray(have))
    for name in ppojax.METRIC_NAMES:
        np.testing.assert_array_equal(whole.metrics[name], resumed.metrics[name], err_msg=name)


@pytest.mark.parametrize("core, shared, width", [("lstm", False, 4 * 8), ("gru", True, 8)])
def test_lstm_and_a_shared_torso_train_with_their_hidden_widths(core, shared, width):
    config = RECURRENT.replace(recurrent=core, shared_torso=shared, num_steps=8)
    config = config.replace(total_timesteps=4 * 8 * 2, update_epochs=1)
    out = jax.jit(ppojax.train)(config, jax.random.key(0))
    assert out.state.hidden.shape == (4, width)
    assert np.isfinite(out.metrics["policy_loss"]).all()
    names = set(out.state.params["params"])
    torsos = {"torso"} if shared else {"actor_torso", "critic_torso"}
    assert names == torsos | {"actor_head", "critic_head"}
