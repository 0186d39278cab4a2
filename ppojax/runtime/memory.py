"""The GPU memory a ppojax process gets: JAX preallocates ``XLA_PYTHON_CLIENT_MEM_FRACTION``
of each GPU's memory when its backend starts (75% unless set). The training commands
(``ppojax train``, ``rlhf``, ``sft``, ``rm``, ``dpo``) set it to ``MEMORY_FRACTION`` (0.9) unless
the user has, so a step gets the budget ``ppojax plan`` judges it against:
``memory_fraction()`` of the device's memory."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

FRACTION_VARIABLE = "XLA_PYTHON_CLIENT_MEM_FRACTION"
# the share the commands preallocate: the 10% left is for what XLA's allocator does not
# manage (CUDA context, cuBLAS/cuDNN workspaces) and for other processes' small needs
MEMORY_FRACTION = 0.9


def use_memory_fraction(environ: MutableMapping[str, str] | None = None) -> str:
    """Set ``XLA_PYTHON_CLIENT_MEM_FRACTION`` to ``MEMORY_FRACTION`` unless it is set already
    (a user's value wins); the value in force. JAX reads it when the GPU backend starts, so
    call this before the first computation."""
    environ = os.environ if environ is None else environ
    if not environ.get(FRACTION_VARIABLE, "").strip():
        environ[FRACTION_VARIABLE] = str(MEMORY_FRACTION)
    return environ[FRACTION_VARIABLE]


def memory_fraction(environ: MutableMapping[str, str] | None = None) -> float:
    """The share of a GPU's memory a training command's process gets: the user's
    ``XLA_PYTHON_CLIENT_MEM_FRACTION`` where it is set (and a number in (0, 1]), else
    ``MEMORY_FRACTION``."""
    environ = os.environ if environ is None else environ
    try:
        fraction = float(environ.get(FRACTION_VARIABLE, ""))
    except ValueError:
        return MEMORY_FRACTION
    return fraction if 0.0 < fraction <= 1.0 else MEMORY_FRACTION
