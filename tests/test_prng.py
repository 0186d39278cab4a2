"""ppojax.runtime.prng draws flat for compile time; its values must be jax.random's.

The random bits and keys are integers and must match exactly. Normal, Gumbel and uniform values
are the same elementwise float32 functions of those bits in two programs of different shapes,
where XLA may vectorize the tail differently: they are compared within 4 float32 ulps of their
magnitude (order 1, Gumbel tails up to ~10)."""

import jax
import numpy as np
import pytest
from tolerance import assert_close

from ppojax.runtime import prng


@pytest.mark.parametrize("shape", [(128, 4), (3, 5, 2), (7,)])
def test_flat_draws_equal_jax_random_draws_of_the_shape(shape):
    key = jax.random.key(11)
    np.testing.assert_array_equal(
        jax.random.key_data(prng.split(key, shape)),
        jax.random.key_data(jax.random.split(key, shape)),
    )
    np.testing.assert_array_equal(
        prng.draw(jax.random.bits, key, shape), jax.random.bits(key, shape)
    )
    for sampler in (jax.random.normal, jax.random.gumbel, jax.random.uniform):
        assert_close(prng.draw(sampler, key, shape), sampler(key, shape), ulps=4)


def test_flat_draws_equal_jax_random_draws_under_vmap():
    keys = jax.random.split(jax.random.key(3), 4)
    ours = jax.jit(jax.vmap(lambda k: prng.draw(jax.random.gumbel, k, (16, 4, 2))))(keys)
    theirs = jax.jit(jax.vmap(lambda k: jax.random.gumbel(k, (16, 4, 2))))(keys)
    assert_close(ours, theirs, ulps=4)
