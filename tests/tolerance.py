"""Comparisons between runs: bit-exact within one compiled program, float32 ulps across two.

Two programs that compute the same float32 quantity in another order (vmapped or not, other
shapes or shardings, another CPU's SIMD width) agree to a few units in the last place (ulps)
of the *terms* they add up, not of the result: a mean of terms of order 1 that lies near zero
(a policy loss of -1.6e-4) differs by ulps of 1, so a tolerance relative to the result alone
fails on the next machine. ``assert_close`` therefore allows
``ulps * eps * (scale + |desired|)``, with ``scale`` the size of the terms and ``ulps`` the
rounding steps the two programs may accumulate; each caller says in a comment why its numbers
fit. Where both sides come from the same compiled program (one executable run twice, or one
program holding both), ``assert_trees_equal`` checks every bit.
"""

from typing import Any

import jax
import numpy as np

EPS = float(np.finfo(np.float32).eps)  # 1.19e-7: one ulp of 1 in float32

# Short training runs (a few updates, a dozen Adam steps): each reduction rounds by an ulp or
# two of its terms (measured: at most 2 ulps of 1 for the tiny configs' losses and parameters,
# vmapped against separate runs), and the Adam steps carry the difference on. 128 ulps of 1
# (1.5e-5) leaves a factor of 60 for other CPUs; a real bug (another key, a wrong batch)
# moves these numbers by 1e-3 or more.
TRAINING_ULPS = 128


def host(leaf: Any) -> np.ndarray:
    """A leaf as a NumPy array; typed PRNG keys as their uint32 data."""
    if jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
    return np.asarray(leaf)


def assert_close(
    actual: Any, desired: Any, *, ulps: float, scale: float = 1.0, err_msg: str = ""
) -> None:
    """|actual - desired| <= ulps * eps32 * (scale + |desired|), elementwise (NaNs must match)."""
    tolerance = ulps * EPS
    np.testing.assert_allclose(
        host(actual), host(desired), rtol=tolerance, atol=tolerance * scale, err_msg=err_msg
    )


def assert_trees_close(actual: Any, desired: Any, *, ulps: float, scale: float = 1.0) -> None:
    """``assert_close`` leaf by leaf for two pytrees of the same structure."""
    pairs = zip(jax.tree.leaves(actual), jax.tree.leaves(desired), strict=True)
    for index, (have, want) in enumerate(pairs):
        assert_close(have, want, ulps=ulps, scale=scale, err_msg=f"leaf {index}")


def assert_states_close(actual: Any, desired: Any, *, ulps: float) -> None:
    """Two TrainStates (or any pytrees) from different programs: float leaves within ``ulps``
    (``assert_close``), every other leaf (counters, PRNG keys by their data) exactly."""
    pairs = zip(jax.tree.leaves(actual), jax.tree.leaves(desired), strict=True)
    for index, (have, want) in enumerate(pairs):
        have, want = host(have), host(want)
        if want.dtype.kind == "f":
            assert_close(have, want, ulps=ulps, err_msg=f"leaf {index}")
        else:
            np.testing.assert_array_equal(have, want, err_msg=f"leaf {index}")


def assert_trees_equal(actual: Any, desired: Any) -> None:
    """Every leaf bit for bit (keys by their data): for results of one compiled program."""
    pairs = zip(jax.tree.leaves(actual), jax.tree.leaves(desired), strict=True)
    for index, (have, want) in enumerate(pairs):
        np.testing.assert_array_equal(host(have), host(want), err_msg=f"leaf {index}")
