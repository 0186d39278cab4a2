"""The persistent compilation cache: a program loaded from disk behaves as a fresh one."""

import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest
from tolerance import TRAINING_ULPS, assert_close

from ppojax.runs import checkpoints, folder
from ppojax.runs.experiment import read_experiment, state_template
from ppojax.runtime import cache

TINY = [
    "train", "CartPole-v1", "--num-envs", "4", "--num-steps", "16", "--total-timesteps", "384",
    "--update-epochs", "1", "--num-minibatches", "2",
]  # fmt: skip


def cli(args: list[str], cache_home: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != cache.OFF_VARIABLE}
    env.update(XDG_CACHE_HOME=cache_home, JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, "-m", "ppojax", *args], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def loaded(stdout: str) -> int:
    found = re.search(r"\((\d+) program\(s\) loaded from the compilation cache", stdout)
    assert found, stdout
    return int(found.group(1))


def final_state(run_dir) -> list[np.ndarray]:
    experiment, _ = read_experiment(run_dir)
    state, step = checkpoints.restore_checkpoint(run_dir, state_template(experiment))
    assert step == experiment.config.num_updates
    return [np.asarray(leaf) for leaf in jax.tree.leaves(checkpoints.to_savable(state))]


def test_programs_loaded_from_the_cache_give_the_fresh_programs_arrays(tmp_path):
    home = str(tmp_path / "cache")
    chunks = ["--checkpoint-every", "2"]
    first = cli([*TINY, *chunks, "--out", str(tmp_path / "a")], home)
    assert loaded(first) == 0
    assert any((tmp_path / "cache" / "ppojax").iterdir())
    second = cli([*TINY, *chunks, "--out", str(tmp_path / "b")], home)
    assert loaded(second) > 0
    # No cache, no checkpoint chunks: one program that feeds the bar through host callbacks.
    fresh = cli([*TINY, "--no-compile-cache", "--out", str(tmp_path / "c")], home)
    assert "compilation cache" not in fresh
    (a,), (b,), (c,) = (list((tmp_path / name).iterdir()) for name in "abc")
    # The cached and the freshly compiled executable are the same program: bit for bit.
    for x, y in zip(final_state(a), final_state(b), strict=True):
        np.testing.assert_array_equal(x, y)
    assert (a / folder.METRICS_FILE).read_text() == (b / folder.METRICS_FILE).read_text()
    # The one-call program is another compiled program than the chunks: floats may differ by
    # float32 ulps of their terms (see tests/tolerance.py), integers and keys not at all.
    for x, y in zip(final_state(a), final_state(c), strict=True):
        if x.dtype.kind == "f":
            assert_close(y, x, ulps=TRAINING_ULPS)
        else:
            np.testing.assert_array_equal(x, y)
    _, chunked = folder.read_metrics(a / folder.METRICS_FILE)
    _, one_call = folder.read_metrics(c / folder.METRICS_FILE)
    assert list(one_call) == list(chunked)
    for name, values in chunked.items():
        assert_close(one_call[name], values, ulps=TRAINING_ULPS, err_msg=name)


def test_an_unusable_cache_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ValueError, match="--no-compile-cache"):
        cache.enable_compile_cache(blocker / "ppojax")


def test_the_cache_folder_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache.default_cache_dir() == tmp_path / "ppojax"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache.default_cache_dir().parts[-2:] == (".cache", "ppojax")
    for value, off in [("1", True), ("true", True), ("0", False), ("", False)]:
        monkeypatch.setenv(cache.OFF_VARIABLE, value)
        assert cache.disabled_by_environment() is off
