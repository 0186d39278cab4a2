"""A user's own env through ppojax.register_env: from Python, from the command line with
--env-module, and back from its run folder with ppojax eval and ppojax.load."""

import json
import math
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import spaces

import ppojax
from ppojax.cli.commands import main
from ppojax.envs import registry
from ppojax.ppo.evaluation import eval_start, eval_step, max_episode_steps
from ppojax.runs.policy import evaluation_act, make_act


@struct.dataclass
class CorridorState:
    position: jax.Array
    time: jax.Array
    masked_taken: jax.Array  # how often a masked action reached the env (must stay 0)


@struct.dataclass
class CorridorParams:
    length: int = 4
    max_steps_in_episode: int = 10


class MaskedCorridor:
    """A duck-typed gymnax env (no gymnax base class): walk right (1) to the end of a corridor
    for reward 1; left (0) is masked at the start, and action 2 is always masked."""

    def reset(self, key, params):
        state = CorridorState(jnp.int32(0), jnp.int32(0), jnp.int32(0))
        return self.obs(state, params), state

    def step(self, key, state, action, params):
        masked = ~self.action_mask(state, params)[action]
        move = jnp.where(action == 1, 1, jnp.where(action == 0, -1, 0))
        position = jnp.clip(state.position + move, 0, params.length)
        stepped = CorridorState(position, state.time + 1, state.masked_taken + masked)
        terminated = position == params.length
        truncated = ~terminated & (stepped.time >= params.max_steps_in_episode)
        final_obs = self.obs(stepped, params)
        done = terminated | truncated
        fresh = CorridorState(jnp.int32(0), jnp.int32(0), stepped.masked_taken)
        next_state = jax.tree.map(lambda a, b: jnp.where(done, a, b), fresh, stepped)
        info = {"final_observation": final_obs}
        reward = terminated.astype(jnp.float32)
        return self.obs(next_state, params), next_state, reward, terminated, truncated, info

    def obs(self, state, params):
        return jax.nn.one_hot(state.position, params.length + 1)

    def action_mask(self, state, params):
        return jnp.array([state.position > 0, True, False])

    def action_space(self, params):
        return spaces.Discrete(3)

    def observation_space(self, params):
        return spaces.Box(0.0, 1.0, (params.length + 1,))


def corridor(length: int = 4) -> tuple[MaskedCorridor, CorridorParams]:
    return MaskedCorridor(), CorridorParams(length=length)


@pytest.fixture(autouse=True)
def registry_restored(monkeypatch):
    """Registered ids are process-wide, and env-id errors that other tests compare list them:
    each test here registers into a copy that is dropped after it."""
    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))


TINY = dict(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 3, update_epochs=2)


def test_a_registered_env_trains_and_its_mask_reaches_the_rollout_and_the_loss():
    ppojax.register_env("MaskedCorridor-v0", corridor)
    config = ppojax.PPOConfig(
        env_id="MaskedCorridor-v0", env_kwargs={"length": 3}, num_minibatches=2, **TINY
    )
    out = jax.jit(ppojax.train)(config, jax.random.key(0))
    metrics = jax.device_get(out.metrics)
    for name in ("policy_loss", "value_loss", "entropy", "approx_kl"):
        assert np.isfinite(metrics[name]).all(), name
    assert metrics["episodes_finished"].sum() > 0
    # No masked action was ever sampled, and the loss's entropy is that of at most two allowed
    # actions (ln 2), not of three (ln 3 = 1.10 for the near-uniform initial policy).
    assert int(out.state.env_state.env_state.masked_taken.sum()) == 0
    assert metrics["entropy"].max() <= math.log(2) + 1e-6
    assert out.state.obs.shape == (4, 4)  # length 3: one-hot of 4 positions
    # Evaluation episodes pass the env's mask to the trained policy too.
    act = evaluation_act(config, make_act(config, out.state))
    env = ppojax.make_env(config.env_id, **config.env_kwargs)

    def step(carry, _):
        return eval_step(env, act, False, carry)[0], None

    start = eval_start(env, jax.random.key(1), 8)
    end, _ = jax.lax.scan(step, start, None, max_episode_steps(env))
    assert int(end.env_state.env_state.masked_taken.max()) == 0 and bool(end.finished.any())


def test_registering_checks_the_id_and_the_factory():
    with pytest.raises(ValueError, match="suite's ids"):
        ppojax.register_env("jumanji/Mine-v0", corridor)
    with pytest.raises(TypeError, match="must be callable"):
        ppojax.register_env("Corridor-v9", corridor())
    ppojax.register_env("Broken-v0", lambda: (object(), None))
    with pytest.raises(TypeError, match="lacks gymnax's reset, step"):
        ppojax.make_env("Broken-v0")
    ppojax.register_env("Corr-v0", corridor)
    with pytest.raises(ppojax.ConfigError, match="Corr-v0 has no parameter 'width'"):
        ppojax.make_env("Corr-v0", width=2)
    # A factory argument and an env-params field are both taken.
    config = ppojax.PPOConfig(env_id="Corr-v0", env_kwargs={"length": 2, "max_steps_in_episode": 7})
    params = ppojax.make_env(config.env_id, **config.env_kwargs).env_params
    assert (params.length, params.max_steps_in_episode) == (2, 7)


ENV_MODULE = textwrap.dedent(
    '''
    """A gymnax Environment subclass registered from a module (ppojax --env-module)."""
    import jax
    import jax.numpy as jnp
    from flax import struct
    from gymnax.environments import environment, spaces

    import ppojax


    @struct.dataclass
    class State(environment.EnvState):
        position: jax.Array


    @struct.dataclass
    class Params(environment.EnvParams):
        length: int = 4
        max_steps_in_episode: int = 12


    class Corridor(environment.Environment):
        def reset_env(self, key, params):
            state = State(time=0, position=jnp.int32(0))
            return self.get_obs(state, params), state

        def step_env(self, key, state, action, params):
            position = jnp.clip(state.position + 2 * action - 1, 0, params.length)
            state = State(time=state.time + 1, position=position)
            terminated = position == params.length
            reward = terminated.astype(jnp.float32)
            return self.get_obs(state, params), state, reward, terminated, {}

        def get_obs(self, state, params=None, key=None):
            return jax.nn.one_hot(state.position, 8)

        def action_space(self, params):
            return spaces.Discrete(2)

        def observation_space(self, params):
            return spaces.Box(0.0, 1.0, (8,))


    def make(length=4):
        return Corridor(), Params(length=length)


    ppojax.register_env("Corridor-v0", make)
    '''
)


def run_cli(args, cwd):
    return subprocess.run(
        [sys.executable, "-m", "ppojax", *args], cwd=cwd, capture_output=True, text=True
    )


@pytest.fixture
def corridor_run(tmp_path):
    """A run folder trained from the command line on an env of an --env-module."""
    (tmp_path / "corridor_envs.py").write_text(ENV_MODULE)
    flags = ["--num-envs", "4", "--num-steps", "16", "--total-timesteps", "192"]
    flags += ["--update-epochs", "2", "--num-minibatches", "2", "--no-progress"]
    args = ["train", "Corridor-v0", "--env-module", "corridor_envs", "--env-kwargs", "length=3"]
    result = run_cli([*args, *flags, "--out", "runs"], tmp_path)
    assert result.returncode == 0, result.stderr
    (run_dir,) = (tmp_path / "runs").iterdir()
    return tmp_path, run_dir


@pytest.mark.host
def test_cli_trains_an_env_module_and_eval_and_load_find_it_from_the_run_folder(
    corridor_run, monkeypatch
):
    folder, run_dir = corridor_run
    settings = json.loads((run_dir / "run.json").read_text())
    assert settings["env_modules"] == [str((folder / "corridor_envs.py").resolve())]
    assert json.loads((run_dir / "config.json").read_text())["env_kwargs"] == {"length": 3}
    # ppojax eval gets no --env-module, from a folder without it: the run folder names the
    # module's file.
    result = run_cli(["eval", str(run_dir), "--episodes", "3"], run_dir)
    assert result.returncode == 0, result.stderr
    assert "Corridor-v0, run 0: mean return" in result.stdout
    # ppojax.load in a process where the id is not registered yet imports the module.
    monkeypatch.delitem(registry._FACTORIES, "Corridor-v0", raising=False)
    monkeypatch.delitem(sys.modules, "corridor_envs", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the import adds the module's folder
    config, act = ppojax.load(run_dir)
    assert config.env_id == "Corridor-v0" and config.env_kwargs == {"length": 3}
    action = act(np.eye(8, dtype=np.float32)[:2], deterministic=True)
    assert action.shape == (2,) and set(np.asarray(action).tolist()) <= {0, 1}


def cli_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.host
def test_a_missing_env_module_or_id_is_a_one_line_error(capsys):
    error = cli_error(["train", "Nowhere-v0", "--env-module", "no_such_envs"], capsys)
    assert "cannot import env module 'no_such_envs'" in error
    assert "--env-module" in cli_error(["train", "Nowhere-v0"], capsys)
