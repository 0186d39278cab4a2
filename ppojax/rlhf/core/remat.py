"""Rematerialized layers: a switch the trainer turns on while its loss is traced, which a
model's layer loop reads (``ppojax.rlhf.models``' decoder does; any other model may).

    with rematerialized_layers():
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)   # traced here: layers remat

A model that honours it wraps each layer in ``jax.checkpoint`` keeping only the layer's input:
the backward pass recomputes one layer's activations at a time (attention weights, the MLP's
hidden units) instead of holding every layer's from the forward pass, for about one more
forward pass of compute. The switch lives in this module, apart from the models, so that the
algorithm never imports a model. It is read at trace time: it changes the program, never a
number beyond float32 reordering.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

import jax

_ACTIVE: contextvars.ContextVar[bool] = contextvars.ContextVar("remat_layers", default=False)
# What a rematerialized layer keeps from its forward pass: nothing but its inputs.
POLICY = jax.checkpoint_policies.nothing_saveable


@contextlib.contextmanager
def rematerialized_layers(active: bool = True) -> Iterator[None]:
    """While open, ``layers_rematerialized()`` is ``active``."""
    token = _ACTIVE.set(active)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def layers_rematerialized() -> bool:
    """Whether the code being traced should rematerialize its layers."""
    return _ACTIVE.get()


def with_rematerialized_layers(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` traced with ``rematerialized_layers()`` open (a loss for ``jax.grad``)."""

    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        with rematerialized_layers():
            return fn(*args, **kwargs)

    return traced
