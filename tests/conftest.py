"""Shared fixtures: small configs that compile quickly on a 2-core CPU."""

import os

import jax
import pytest

import ppojax

# The command line turns JAX's compilation cache on; tests that run it in this process or in
# subprocesses must not fill the user's ~/.cache. tests/test_cache.py turns it on where wanted.
os.environ.setdefault("PPOJAX_NO_COMPILE_CACHE", "1")


@pytest.fixture(scope="session")
def tiny_config() -> ppojax.PPOConfig:
    return ppojax.PPOConfig(
        num_envs=4, num_steps=16, total_timesteps=4 * 16 * 3, update_epochs=2, num_minibatches=2
    )


@pytest.fixture(scope="session")
def tiny_train(tiny_config):
    """One compiled ``train`` for the tiny config, shared by the tests that need it."""
    return jax.jit(ppojax.train)
