"""ppojax's compiler options: LLVM level 2 and copy insertion's region analysis for CPU
programs, XLA's defaults elsewhere."""

import jax
import numpy as np
import pytest

import ppojax
from ppojax import compiling, experiment


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
