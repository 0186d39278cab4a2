"""Checkpoints of a run folder: ``checkpoints/<step>/``, each the whole batched state as orbax
writes it, with a manifest (size and SHA-256 of every file, and the record of the run that
saved it) that tells a damaged checkpoint from a complete one and a changed config from both.
Typed PRNG keys are saved as their raw data (``to_savable``) and wrapped back on restore.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax

from ppojax.runs.folder import CHECKPOINT_DIR, json_kind, read_json_object, write_json


def _is_key(leaf: Any) -> bool:
    return jax.dtypes.issubdtype(getattr(leaf, "dtype", None), jax.dtypes.prng_key)


def to_savable(state: Any) -> Any:
    """The state with typed PRNG keys as their raw uint32 data, which orbax can write."""
    return jax.tree.map(lambda leaf: jax.random.key_data(leaf) if _is_key(leaf) else leaf, state)


def from_savable(saved: Any, template: Any) -> Any:
    """Undo ``to_savable``: wrap raw key data back into keys where ``template`` has keys."""
    return jax.tree.map(
        lambda leaf, like: jax.random.wrap_key_data(leaf) if _is_key(like) else leaf,
        saved,
        template,
    )


class CheckpointError(ValueError):
    """A checkpoint that is missing, incomplete or does not read back; ``step`` names it."""

    def __init__(self, step: int | None, message: str) -> None:
        super().__init__(message)
        self.step = step


class StateMismatchError(ValueError):
    """A whole checkpoint whose arrays have other shapes than the run's config gives: the
    config was changed, the checkpoint is not damaged (so no older one is tried)."""


class CheckpointWarning(UserWarning):
    """A checkpoint was passed over for an older one (or a run restarted from update 0)."""


MANIFEST_FILE = "ppojax_manifest.json"
CORRUPT_DIR = "checkpoints-unreadable"


def file_manifest(folder: Path) -> dict[str, list[Any]]:
    """{path relative to ``folder``: [size in bytes, SHA-256]} of every file below it."""
    manifest = {}
    for path in sorted(Path(folder).rglob("*")):
        if path.is_file() and path.name != MANIFEST_FILE:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            manifest[str(path.relative_to(folder))] = [path.stat().st_size, digest]
    return manifest


def manifest_files(path: Path) -> dict[str, tuple[int, str]]:
    """The ``files`` of a checkpoint manifest, {name: (size, SHA-256)}; a ``ValueError``
    naming the file and field when it is not what ``Checkpoints.save`` writes."""
    files = read_json_object(path, "checkpoint files").get("files")
    if not isinstance(files, dict):
        raise ValueError(f"{path}: field 'files' must be an object, got {json_kind(files)}")
    checked = {}
    for name, entry in files.items():
        size, digest = entry if isinstance(entry, list) and len(entry) == 2 else (None, None)
        if not (type(size) is int and isinstance(digest, str)):
            raise ValueError(f"{path}: files[{name!r}] must be [size, SHA-256], got {entry!r}")
        checked[name] = (size, digest)
    return checked


def checkpoint_records(run_dir: Path) -> list[tuple[int, dict[str, Any]]]:
    """(step, record) of every checkpoint of ``run_dir`` whose manifest holds the record of
    the run that saved it (see ``Checkpoints``), newest first. Read-only; a manifest that does
    not read back is left out here and found by ``verify_checkpoint`` on restore."""
    folder = Path(run_dir) / CHECKPOINT_DIR
    steps = sorted(int(path.name) for path in folder.glob("*") if path.name.isdigit())
    records = []
    for step in reversed(steps):
        try:
            record = read_json_object(folder / str(step) / MANIFEST_FILE, "checkpoint files")
        except ValueError:
            continue
        if isinstance(record.get("run"), dict):
            records.append((step, record["run"]))
    return records


def verify_checkpoint(step_dir: Path, step: int | None = None) -> None:
    """Raise ``CheckpointError`` naming the first file of ``step_dir`` that is missing,
    truncated or changed since it was saved (against its manifest). A checkpoint without a
    manifest (killed between orbax's commit and the manifest, or saved by an older ppojax) is
    left to orbax's own checks when it is read."""
    manifest_path = Path(step_dir) / MANIFEST_FILE
    if not manifest_path.exists():
        return
    try:
        expected = manifest_files(manifest_path)
    except ValueError as error:
        message = f"checkpoint {step_dir} has an unreadable manifest: {error}"
        raise CheckpointError(step, message) from None
    for name, (size, digest) in expected.items():
        path = Path(step_dir) / name
        if not path.is_file():
            problem = "is missing"
        elif path.stat().st_size != size:
            problem = f"is {path.stat().st_size} bytes, {size} when saved (truncated?)"
        elif hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            problem = "has changed since it was saved (SHA-256 differs)"
        else:
            continue
        raise CheckpointError(step, f"checkpoint {step_dir} is corrupt: {name} {problem}")


def _first_line(error: BaseException, limit: int = 200) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text if len(text) <= limit else text[:limit] + "..."


class Checkpoints:
    """The orbax checkpoints of a run folder, ``checkpoints/<step>/``, each the whole state.

    Saving is crash-safe: orbax writes a step into a temporary folder and renames it when it
    is complete; then a manifest (size and SHA-256 of every file) is written into it,
    atomically; only then are checkpoints beyond the newest ``keep`` (None: all) deleted. A
    kill at any moment therefore leaves every earlier checkpoint whole, and a checkpoint
    damaged later is found by its manifest. ``clean`` removes temporary folders a killed run
    left (only for the one process that writes the run). ``record`` (JSON data: the settings
    that fix what the state is) goes into each manifest, so that a resume can tell a changed
    config from a damaged checkpoint.
    """

    def __init__(
        self,
        run_dir: Path,
        keep: int | None = None,
        clean: bool = False,
        record: dict[str, Any] | None = None,
    ) -> None:
        import orbax.checkpoint as ocp

        self.shown = Path(run_dir) / CHECKPOINT_DIR  # the path as the user gave it
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None,
            create=True,
            enable_async_checkpointing=False,
            cleanup_tmp_directories=clean,
        )
        self.manager = ocp.CheckpointManager(self.shown.resolve(), options=options)
        self.keep, self.record = keep, record

    def steps(self) -> list[int]:
        """The complete (committed) checkpoints, oldest first."""
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any) -> None:
        import orbax.checkpoint as ocp

        self.manager.save(step, args=ocp.args.StandardSave(to_savable(state)), force=True)
        self.manager.wait_until_finished()
        step_dir = self.shown / str(step)
        manifest = {"step": step, "files": file_manifest(step_dir)}
        if self.record is not None:
            manifest["run"] = self.record
        write_json(step_dir / MANIFEST_FILE, manifest)
        if self.keep:
            for old in self.steps()[: -self.keep]:
                self.manager.delete(old)

    def restore(self, step: int, template: Any) -> Any:
        """The state saved at ``step``; ``CheckpointError`` naming the file if it is damaged.
        A checkpoint that does not read back under ``template`` is tried under each earlier
        layout of it (``register_layout``) before the error is raised."""
        try:
            return self.restore_as(step, template)
        except CheckpointError as error:
            for older, newer in LAYOUTS:
                earlier = older(template)
                if jax.tree.structure(earlier) == jax.tree.structure(template):
                    continue
                try:
                    return newer(self.restore_as(step, earlier))
                except CheckpointError:
                    pass
            raise error

    def restore_as(self, step: int, template: Any) -> Any:
        """The state saved at ``step`` under exactly ``template``'s structure."""
        import orbax.checkpoint as ocp

        step_dir = self.shown / str(step)
        if step not in self.steps():
            raise CheckpointError(step, f"{step_dir} is not a complete checkpoint")
        verify_checkpoint(step_dir, step)
        # Onto one device whatever devices saved it (a run split over several, see
        # parallel.runs_sharding): orbax restores a sharded save only to a given placement.
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        abstract = jax.tree.map(
            lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=device),
            jax.eval_shape(to_savable, template),
        )
        check_shapes(step_dir, abstract)
        try:
            saved = self.manager.restore(step, args=ocp.args.StandardRestore(abstract))
        except Exception as error:  # orbax, tensorstore and JSON errors alike
            message = f"checkpoint {step_dir} does not read back: {_first_line(error)}"
            raise CheckpointError(step, message) from error
        return from_savable(saved, template)

    def close(self) -> None:
        self.manager.close()


# (older, newer): ``older(template)`` a state's template as an earlier ppojax saved it,
# ``newer(state)`` a state read back under it in today's layout (``register_layout``)
LAYOUTS: list[tuple[Callable[[Any], Any], Callable[[Any], Any]]] = []


def register_layout(older: Callable[[Any], Any], newer: Callable[[Any], Any]) -> None:
    """Let checkpoints saved in an earlier layout of a state resume: ``older(template)`` is
    the template as it was saved (unchanged where it does not apply), ``newer(state)`` turns
    what reads back under it into today's layout."""
    if (older, newer) not in LAYOUTS:
        LAYOUTS.append((older, newer))


def _leaf_name(path: tuple[Any, ...]) -> str:
    """A pytree path as orbax names the array: the keys, attribute names or indices by dots."""
    parts = [getattr(key, "key", getattr(key, "name", getattr(key, "idx", key))) for key in path]
    return ".".join(str(part) for part in parts)


def check_shapes(step_dir: Path, abstract: Any) -> None:
    """Raise ``StateMismatchError`` when an array saved in ``step_dir`` has another shape than
    the same array of ``abstract`` (the state the run folder's config gives). A checkpoint
    whose metadata does not read back is left to orbax's restore to judge."""
    import orbax.checkpoint as ocp

    # The item's own handler: a Checkpointer would look for step metadata in the item folder,
    # where the manager does not write it, and log that it is missing on every healthy read.
    handler = ocp.PyTreeCheckpointHandler()
    try:
        metadata = handler.metadata(Path(step_dir).resolve() / "default")
        saved = {leaf.name: tuple(leaf.shape) for leaf in jax.tree.leaves(metadata)}
    except Exception:  # orbax, tensorstore and JSON errors alike
        return
    finally:
        handler.close()
    for path, leaf in jax.tree_util.tree_flatten_with_path(abstract)[0]:
        name = _leaf_name(path)
        if name in saved and saved[name] != tuple(leaf.shape):
            raise StateMismatchError(
                f"checkpoint {step_dir} holds {name} of shape {saved[name]}, but the run "
                f"folder's config.json and run.json give {tuple(leaf.shape)}: they were changed "
                "after it was saved. Nothing was changed; restore them to resume, or start a "
                "new run with --config"
            )


def open_checkpoints(
    run_dir: Path,
    keep: int | None = None,
    clean: bool = False,
    record: dict[str, Any] | None = None,
) -> Checkpoints:
    """The checkpoints of ``run_dir`` keeping the newest ``keep`` (all when None), each
    manifest holding ``record``."""
    return Checkpoints(run_dir, keep, clean, record)


def save_checkpoint(checkpoints: Checkpoints, step: int, state: Any) -> None:
    """Save ``state`` (any pytree of arrays, keys included) as checkpoint ``step``."""
    checkpoints.save(step, state)


def restore_newest(run_dir: Path, template: Any) -> tuple[Any | None, int, list[int]]:
    """The newest checkpoint that reads back whole: (state, its step, the newer steps that did
    not). Each passed-over checkpoint gets a ``CheckpointWarning`` naming what is wrong with
    it and the one used instead. (None, 0, unreadable) when no checkpoint reads back.

    ``template`` gives the pytree structure, shapes and dtypes (e.g. from ``jax.eval_shape``).
    """
    if not (Path(run_dir) / CHECKPOINT_DIR).is_dir():
        return None, 0, []
    checkpoints = Checkpoints(run_dir)
    try:
        errors: list[CheckpointError] = []
        for step in reversed(checkpoints.steps()):
            try:
                state = checkpoints.restore(step, template)
            except CheckpointError as error:
                errors.append(error)
                continue
            for error in errors:
                warnings.warn(
                    f"{error}; using the previous complete checkpoint, "
                    f"{checkpoints.shown / str(step)}",
                    CheckpointWarning,
                    stacklevel=2,
                )
            return state, step, [int(error.step) for error in errors]
    finally:
        checkpoints.close()
    for error in errors:
        warnings.warn(f"{error}; no older checkpoint reads back", CheckpointWarning, stacklevel=2)
    return None, 0, [int(error.step) for error in errors]


def restore_checkpoint(run_dir: Path, template: Any, step: int | None = None) -> tuple[Any, int]:
    """The state saved at ``step`` and that step. With ``step`` None, the newest checkpoint
    that reads back whole (see ``restore_newest``); a ``ValueError`` when there is none."""
    if step is None:
        state, step, unreadable = restore_newest(run_dir, template)
        if state is None:
            reason = "none reads back" if unreadable else "holds no checkpoint"
            raise CheckpointError(None, f"{Path(run_dir) / CHECKPOINT_DIR} {reason}")
        return state, step
    if not (Path(run_dir) / CHECKPOINT_DIR).is_dir():
        raise CheckpointError(step, f"{Path(run_dir) / CHECKPOINT_DIR} holds no checkpoint")
    checkpoints = Checkpoints(run_dir)
    try:
        return checkpoints.restore(step, template), step
    finally:
        checkpoints.close()


def set_aside(run_dir: Path, steps: Sequence[int]) -> list[Path]:
    """Move checkpoints ``steps`` of ``run_dir`` to ``checkpoints-unreadable/<step>-<time>``
    (kept for a look, out of the way of the run that saves those steps again)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    moved = []
    for step in steps:
        target = Path(run_dir) / CORRUPT_DIR / f"{step}-{stamp}"
        target.parent.mkdir(exist_ok=True)
        os.replace(Path(run_dir) / CHECKPOINT_DIR / str(step), target)
        moved.append(target)
    return moved
