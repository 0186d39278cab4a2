"""One writer per run folder: ``run_lock(run_dir)`` holds ``run_dir/lock`` (the PID and host
of the process training there) for the run's life. A second process gets a ``ValueError``
naming that PID and host and leaves the folder untouched; a lock whose process is gone (a
killed run on this host) is taken over.

Taking over is a compare-and-delete that the file system cannot do in one call, so it is
serialized by a second file, ``lock.takeover``, created with ``O_EXCL``: only the process that
created it may delete a stale lock, and only after reading it again under it. Two processes
that find the same stale lock at the same instant cannot both win: one creates the take-over
file, the other is refused (or, coming later, finds the winner's live lock)."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

LOCK_FILE = "lock"
TAKEOVER_FILE = "lock.takeover"


def parse(text: str) -> tuple[int, str] | None:
    """(PID, host) of a lock file's text; None when it is not that."""
    try:
        pid, host = text.split()
        return int(pid), host
    except ValueError:
        return None


def holder(path: Path) -> tuple[int, str] | None:
    """(PID, host) written in the lock file ``path``; None when it is gone or unreadable."""
    try:
        return parse(path.read_text())
    except OSError:
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


def create(path: Path) -> bool:
    """Create ``path`` holding this process's PID and host, unless it exists (then False).
    The text is written to a file of its own and hard-linked into place, so nobody ever reads
    the lock empty (an unreadable lock is taken for a dead writer's); where the file system
    has no hard links, ``O_EXCL`` creates it and the text follows."""
    text = f"{os.getpid()} {socket.gethostname()}\n"
    own = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    own.write_text(text)
    try:
        os.link(own, path)
        return True
    except FileExistsError:
        return False
    except OSError:  # no hard links here
        pass
    finally:
        own.unlink(missing_ok=True)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as file:
        file.write(text)
    return True


def in_use(run_dir: Path, path: Path, owner: tuple[int, str]) -> ValueError:
    """The refusal naming the live ``owner`` of ``run_dir``'s lock ``path``."""
    pid, host = owner
    return ValueError(
        f"{run_dir} is in use: process {pid} on {host} is training there (its {path.name} "
        f"file); wait for it to end, or delete {path} if that process is gone"
    )


def take_over(run_dir: Path, path: Path, stale: tuple[int, str] | None) -> None:
    """Delete the lock ``path`` that was read as ``stale``, holding the take-over file while
    reading it again; ``ValueError`` when another process is taking it over now."""
    takeover = path.with_name(TAKEOVER_FILE)
    if not create(takeover):
        owner = holder(takeover)
        if owner is None:  # the other take-over just ended: the caller looks again
            return
        if is_stale(owner):
            raise ValueError(
                f"{run_dir}: process {owner[0]} died while taking over its stale {path.name}; "
                f"delete {takeover} and {path}, then try again"
            )
        raise ValueError(
            f"{run_dir}: another process is taking over its stale {path.name} at this moment; "
            "try again once it has started (or been refused)"
        )
    try:
        try:
            now = parse(path.read_text())
        except FileNotFoundError:  # gone already: nothing to delete (a new one is not ours to)
            return
        # Read whole under the take-over file, the lock can change now only by its live owner
        # deleting it: a stale one stays as read until it is deleted here.
        if now != stale and not is_stale(now):
            raise in_use(run_dir, path, now)  # type: ignore[arg-type]
        path.unlink(missing_ok=True)
    finally:
        takeover.unlink(missing_ok=True)


def acquire(run_dir: Path) -> Path:
    """Create ``run_dir/lock`` for this process, taking over a stale one; ``ValueError``
    naming the holder when another live process has it."""
    path = Path(run_dir) / LOCK_FILE
    for _ in range(2):
        if create(path):
            return path
        owner = holder(path)
        if not is_stale(owner):
            raise in_use(run_dir, path, owner) from None  # type: ignore[arg-type]
        take_over(Path(run_dir), path, owner)  # a killed run's
    owner = holder(path)
    if owner is not None:
        raise in_use(run_dir, path, owner)
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
