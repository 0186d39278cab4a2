"""Several devices and several processes, simulated on the CPU.

Each case runs in a subprocess: the device count (XLA_FLAGS) and jax.distributed must be set
before JAX starts, and a hang must fail the test instead of stalling the suite.
"""

import os
import socket
import subprocess
import sys
import textwrap

import pytest

PRELUDE = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count={devices}"
import jax
import numpy as np
import ppojax
from ppojax.runtime.sharding import make_mesh
from ppojax.ppo.sweeps import sweep
config = ppojax.PPOConfig(num_envs=8, num_steps=16, total_timesteps=8 * 16 * 4,
                          update_epochs=2, num_minibatches=2)
"""


def run_python(code: str, devices: int = 4, timeout: int = 400) -> str:
    script = PRELUDE.format(devices=devices) + textwrap.dedent(code)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def run_fresh_process(script: str, tmp_path) -> subprocess.CompletedProcess:
    """``script`` in a new Python on the CPU with JAX's device count unset (the script sets
    it), ``tmp_path`` as its argument; it must exit 0."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    env.pop("JAX_NUM_CPU_DEVICES", None)
    child = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    return child


def test_independent_runs_split_across_devices_equal_one_device():
    out = run_python(
        """
        assert jax.device_count() == 4
        keys = jax.random.split(jax.random.key(0), 2)
        one = sweep(config, keys, learning_rate=[1e-3, 3e-4])
        four = sweep(config, keys, learning_rate=[1e-3, 3e-4], mesh=make_mesh())
        loss = four.metrics["policy_loss"]
        assert len(loss.sharding.device_set) == 4, loss.sharding
        assert not loss.sharding.is_fully_replicated
        assert len(loss.addressable_shards) == 4
        assert loss.addressable_shards[0].data.shape == (1, 1, 4)
        # Two programs compiled for different shardings reduce in different orders. The
        # metrics are means of per-sample terms of order 1 (normalized advantages, ratios near
        # 1), so each differs by a few float32 ulps of 1 (eps = 1.2e-7), however near zero the
        # mean itself is (a policy loss of -1.6e-4 differed by 1.0e-7): atol 1e-5 is ~80 ulps
        # of 1; rtol 1e-5 covers the large ones (returns, value losses of order 10-100).
        for name in ppojax.METRIC_NAMES:
            np.testing.assert_allclose(four.metrics[name], one.metrics[name], rtol=1e-5,
                                       atol=1e-5, err_msg=name)
        print("runs split ok")
        """
    )
    assert "runs split ok" in out


def test_one_run_with_its_envs_split_across_devices_follows_the_one_device_curve():
    out = run_python(
        """
        key = jax.random.key(0)
        one = jax.jit(ppojax.train)(config, key)
        four = jax.jit(ppojax.train, static_argnames="mesh")(config, key, mesh=make_mesh())
        obs = four.state.obs
        assert len(obs.sharding.device_set) == 4 and not obs.sharding.is_fully_replicated
        assert obs.addressable_shards[0].data.shape == (2, 4)  # 8 envs / 4 devices
        params = jax.tree.leaves(four.state.params)[0]
        assert params.sharding.is_fully_replicated  # one agent, the same on every device
        for name in ppojax.METRIC_NAMES:
            np.testing.assert_allclose(four.metrics[name], one.metrics[name], rtol=1e-4,
                                       atol=1e-6, err_msg=name)
        for a, b in zip(jax.tree.leaves(four.state.params), jax.tree.leaves(one.state.params)):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
        try:
            ppojax.train(config.replace(num_envs=6, total_timesteps=6 * 16 * 4), key,
                         mesh=make_mesh())
        except ValueError as error:
            assert "PPOConfig.num_envs=6" in str(error)
            print("envs split ok")
        """
    )
    assert "envs split ok" in out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


DISTRIBUTED = """
import os, sys
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import numpy as np
import ppojax
from ppojax.runtime import sharding
process_id, port = int(sys.argv[1]), sys.argv[2]
sharding.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id)
import jax
from ppojax.ppo.sweeps import sweep
assert jax.process_count() == 2 and jax.device_count() == 4 and jax.local_device_count() == 2
config = ppojax.PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 2,
                          update_epochs=1, num_minibatches=2)
keys = jax.random.split(jax.random.key(0), 4)
out = sweep(config, keys, learning_rate=[1e-3], mesh=sharding.make_mesh())
reference = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))(
    config.replace(learning_rate=1e-3), jax.device_put(keys, jax.local_devices()[0]))
loss = out.metrics["policy_loss"]
seeds = []
for shard in loss.addressable_shards:
    seed = shard.index[1].start
    # Programs compiled for other shapes (2 local devices vs 4 seeds on one) reduce in another
    # order: the policy loss is a mean of terms of order 1 (normalized advantages times ratios
    # near 1), so it differs by float32 ulps of 1, not of its own value near zero (-1.6e-4
    # differed by 1.0e-7 on one machine, 0 on another). atol 1e-5 is ~80 ulps of 1.
    np.testing.assert_allclose(np.asarray(shard.data)[0, 0], reference.metrics["policy_loss"][seed],
                               rtol=1e-5, atol=1e-5)
    seeds.append(seed)
print("process", process_id, "checked seeds", sorted(seeds))
"""


@pytest.mark.heavy
def test_a_recurrent_run_with_its_envs_split_across_devices_follows_one_device():
    out = run_python(
        """
        recurrent = config.replace(recurrent="gru", recurrent_size=8, hidden_sizes=(16,),
                                   total_timesteps=8 * 16 * 2)
        key = jax.random.key(0)
        one = jax.jit(ppojax.train)(recurrent, key)
        four = jax.jit(ppojax.train, static_argnames="mesh")(recurrent, key, mesh=make_mesh())
        hidden = four.state.hidden
        assert hidden.addressable_shards[0].data.shape == (2, 16)  # 8 envs / 4 devices
        # As for the feed-forward run above: other reduction orders, order-1 terms.
        for name in ppojax.METRIC_NAMES:
            np.testing.assert_allclose(four.metrics[name], one.metrics[name], rtol=1e-4,
                                       atol=1e-6, err_msg=name)
        np.testing.assert_allclose(hidden, one.state.hidden, rtol=1e-4, atol=1e-6)
        print("recurrent split ok")
        """
    )
    assert "recurrent split ok" in out


def test_two_processes_over_loopback_split_the_seeds():
    port = str(free_port())
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    command = [sys.executable, "-c", DISTRIBUTED]
    workers = [
        subprocess.Popen(
            [*command, str(pid), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for pid in (0, 1)
    ]
    outputs = []
    try:
        for worker in workers:
            stdout, stderr = worker.communicate(timeout=400)
            assert worker.returncode == 0, stderr[-3000:]
            outputs.append(stdout)
    finally:
        for worker in workers:
            worker.kill()
    assert "process 0 checked seeds [0, 1]" in outputs[0]
    assert "process 1 checked seeds [2, 3]" in outputs[1]


def test_importing_ppojax_leaves_the_backend_unstarted():
    """So that jax.distributed.initialize can still be called after import ppojax."""
    code = (
        "from jax._src import xla_bridge\nimport ppojax, ppojax.runtime.sharding, "
        "ppojax.ppo.sweeps\n"
        "print('started' if xla_bridge._backends else 'not started')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "not started", result.stderr


SPLIT_EXPERIMENT = """
import shutil, sys
from pathlib import Path
import ppojax
assert ppojax.use_cpu_devices(2)
import jax
import numpy as np
from ppojax.runs import checkpoints
from ppojax.runs import experiment
config = ppojax.PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 3, update_epochs=2,
                          num_minibatches=2)
out = Path(sys.argv[1])
runs = experiment.Experiment(config, seeds=2)
options = experiment.RunOptions(progress=True, checkpoint_every=1, keep_checkpoints=None)
whole = experiment.run_experiment(runs, out / "whole", options)
params = jax.tree.leaves(whole.state.params)[0]
assert len(params.sharding.device_set) == 2 and params.addressable_shards[0].data.shape[0] == 1
shutil.copytree(out / "whole", out / "resumed")
for step in ("2", "3"):
    shutil.rmtree(out / "resumed" / "checkpoints" / step)
resumed = experiment.resume_experiment(out / "resumed", options)
assert resumed.resumed_from == 1
# The same chunk program on the same two devices: every bit.
pairs = zip(jax.tree.leaves(checkpoints.to_savable(whole.state)),
            jax.tree.leaves(checkpoints.to_savable(resumed.state)), strict=True)
for a, b in pairs:
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
assert (out / "whole" / "metrics.csv").read_text() == (out / "resumed" / "metrics.csv").read_text()
print("split experiment ok", jax.device_count())
"""


@pytest.mark.heavy
def test_an_experiment_splits_its_runs_over_cpu_devices_and_resumes_exactly(tmp_path):
    """Two seeds on two CPU devices (``ppojax.use_cpu_devices``), a progress callback in the
    program: each device holds one run, a resume from update 1 reproduces every bit, and the
    one-device process here reads the checkpoints back and agrees with its own run."""
    from tolerance import TRAINING_ULPS, assert_close, assert_states_close

    import ppojax
    from ppojax.runs import checkpoints, experiment, folder

    child = run_fresh_process(SPLIT_EXPERIMENT, tmp_path)
    assert "split experiment ok 2" in child.stdout
    config = ppojax.PPOConfig(
        num_envs=4, num_steps=16, total_timesteps=4 * 16 * 3, update_epochs=2, num_minibatches=2
    )
    runs = experiment.Experiment(config, seeds=2)
    here = experiment.run_experiment(runs, None, experiment.RunOptions(progress=False))
    saved, step = checkpoints.restore_checkpoint(
        tmp_path / "whole", experiment.state_template(runs)
    )
    assert step == 3
    # One program for 2 runs on one device against one for 1 run on each of two: other shapes,
    # so reductions may round differently, by ulps of order-1 terms (tests/tolerance.py).
    assert_states_close(saved, here.state, ulps=TRAINING_ULPS)
    _, metrics = folder.read_metrics(tmp_path / "whole" / "metrics.csv")
    assert_close(metrics["policy_loss"], here.metrics["policy_loss"], ulps=TRAINING_ULPS)


def test_runs_sharding_takes_the_most_devices_that_divide_the_runs():
    out = run_python(
        """
        from ppojax.runtime.sharding import runs_sharding
        sizes = {runs: runs_sharding(runs) for runs in (1, 3, 4, 5, 6, 8)}
        assert sizes[1] is None and sizes[5] is None  # 4 devices: no even split over 2+
        assert len(sizes[4].device_set) == 4 and len(sizes[8].device_set) == 4
        assert len(sizes[3].device_set) == 3  # one run on each of 3 of the 4
        assert len(sizes[6].device_set) == 3  # 6 runs: 2 per device on 3 of the 4
        x = jax.device_put(np.zeros((6, 3)), sizes[6])
        assert x.addressable_shards[0].data.shape == (2, 3)
        print("runs sharding ok")
        """
    )
    assert "runs sharding ok" in out


@pytest.mark.heavy
def test_a_pbt_population_split_across_devices_equals_one_device():
    """Four members on four CPU devices, an exploit after every update: each member's state
    lives on one device, and the run (lineage, hyperparameters, metrics) is the one-device run."""
    out = run_python(
        """
        import functools
        from ppojax.ppo.pbt import pbt
        search = {"learning_rate": (1e-4, 1e-2, "log"), "ent_coef": (0.0, 0.05)}
        run = functools.partial(pbt, population=4, interval=1, search=search, fraction=0.25)
        one = jax.jit(run)(config, jax.random.key(3))
        four = jax.jit(functools.partial(run, mesh=make_mesh()))(config, jax.random.key(3))
        params = jax.tree.leaves(four.state.params)[0]
        assert len(params.sharding.device_set) == 4, params.sharding
        assert params.addressable_shards[0].data.shape[0] == 1
        # Every interval replaced a member: the exploit's copies crossed devices.
        assert (np.asarray(four.lineage[:, :-1]) != np.arange(4)[:, None]).any()
        np.testing.assert_array_equal(np.asarray(four.lineage), np.asarray(one.lineage))
        # Two programs for other shardings round reductions differently by ulps of order-1
        # terms (tests/tolerance.py); 1e-5 is ~80 ulps of 1, and a wrong copy or key moves
        # these numbers by 1e-3 or more.
        for name in ("policy_loss", "value_loss", "episode_return"):
            np.testing.assert_allclose(four.metrics[name], one.metrics[name], rtol=1e-5,
                                       atol=1e-5, err_msg=name)
        for name in search:
            np.testing.assert_allclose(four.hyperparams[name], one.hyperparams[name], rtol=1e-6)
        try:
            run(config, jax.random.key(3), population=6, mesh=make_mesh())
        except ValueError as error:
            assert "pbt population=6 cannot be split evenly over 4 devices" in str(error), error
        else:
            raise AssertionError("a population of 6 on 4 devices was not refused")
        print("pbt split ok")
        """
    )
    assert "pbt split ok" in out


SPLIT_PBT = """
import shutil, sys
from pathlib import Path
import ppojax
assert ppojax.use_cpu_devices(2)
import jax
from ppojax.cli.commands import main
from ppojax.runs.options import RunOptions
from ppojax.runs.pbt_folder import population_mesh, run_pbt
config = ppojax.PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 4, update_epochs=1,
                          num_minibatches=2, hidden_sizes=(8,))
run_dir = Path(sys.argv[1]) / "pbt"
search = {"learning_rate": (1e-4, 3e-3, "log")}
assert population_mesh({"population": 4}).devices.size == 2
options = RunOptions(progress=False, checkpoint_every=2, keep_checkpoints=None)
run_pbt(config, search, 4, 1, run_dir, options=options)
whole = {name: (run_dir / name).read_text() for name in ("metrics.csv", "pbt.csv")}
shutil.rmtree(run_dir / "checkpoints" / "4")
assert main(["pbt", "--resume", str(run_dir), "--no-progress"]) == 0
for name, text in whole.items():
    assert (run_dir / name).read_text() == text, name
print("split pbt ok", jax.device_count())
"""


@pytest.mark.heavy
def test_a_pbt_run_folder_splits_its_members_over_cpu_devices_and_resumes_exactly(tmp_path):
    """Four members over two CPU devices (``population_mesh``; ``pbt(mesh=...)`` is checked
    above), and a resume from the middle (the same programs on the same devices) writes the
    same tables, every character."""
    child = run_fresh_process(SPLIT_PBT, tmp_path)
    assert "split pbt ok 2" in child.stdout
