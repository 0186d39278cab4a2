"""JAX's persistent compilation cache for ppojax's programs.

A compiled program is written to disk after its first compilation and loaded from there by
every later process that builds the same program (same config shapes and static fields, same
JAX version, same devices), so a command run a second time skips compiling. The command line
turns it on unless ``--no-compile-cache`` is given or ``PPOJAX_NO_COMPILE_CACHE=1`` is set; from
Python, call :func:`enable_compile_cache` before the first ``jax.jit`` call::

    import ppojax.runtime.cache
    ppojax.runtime.cache.enable_compile_cache()  # $XDG_CACHE_HOME/ppojax, or ~/.cache/ppojax
    out = jax.jit(ppojax.train)(config, key)       # compiled once, loaded by later processes

JAX decides once per process, at its first compilation, whether the cache is used. It does not
store programs that call back to the host (``jax.debug.callback``), which is why the command
line reports progress between compiled chunks when the cache is on.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

OFF_VARIABLE = "PPOJAX_NO_COMPILE_CACHE"
_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_MISS_EVENT = "/jax/compilation_cache/cache_misses"

_counts = {"hits": 0, "misses": 0}
_lock = threading.Lock()
_listening = False


def default_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/ppojax``, or ``~/.cache/ppojax`` when XDG_CACHE_HOME is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ppojax"


def disabled_by_environment() -> bool:
    """True when ``PPOJAX_NO_COMPILE_CACHE`` is set to anything but "", "0" or "false"."""
    return os.environ.get(OFF_VARIABLE, "").strip().lower() not in ("", "0", "false", "no")


def enable_compile_cache(path: str | os.PathLike[str] | None = None) -> Path:
    """Store and load compiled programs in ``path`` (default :func:`default_cache_dir`).

    Every program is cached, however fast it compiled: ppojax's small ones (init, evaluation)
    take about half a second each on a 2-core CPU, which is worth saving too. Returns the folder.
    Raises ValueError when the folder cannot be made.
    """
    import jax

    folder = Path(path) if path is not None else default_cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ValueError(
            f"cannot use {folder} as the compilation cache ({error.strerror}): set "
            f"XDG_CACHE_HOME to a writable folder, or turn the cache off with "
            f"--no-compile-cache or {OFF_VARIABLE}=1"
        ) from None
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    _listen()
    return folder


def cache_enabled() -> bool:
    """Whether a compilation cache folder is set for this process."""
    import jax

    return bool(jax.config.jax_compilation_cache_dir)


def cache_counts() -> dict[str, int]:
    """Programs loaded from the cache (``hits``) and compiled and stored (``misses``) so far in
    this process, counted since :func:`enable_compile_cache` was first called."""
    with _lock:
        return dict(_counts)


def _listen() -> None:
    global _listening
    if _listening:
        return
    import jax

    jax.monitoring.register_event_listener(_count_event)
    _listening = True


def _count_event(event: str, **_: object) -> None:
    name = {_HIT_EVENT: "hits", _MISS_EVENT: "misses"}.get(event)
    if name is not None:
        with _lock:
            _counts[name] += 1
