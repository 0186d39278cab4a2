"""Checkpoints: round trips, crash safety, damage found by the manifests, changed configs."""

import jax
import numpy as np
import pytest

import ppojax
from ppojax.runs import checkpoints, folder
from ppojax.runs.experiment import Experiment, init_states


@pytest.fixture(scope="module")
def batched_state():
    config = ppojax.PPOConfig(num_envs=2, num_steps=8, total_timesteps=64, hidden_sizes=(8,))
    return init_states(Experiment(config, seeds=2))


def test_checkpoint_round_trips_every_leaf_including_keys(tmp_path, batched_state):
    state = batched_state.replace(
        params=jax.tree.map(lambda leaf: leaf + 1.0, batched_state.params)
    )
    manager = checkpoints.open_checkpoints(tmp_path, keep=2)
    for step in (1, 2, 3):
        checkpoints.save_checkpoint(manager, step, state)
    manager.close()
    assert sorted(int(path.name) for path in (tmp_path / folder.CHECKPOINT_DIR).iterdir()) == [2, 3]
    template = jax.eval_shape(lambda: batched_state)
    restored, step = checkpoints.restore_checkpoint(tmp_path, template)
    assert step == 3
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    for saved, loaded in zip(
        jax.tree.leaves(checkpoints.to_savable(state)),
        jax.tree.leaves(checkpoints.to_savable(restored)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(saved), np.asarray(loaded))
    assert jax.dtypes.issubdtype(restored.key.dtype, jax.dtypes.prng_key)


def test_restoring_without_a_checkpoint_is_a_clear_error(tmp_path, batched_state):
    with pytest.raises(ValueError, match="holds no checkpoint"):
        checkpoints.restore_checkpoint(tmp_path, jax.eval_shape(lambda: batched_state))


def _save_three(directory, state, keep=None):
    store = checkpoints.open_checkpoints(directory, keep=keep)
    for step in (1, 2, 3):
        checkpoints.save_checkpoint(store, step, state)
    store.close()
    return directory / folder.CHECKPOINT_DIR


def _largest_file(ckpt_dir):
    return max(
        (path for path in ckpt_dir.rglob("*") if path.is_file()), key=lambda p: p.stat().st_size
    )


@pytest.mark.parametrize("damage", ["truncate", "flip", "delete", "truncate-no-manifest"])
def test_a_damaged_checkpoint_names_its_file_and_the_previous_one_is_used(
    tmp_path, batched_state, damage
):
    ckpt_dir = _save_three(tmp_path, batched_state)
    newest = ckpt_dir / "3"
    victim = _largest_file(newest)
    name = str(victim.relative_to(newest))
    if damage.startswith("truncate"):
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    elif damage == "flip":
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0xFF
        victim.write_bytes(bytes(data))
    else:
        victim.unlink()
    if damage.endswith("no-manifest"):  # orbax's own read fails instead of the manifest check
        (newest / checkpoints.MANIFEST_FILE).unlink()
        message, expected = "does not read back", "does not read back"
    else:
        problem = {
            "truncate": "truncated",
            "flip": "changed since it was saved",
            "delete": "missing",
        }
        message, expected = name, problem[damage]
    template = jax.eval_shape(lambda: batched_state)
    with pytest.warns(
        checkpoints.CheckpointWarning, match="using the previous complete checkpoint"
    ) as caught:
        restored, step = checkpoints.restore_checkpoint(tmp_path, template)
    assert step == 2 and message in str(caught[0].message) and expected in str(caught[0].message)
    assert str(newest) in str(caught[0].message) and str(ckpt_dir / "2") in str(caught[0].message)
    np.testing.assert_array_equal(restored.update_step, batched_state.update_step)
    with pytest.raises(checkpoints.CheckpointError, match=f"checkpoint {newest} .*{expected}"):
        checkpoints.restore_checkpoint(tmp_path, template, step=3)


def test_a_failed_save_keeps_the_checkpoint_before_it(tmp_path, batched_state, monkeypatch):
    """Old checkpoints go only after the new one is complete: a save that dies half-way (here
    orbax raising) leaves the previous checkpoint in place, even with keep=1."""
    store = checkpoints.open_checkpoints(tmp_path, keep=1)
    checkpoints.save_checkpoint(store, 1, batched_state)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.manager, "save", disk_full)
    with pytest.raises(OSError, match="No space left"):
        checkpoints.save_checkpoint(store, 2, batched_state)
    store.close()
    assert [path.name for path in (tmp_path / folder.CHECKPOINT_DIR).iterdir()] == ["1"]
    _, step = checkpoints.restore_checkpoint(tmp_path, jax.eval_shape(lambda: batched_state))
    assert step == 1


def test_every_saved_checkpoint_has_a_manifest_of_its_files(tmp_path, batched_state):
    ckpt_dir = _save_three(tmp_path, batched_state, keep=2)
    manifest = folder.read_json(ckpt_dir / "3" / checkpoints.MANIFEST_FILE)
    assert manifest["step"] == 3 and manifest["files"] == checkpoints.file_manifest(ckpt_dir / "3")
    assert any(name.startswith("default/") for name in manifest["files"])


@pytest.mark.parametrize(
    "manifest, problem",
    [
        ("", "is empty"),
        ('{"files": ', "is not valid JSON"),
        ("[]", "must hold a JSON object of checkpoint files, got a list"),
        ('{"step": 3}', "field 'files' must be an object, got null"),
        ('{"files": {"default/x": "y"}}', "files['default/x'] must be [size, SHA-256], got 'y'"),
    ],
)
def test_a_damaged_manifest_passes_over_its_checkpoint(tmp_path, batched_state, manifest, problem):
    ckpt_dir = _save_three(tmp_path, batched_state)
    (ckpt_dir / "3" / checkpoints.MANIFEST_FILE).write_text(manifest)
    template = jax.eval_shape(lambda: batched_state)
    with pytest.warns(checkpoints.CheckpointWarning, match="unreadable manifest") as caught:
        _, step = checkpoints.restore_checkpoint(tmp_path, template)
    assert step == 2 and problem in str(caught[0].message)


def test_manifests_hold_the_run_record_they_were_saved_with(tmp_path, batched_state):
    record = {"config": {"num_envs": 2}, "seeds": 2, "seed": 0, "grid": {}}
    store = checkpoints.open_checkpoints(tmp_path, record=record)
    for step in (1, 2):
        checkpoints.save_checkpoint(store, step, batched_state)
    store.close()
    (tmp_path / folder.CHECKPOINT_DIR / "2" / checkpoints.MANIFEST_FILE).write_text("{")  # left out
    assert checkpoints.checkpoint_records(tmp_path) == [(1, record)]
    plain = tmp_path / "plain"
    _save_three(plain, batched_state)
    assert (
        checkpoints.checkpoint_records(plain) == []
    )  # saved without a record, as by older versions


def test_a_checkpoint_of_other_shapes_is_a_changed_config_not_damage(tmp_path, batched_state):
    """Without a record in its manifest (saved by an older ppojax), a checkpoint whose arrays
    have other shapes than the config gives is refused, not passed over for an older one."""
    ckpt_dir = _save_three(tmp_path, batched_state)
    config = ppojax.PPOConfig(num_envs=4, num_steps=8, total_timesteps=64, hidden_sizes=(8,))
    template = jax.eval_shape(lambda: init_states(Experiment(config, seeds=2)))
    with pytest.raises(
        checkpoints.StateMismatchError, match=r"checkpoint .*3 holds .* of shape \(2, 2"
    ):
        checkpoints.restore_checkpoint(tmp_path, template)
    assert sorted(path.name for path in ckpt_dir.iterdir()) == ["1", "2", "3"]
