"""ppojax's compiler options: LLVM level 2 and copy insertion's region analysis for CPU
programs, XLA's defaults elsewhere; the size of XLA's CPU thread pool; the CPU alone where no
accelerator is."""

import fnmatch
import os
import subprocess
import sys
from types import SimpleNamespace

import jax
import numpy as np
import pytest

import ppojax
from ppojax.runs import experiment, folder
from ppojax.runtime import compiling


def test_cpu_programs_get_their_options_and_other_backends_keep_xlas_defaults():
    assert ppojax.compiler_options("cpu") == {
        "xla_backend_optimization_level": 2,
        "xla_cpu_copy_insertion_use_region_analysis": True,
    }
    assert ppojax.compiler_options("gpu") is None and ppojax.compiler_options("tpu") is None
    assert ppojax.compiler_options() == ppojax.compiler_options(jax.default_backend())
    options = ppojax.compiler_options("cpu")
    options["xla_backend_optimization_level"] = 0  # a copy: the next call is unchanged
    assert ppojax.compiler_options("cpu") == compiling.CPU_OPTIONS


def test_xla_takes_the_options_and_training_agrees_with_xlas_defaults(tiny_config):
    """The options reach XLA (it refuses a misspelt one), and the documented use, jit with
    compiler_options(), trains as XLA's defaults do, up to the last bits: LLVM may fuse a
    multiply and an add or order a vector loop differently at level 2, a last-bit change of
    some elementwise ops. After the tiny config's 6 minibatch steps that stays within 4 float32
    ulps of the parameters' scale (7.5e-9 measured on parameters up to 0.66)."""
    key = jax.random.key(0)
    ours = jax.jit(ppojax.train, compiler_options=ppojax.compiler_options())(tiny_config, key)
    default = jax.jit(ppojax.train)(tiny_config, key)
    params = jax.tree.leaves(default.state.params)
    scale = max(float(np.abs(leaf).max()) for leaf in params)
    for have, want in zip(jax.tree.leaves(ours.state.params), params, strict=True):
        np.testing.assert_allclose(have, want, rtol=0, atol=4 * 2**-23 * scale)
    np.testing.assert_array_equal(ours.state.env_steps, default.state.env_steps)
    # Region analysis runs in copy insertion, after fusion: both programs (level 2 each) have
    # the same fused kernels (a small CartPole program's HLO: 301 alike) and differ only in
    # the copies between them (204 against 278). The same float32 operations in the same
    # order give the same bits on any machine, so the tolerance here is zero.
    level_2 = jax.jit(ppojax.train, compiler_options={"xla_backend_optimization_level": 2})
    for have, want in zip(
        jax.tree.leaves(ours.state.params),
        jax.tree.leaves(level_2(tiny_config, key).state.params),
        strict=True,
    ):
        np.testing.assert_array_equal(have, want)
    with pytest.raises(Exception, match="xla_backend_optimisation_level"):
        jax.jit(lambda x: x + 1).lower(1.0).compile({"xla_backend_optimisation_level": 2})


def test_an_experiment_compiles_its_runner_with_the_options(tiny_config, tmp_path, monkeypatch):
    """The chunk runner, the program an Experiment spends its compile time on, takes ppojax's
    options: given one XLA does not know, the run fails naming it."""
    monkeypatch.setattr(experiment, "compiler_options", lambda: {"xla_no_such_option": 1})
    with pytest.raises(Exception, match="xla_no_such_option"):
        experiment.run_experiment(
            experiment.Experiment(tiny_config, seeds=2),
            tmp_path / "run",
            experiment.RunOptions(progress=False),
        )


# A fresh process: a one-thread pool, then the tiny config trained as the parent trains it.
ONE_THREAD_POOL = """
import os, sys
import numpy as np
import ppojax
cores = os.sched_getaffinity(0)
limited = ppojax.limit_cpu_threads(1)
import jax
config = ppojax.PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 3, update_epochs=2,
                          num_minibatches=2)
out = jax.jit(ppojax.train, compiler_options=ppojax.compiler_options())(config, jax.random.key(0))
np.savez(sys.argv[1], *[np.asarray(leaf) for leaf in jax.tree.leaves(out.state.params)])
tasks = os.listdir("/proc/self/task")
names = [open(f"/proc/self/task/{tid}/comm").read().strip() for tid in tasks]
every_core = all(os.sched_getaffinity(int(tid)) == cores for tid in tasks)
print(limited, names.count("tf_XLAEigen"), every_core)
"""


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs Linux and two cores",
)
def test_a_one_thread_pool_trains_the_same_bits_and_gives_every_thread_its_cores(
    tiny_config, tmp_path
):
    """XLA names its CPU pool's threads tf_XLAEigen: one per core, one after
    limit_cpu_threads(1); every thread (those the client started included) can run on every
    core afterwards. The same compiled program on fewer threads is exact: threads change
    where a kernel runs, not its arithmetic (YNNPACK splits only reductions of more than
    32,768 floats, and the tiny config has none)."""
    saved = tmp_path / "params.npz"
    child = subprocess.run(
        [sys.executable, "-c", ONE_THREAD_POOL, str(saved)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.returncode == 0, child.stderr
    assert child.stdout.split() == ["True", "1", "True"]
    ours = jax.jit(ppojax.train, compiler_options=ppojax.compiler_options())(
        tiny_config, jax.random.key(0)
    )
    theirs = np.load(saved)
    for index, leaf in enumerate(jax.tree.leaves(ours.state.params)):
        np.testing.assert_array_equal(theirs[f"arr_{index}"], leaf)


def test_backends_started_asks_without_starting_them_or_changing_the_config():
    code = (
        "import jax, ppojax\n"
        "from ppojax.runtime.compiling import backends_started\n"
        "print(backends_started(), backends_started(), jax.config.jax_num_cpu_devices)\n"
        "jax.devices()\n"
        "print(backends_started(), jax.config.jax_num_cpu_devices)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.split() == ["False", "False", "-1", "True", "-1"], result.stderr


def test_limit_cpu_threads_refuses_bad_counts_and_a_started_backend():
    for bad in (0, -1, True, 1.0, "1"):
        with pytest.raises(ValueError, match="positive int"):
            ppojax.limit_cpu_threads(bad)
    jax.devices()  # this test process's backend is started
    with pytest.raises(RuntimeError, match="before JAX's first computation.*taskset"):
        ppojax.limit_cpu_threads(1)


def test_auto_cpu_threads_gives_small_mlp_programs_one_thread(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    classic = ppojax.PPOConfig()
    assert compiling.auto_cpu_threads(classic) == 1
    assert compiling.auto_cpu_threads(classic, runs=8) == 1  # 8 x 4 envs x 64 = 2048
    assert compiling.auto_cpu_threads(classic, runs=9) is None
    assert compiling.auto_cpu_threads(classic.replace(num_envs=64)) is None
    wide = classic.replace(hidden_sizes=(256, 256))
    assert compiling.auto_cpu_threads(wide) == 1  # 4 x 256; 128 x 256**2 = 2**23
    assert compiling.auto_cpu_threads(wide.replace(num_envs=8)) is None  # minibatches of 256
    assert compiling.auto_cpu_threads(ppojax.PPOConfig.preset("Pendulum-v1")) == 1  # 16 envs
    assert compiling.auto_cpu_threads(ppojax.PPOConfig.preset("Breakout-MinAtar")) is None
    assert compiling.auto_cpu_threads(classic.replace(recurrent="gru")) is None
    fields = folder.config_to_dict(classic)
    assert compiling.auto_cpu_threads(fields, runs=2) == 1  # a config.json's fields
    assert compiling.auto_cpu_threads({**fields, "recurrent": "off"}) == 1
    assert compiling.auto_cpu_threads({**fields, "encoder": "cnn"}) is None
    monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")  # an accelerator: leave its host alone
    assert compiling.auto_cpu_threads(classic) is None


def test_auto_cpu_devices_splits_the_runs_evenly_over_the_cores(monkeypatch):
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert compiling.auto_cpu_devices(8, cores=2) == 2
    assert compiling.auto_cpu_devices(12, cores=8) == 6  # the most that divide 12 runs
    assert compiling.auto_cpu_devices(4, cores=16) == 4  # never more devices than runs
    for runs, cores in ((1, 2), (3, 2), (7, 4), (8, 1)):
        assert compiling.auto_cpu_devices(runs, cores) is None  # one device
    monkeypatch.setenv("JAX_NUM_CPU_DEVICES", "3")  # the user's own count stands
    assert compiling.auto_cpu_devices(8, cores=2) is None
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
    assert compiling.auto_cpu_devices(8, cores=2) is None
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")  # an accelerator: the runs go there
    assert compiling.auto_cpu_devices(8, cores=2) is None


def test_use_cpu_devices_refuses_bad_counts_and_a_started_backend_of_another_count():
    for bad in (0, -1, True, 2.0, "2"):
        with pytest.raises(ValueError, match="positive int"):
            ppojax.use_cpu_devices(bad)
    count = len(jax.devices("cpu"))  # this test process's backend is started
    assert ppojax.use_cpu_devices(count) is False  # already so: nothing to change
    with pytest.raises(RuntimeError, match="before JAX's first computation.*JAX_NUM_CPU_DEVICES"):
        ppojax.use_cpu_devices(count + 1)


def test_accelerator_nodes_are_gpus_and_tpus_never_the_vfio_container(monkeypatch):
    def machine(*nodes: str) -> bool:
        monkeypatch.setattr(compiling.glob, "glob", lambda pattern: fnmatch.filter(nodes, pattern))
        return compiling.accelerator_present()

    assert not machine() and not machine("/dev/vfio/vfio", "/dev/null")
    for node in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg", "/dev/kfd"):
        assert machine(node)
    assert machine("/dev/accel0") and machine("/dev/vfio/vfio", "/dev/vfio/12")


def test_the_cpu_alone_only_where_no_accelerator_nor_the_user_chose(monkeypatch):
    """JAX_PLATFORMS=cpu, in the environment and JAX's config, on Linux without an
    accelerator's node, unless JAX_PLATFORMS is set (empty too) or the backends started."""
    updates = []
    config = SimpleNamespace(jax_platforms=None, update=lambda *pair: updates.append(pair))
    monkeypatch.setattr(compiling.jax, "config", config)
    monkeypatch.setattr(compiling, "backends_started", lambda: False)
    monkeypatch.setattr(compiling, "accelerator_present", lambda: False)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("JAX_PLATFORMS", "")  # the user's: JAX chooses
    assert compiling.use_cpu_without_accelerators() is False and updates == []
    monkeypatch.delenv("JAX_PLATFORMS")
    for patch in (
        (compiling, "backends_started", lambda: True),
        (compiling, "accelerator_present", lambda: True),
        (sys, "platform", "darwin"),
        (config, "jax_platforms", "cuda"),
    ):
        with monkeypatch.context() as local:
            local.setattr(*patch)
            assert compiling.use_cpu_without_accelerators() is False
    assert updates == [] and "JAX_PLATFORMS" not in os.environ
    assert compiling.use_cpu_without_accelerators() is True
    assert updates == [("jax_platforms", "cpu")] and os.environ["JAX_PLATFORMS"] == "cpu"
