"""One writer per run folder: ``run_lock(run_dir)`` holds ``run_dir/lock`` (the PID and host
of the process training there) for the run's life. A second process gets a ``ValueError``
naming that PID and host and leaves the folder untouched; a lock whose process is gone (a
killed run on this host) is taken over."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "lock"


def holder(path: Path) -> tuple[int, str] | None:
    """(PID, host) written in the lock file ``path``; None when it is gone or unreadable."""
    try:
        pid, host = path.read_text().split()
        return int(pid), host
    except (OSError, ValueError):
        return None


def is_alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this host (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(owner: tuple[int, str] | None) -> bool:
    """A lock nobody holds: unreadable (its writer died while writing), or of a process of
    this host that is gone. Another host's process cannot be checked from here: held."""
    if owner is None:
        return True
    pid, host = owner
    return host == socket.gethostname() and not is_alive(pid)


def acquire(run_dir: Path) -> Path:
    """Create ``run_dir/lock`` for this process, taking over a stale one; ``ValueError``
    naming the holder when another live process has it."""
    path = Path(run_dir) / LOCK_FILE
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            owner = holder(path)
            if not is_stale(owner):
                pid, host = owner  # type: ignore[misc]
                raise ValueError(
                    f"{run_dir} is in use: process {pid} on {host} is training there (its "
                    f"{LOCK_FILE} file); wait for it to end, or delete {path} if that process "
                    "is gone"
                ) from None
            path.unlink(missing_ok=True)  # a killed run's: take it over
            continue
        with os.fdopen(fd, "w") as file:
            file.write(f"{os.getpid()} {socket.gethostname()}\n")
        return path
    raise ValueError(f"{run_dir}: another process took {path} at the same time; try again")


@contextlib.contextmanager
def run_lock(run_dir: Path) -> Iterator[Path]:
    """Hold ``run_dir``'s lock while the body runs (released on any exit)."""
    path = acquire(run_dir)
    try:
        yield path
    finally:
        if holder(path) == (os.getpid(), socket.gethostname()):
            path.unlink(missing_ok=True)
