"""Shared fixtures (small configs that compile quickly on a 2-core CPU), the host marker, and
the jax_surface marker that CI's Python 3.12 leg selects by."""

import os
from pathlib import Path

import jax
import pytest

import ppojax

# The command line turns JAX's compilation cache on; tests that run it in this process or in
# subprocesses must not fill the user's ~/.cache. tests/test_cache.py turns it on where wanted.
os.environ.setdefault("PPOJAX_NO_COMPILE_CACHE", "1")

# The host side's tests: the command lines, run-folder files, docs, notebooks and style. They
# reach JAX only through library and run-driver functions whose own tests (test_experiment,
# test_checkpointing, test_cache, test_parallel, ...) run on every Python, so CI's Python 3.12
# leg, there to catch what a newer jax changes, leaves them out with -m "not host". A host-side
# test in another module carries the marker itself (test_registry's command-line ones).
HOST_MODULES = {
    "test_agents_cli.py",
    "test_agents_env_module.py",
    "test_agents_model_cli.py",
    "test_cli.py",
    "test_docs.py",
    "test_io.py",
    "test_layout.py",
    "test_notebooks.py",
    "test_plan_inputs.py",
    "test_reliability.py",
    "test_rlhf_run.py",
    "test_style.py",
    "test_text_cli.py",
    "test_wandb_logger.py",
}
# What these modules check of a version-specific surface runs on both: the keys the compiled
# and the host episode loops draw, and the checkpoint library's log output on resume.
BOTH_LEGS = {
    "test_agents_cli.py::test_the_host_loop_steps_as_the_compiled_loop_and_keeps_the_chunk_before_a_failure",
    "test_reliability.py::test_resume_and_eval_of_a_healthy_run_show_no_orbax_or_absl_warning",
}


# What a newer jax (and the newer flax, orbax and Python that come with it) can change: CI's
# Python 3.12 leg runs these modules' tests (the marker jax_surface), less the slow and heavy
# ones, and the 3.11 leg runs everything. Each module is here for an API whose behaviour moved
# between jax releases or may: Pallas and the CPU stand-ins, scan's parameters, lowering and
# the compiled text, XLA's options and memory analysis, donation, deviceless compiles for a
# GPU and a TPU, shardings and processes, host callbacks, the compilation cache, orbax
# checkpoints, Hugging Face weights read into arrays, programs compared bit for bit or by
# ulps, and the import machinery behind the moved names. A test of another module that
# touches such an API carries the marker itself.
JAX_SURFACE_MODULES = {
    "test_attention.py",
    "test_cache.py",
    "test_checkpointing.py",
    "test_compiling.py",
    "test_evaluation.py",
    "test_experiment.py",
    "test_gpu_program.py",
    "test_hf_models.py",
    "test_hf_sharding.py",
    "test_hlo.py",
    "test_host_loop.py",
    "test_kernels.py",
    "test_logit_chunks.py",
    "test_moved_names.py",
    "test_parallel.py",
    "test_plan.py",
    "test_plan_tpu.py",
    "test_precision.py",
    "test_reference_ppo.py",
    "test_rlhf_memory.py",
    "test_tpu_program.py",
}
# Names matched without the check below: modules being written now may not be there yet.
JAX_SURFACE_PREFIXES = ("test_sharding", "test_sampling_layout")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A renamed module would silently run on both legs again, or on neither: name it.
    modules = {path.name for path in Path(__file__).parent.glob("test_*.py")}
    missing = HOST_MODULES - modules
    assert not missing, f"tests/conftest.py's HOST_MODULES names no module {sorted(missing)}"
    missing = JAX_SURFACE_MODULES - modules
    assert not missing, f"tests/conftest.py's JAX_SURFACE_MODULES names no module {sorted(missing)}"
    for item in items:
        both = f"{item.path.name}::{item.name}" in BOTH_LEGS
        if item.path.name in HOST_MODULES and not both:
            item.add_marker(pytest.mark.host)
        if (
            both
            or item.path.name in JAX_SURFACE_MODULES
            or item.path.name.startswith(JAX_SURFACE_PREFIXES)
        ):
            item.add_marker(pytest.mark.jax_surface)


@pytest.fixture(scope="session")
def tiny_config() -> ppojax.PPOConfig:
    return ppojax.PPOConfig(
        num_envs=4, num_steps=16, total_timesteps=4 * 16 * 3, update_epochs=2, num_minibatches=2
    )


@pytest.fixture(scope="session")
def tiny_train(tiny_config):
    """One compiled ``train`` for the tiny config, shared by the tests that need it."""
    return jax.jit(ppojax.train)
