"""Trained policies from run folders: ``load``, evaluation episodes, and GIFs of an episode."""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.envs import PPOEnv, make_env
from ppojax.networks import initial_hidden, observation_template
from ppojax.ppo import rollout
from ppojax.ppo.config import PPOConfig
from ppojax.ppo.evaluation import (
    Act,
    EvalCarry,
    eval_start,
    eval_step,
    max_episode_steps,
    run_episodes,
)
from ppojax.ppo.train import make_agent
from ppojax.ppo.types import Agent, TrainState
from ppojax.runs import checkpoints
from ppojax.runs.experiment import read_experiment, run_table, state_template

# The env ids gymnax.visualize.Visualizer draws (gymnax 1.x).
RENDERABLE_ENVS = (
    "Acrobot-v1",
    "CartPole-v1",
    "Pendulum-v1",
    "MountainCar-v0",
    "MountainCarContinuous-v0",
    "Catch-bsuite",
    "Asterix-MinAtar",
    "Breakout-MinAtar",
    "Freeway-MinAtar",
    "Seaquest-MinAtar",
    "SpaceInvaders-MinAtar",
    "Pong-misc",
    "PointRobot-misc",
    "MetaMaze-misc",
    "FourRooms-misc",
)

# The classic-control ones among them, which gymnax draws with gymnasium and pygame.
PYGAME_ENVS = RENDERABLE_ENVS[:5]

# What ``load`` gives: ``act(obs, key=None, deterministic=False, action_mask=None) -> action``,
# or for a recurrent policy ``act(obs, hidden, key=None, ...) -> (action, hidden)``.
LoadedAct = Callable[..., Any]


def load(run_dir: str | Path, run: int = 0, step: int | None = None) -> tuple[PPOConfig, LoadedAct]:
    """The config of run ``run`` of a run folder and its policy ``act(obs, key=None,
    deterministic=False, action_mask=None) -> action``, from the latest checkpoint (or the one
    at ``step``); for envs with action masks pass the allowed actions (bool [..., n]).

    ``obs`` is one raw observation (the env's shape, e.g. [4] or [10, 10, 4]) or a batch
    [N, ...] of them (NumPy or JAX); ``key`` (a ``jax.random.key``) is needed unless
    ``deterministic``. ``act`` is jitted and can also be called inside other jitted functions.
    Continuous actions come as the policy gives them; ``ppojax.make_env`` clips them to the
    action bounds, as in training.

    A recurrent policy's ``act`` takes and returns its hidden state:
    ``action, hidden = act(obs, hidden, key=None, deterministic=False)``, with ``hidden=None``
    for the start of an episode ([S] for one observation, [N, S] for a batch). Where an
    episode ends, start the next one from ``None`` (one env) or zero those rows
    (``ppojax.networks.reset_hidden(hidden, done)``), as training does.
    """
    experiment, _ = read_experiment(Path(run_dir))
    runs = run_table(experiment)
    if not 0 <= run < len(runs):
        raise ValueError(f"run must lie in [0, {len(runs) - 1}] for {run_dir}, got {run}")
    state, _ = checkpoints.restore_checkpoint(Path(run_dir), state_template(experiment), step)
    point = {name: runs[run][name] for name in experiment.grid}
    config = experiment.config.replace(**point)
    return config, make_act(config, jax.tree.map(lambda leaf: leaf[run], state))


def make_act(config: PPOConfig, state: TrainState) -> LoadedAct:
    """The policy of one (unbatched) TrainState as ``act(obs, key=None, deterministic=False)``
    or, recurrent, ``act(obs, hidden, key=None, deterministic=False) -> (action, hidden)``."""
    policy = _act if config.recurrent is not None else _feed_forward_act
    core = jax.jit(
        functools.partial(policy, make_agent(config), config), static_argnames=("deterministic",)
    )
    return functools.partial(core, state)


def _feed_forward_act(
    agent: Agent,
    config: PPOConfig,
    state: TrainState,
    obs: Any,
    key: jax.Array | None = None,
    deterministic: bool = False,
    action_mask: jax.Array | None = None,
) -> jax.Array:
    """``_act`` of a policy without hidden state: the action alone."""
    return _act(agent, config, state, obs, None, key, deterministic, action_mask)[0]


def _act(
    agent: Agent,
    config: PPOConfig,
    state: TrainState,
    obs: Any,
    hidden: jax.Array | None = None,
    key: jax.Array | None = None,
    deterministic: bool = False,
    action_mask: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array | None]:
    """The sampled action, or the mode of the policy when ``deterministic``, and the new hidden
    state; observations are normalized with the statistics frozen in the checkpoint, as in
    training. One observation (no batch axis) gets one action and a hidden state [S]."""
    if key is None and not deterministic:
        raise ValueError("act needs a key to sample an action, or deterministic=True")
    obs = jax.tree.map(lambda leaf: jnp.asarray(leaf, jnp.float32), obs)
    template = jax.tree.leaves(observation_template(agent.env))[0]
    single = jax.tree.leaves(obs)[0].ndim == template.ndim
    if single:
        obs = jax.tree.map(lambda leaf: leaf[None], obs)
        hidden = None if hidden is None else jnp.asarray(hidden)[None]
        action_mask = None if action_mask is None else jnp.asarray(action_mask)[None]
    if hidden is None:
        hidden = initial_hidden(agent.network, jax.tree.leaves(obs)[0].shape[0])
    action, hidden = rollout.act(
        agent, config, state.params, state.obs_stats, obs, hidden, key, deterministic, action_mask
    )
    if single:
        return action[0], None if hidden is None else hidden[0]
    return action, hidden


def evaluation_act(config: PPOConfig, act: LoadedAct) -> Act:
    """``load``'s ``act`` in the form evaluation steps a policy with, ``act(obs, hidden, key,
    ...) -> (action, hidden)`` (``ppojax.ppo.evaluation.Act``): a feed-forward policy's
    ``act(obs, key, ...) -> action`` takes and gives back the hidden state None."""
    if config.recurrent is not None:
        return act

    def feed_forward(obs: Any, hidden: None, key: jax.Array, **options: Any) -> tuple[Any, None]:
        return act(obs, key, **options), hidden

    return feed_forward


def episode_frames(
    env: PPOEnv,
    act: Act,
    key: jax.Array,
    deterministic: bool,
    hidden: jax.Array | None = None,
) -> tuple[Any, ...]:
    """One env stepped for the env's time limit by the evaluation's own step
    (``ppojax.ppo.evaluation.eval_step``): per step [T, 1] the env state before the step, the
    reward, and whether the first episode has ended by then. ``hidden`` [1, S] is a recurrent
    policy's initial state."""

    def step(carry: EvalCarry, _: None) -> tuple[EvalCarry, tuple[Any, ...]]:
        new_carry, result = eval_step(env, act, deterministic, carry)
        return new_carry, (carry.env_state.env_state, result.reward, new_carry.finished)

    _, outputs = jax.lax.scan(step, eval_start(env, key, 1, hidden), None, max_episode_steps(env))
    return outputs


def start_hidden(config: PPOConfig, episodes: int) -> jax.Array | None:
    """The initial hidden state [episodes, S] of ``config``'s policy; None if feed-forward."""
    if config.recurrent is None:
        return None
    return initial_hidden(make_agent(config).network, episodes)


def evaluate(
    config: PPOConfig,
    act: LoadedAct,
    episodes: int = 10,
    seed: int = 0,
    deterministic: bool = False,
    key: jax.Array | None = None,
) -> np.ndarray:
    """Returns [episodes] of ``episodes`` episodes run in parallel, one per env, from
    ``jax.random.key(seed)`` or ``key`` when given. The same function
    (``ppojax.ppo.evaluation.run_episodes``) evaluates inside training: the in-loop evaluation
    after an update is ``evaluate(config, act, eval_episodes, key=eval_key(state.key))``."""
    if episodes < 1:
        raise ValueError(f"episodes must be at least 1, got {episodes}")
    env = make_env(config.env_id, **config.env_kwargs)
    play = jax.jit(
        functools.partial(
            run_episodes,
            env,
            evaluation_act(config, act),
            episodes=episodes,
            deterministic=deterministic,
        )
    )
    key = jax.random.key(seed) if key is None else key
    hidden = start_hidden(config, episodes)
    return np.asarray(jax.device_get(play(key, hidden=hidden).returns))


def render_gif(
    config: PPOConfig,
    act: LoadedAct,
    path: str | Path,
    seed: int = 0,
    deterministic: bool = False,
    max_frames: int = 500,
) -> int:
    """Draw one episode (at most ``max_frames`` steps) to a GIF with gymnax's visualizer;
    the number of frames. ``ValueError`` for envs gymnax cannot draw."""
    if config.env_id not in RENDERABLE_ENVS:
        raise ValueError(
            f"gymnax cannot draw {config.env_id}; GIFs work for {', '.join(RENDERABLE_ENVS)}"
        )
    if config.env_id in PYGAME_ENVS and importlib.util.find_spec("pygame") is None:
        raise ValueError(f"drawing {config.env_id} needs pygame: pip install 'ppojax[render]'")
    # gymnax draws classic-control envs through gymnasium's pygame renderer, which would
    # otherwise open an audio device and a display it never uses.
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    from gymnax.visualize import Visualizer

    env = make_env(config.env_id, **config.env_kwargs)
    play = jax.jit(
        functools.partial(
            episode_frames, env, evaluation_act(config, act), deterministic=deterministic
        )
    )
    hidden = start_hidden(config, 1)
    states, rewards, ended = jax.device_get(play(jax.random.key(seed), hidden=hidden))
    frames = min(int(np.argmax(ended[:, 0])) + 1, max_frames)
    sequence = [jax.tree.map(lambda leaf, t=t: leaf[t, 0], states) for t in range(frames)]
    returns = np.cumsum(rewards[:frames, 0])
    Visualizer(env.env, env.env_params, sequence, returns).animate(str(path))
    return frames
