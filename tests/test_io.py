"""Run folders: config files, run folders, the metrics CSV, learning-curve plots, versions."""

import json

import numpy as np
import pytest

import ppojax
from ppojax.ppo.config import ConfigError, UnknownFieldError
from ppojax.runs import folder, plots


def test_config_round_trips_through_json(tmp_path):
    config = ppojax.PPOConfig.preset(
        "Pendulum-v1", hidden_sizes=(32, 16), learning_rate=3e-4, vf_clip_eps=None
    )
    folder.write_json(tmp_path / "config.json", folder.config_to_dict(config))
    loaded = folder.config_from_dict(folder.read_config_file(tmp_path / "config.json"))
    assert loaded == config
    assert loaded.hidden_sizes == (32, 16) and loaded.vf_clip_eps is None


def test_config_file_errors_name_the_problem(tmp_path):
    with pytest.raises(ValueError, match="Did you mean learning_rate"):
        folder.config_from_dict({"learning_rat": 1e-3})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        folder.read_config_file(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        folder.read_config_file(tmp_path / "list.json")
    with pytest.raises(ValueError, match="cannot read"):
        folder.read_config_file(tmp_path / "missing.json")


def test_toml_config_files_read_like_json_ones(tmp_path):
    (tmp_path / "c.toml").write_text(
        'env_id = "Pendulum-v1"\nhidden_sizes = [32, 16]\nvf_clip_eps = "none"\n'
        "learning_rate = 3e-4\nanneal_lr = false\n"
    )
    config = folder.config_from_file(tmp_path / "c.toml", num_envs=8)
    assert config == ppojax.PPOConfig.preset(
        "Pendulum-v1",
        hidden_sizes=(32, 16),
        vf_clip_eps=None,
        learning_rate=3e-4,
        anneal_lr=False,
        num_envs=8,
        divergence_guard=True,  # a run folder's default (RUN_FOLDER_DEFAULTS)
    )


def test_run_folder_configs_keep_the_divergence_guard_unless_they_turn_it_off(tmp_path):
    assert not ppojax.PPOConfig().divergence_guard
    assert folder.config_from_dict({}).divergence_guard
    assert not folder.config_from_dict({"divergence_guard": False}).divergence_guard
    (tmp_path / "off.toml").write_text("divergence_guard = false\n")
    assert not folder.config_from_file(tmp_path / "off.toml").divergence_guard
    assert folder.config_from_file(tmp_path / "off.toml", divergence_guard=True).divergence_guard


def test_errors_from_a_config_file_name_the_file(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text("gamma = 1.5\nnum_envs = 8\n")
    with pytest.raises(ConfigError, match=f"config file {path}: PPOConfig.gamma .* got 1.5"):
        folder.config_from_file(path)
    # The value given on top, not the file's, is the one at fault.
    with pytest.raises(ConfigError, match="^PPOConfig.gamma .* got 2.0"):
        folder.config_from_file(path, gamma=2.0)
    assert folder.config_from_file(path, gamma=0.9).num_envs == 8
    path.write_text("learning_rat = 1e-3\n")
    with pytest.raises(
        UnknownFieldError, match=f"config file {path}: .*Did you mean learning_rate"
    ):
        folder.config_from_file(path)
    (tmp_path / "twice.json").write_text('{"gamma": 0.9, "gamma": 0.8}')
    with pytest.raises(ValueError, match="twice.json: field 'gamma' is given more than once"):
        folder.read_config_file(tmp_path / "twice.json")
    (tmp_path / "c.pkl").write_bytes(b"\x80\x04N.")
    with pytest.raises(ValueError, match=r"c.pkl must be a .json or .toml file"):
        folder.read_config_file(tmp_path / "c.pkl")


def test_a_run_file_that_is_not_json_is_named(tmp_path):
    (tmp_path / "run.json").write_text('{"seeds": 2')
    with pytest.raises(ValueError, match="run.json is not valid JSON"):
        folder.read_json(tmp_path / "run.json")


def test_write_json_leaves_no_temporary_files(tmp_path):
    folder.write_json(tmp_path / "a.json", {"x": [1, 2], "nan": float("nan")})
    assert [path.name for path in tmp_path.iterdir()] == ["a.json"]
    assert json.loads((tmp_path / "a.json").read_text().replace("NaN", "null"))["x"] == [1, 2]


def test_new_run_dirs_never_collide(tmp_path):
    first = folder.new_run_dir(tmp_path, "CartPole-v1")
    second = folder.new_run_dir(tmp_path, "CartPole-v1")
    assert first != second and first.is_dir() and second.is_dir()
    assert first.name.startswith("CartPole-v1-")


def chunk_metrics(first: int, count: int) -> dict[str, np.ndarray]:
    """Fake metrics [2 runs, count] whose values encode (run, update)."""
    updates = np.arange(first + 1, first + count + 1, dtype=float)
    return {
        "episode_return": np.stack([updates, 100 + updates]),
        "loss": np.stack([-updates, np.full(count, np.nan)]),
    }


def write_chunks(path, plan):
    runs = [{"run": 0, "seed": 0, "lr": 0.1}, {"run": 1, "seed": 1, "lr": 0.1}]
    header = folder.metrics_header(runs, ["episode_return", "loss"])
    for first, count in plan:
        folder.append_metrics(
            path, header, folder.metric_rows(runs, first, chunk_metrics(first, count))
        )


def test_metrics_csv_is_the_same_however_updates_are_chunked(tmp_path):
    write_chunks(tmp_path / "a.csv", [(0, 5)])
    write_chunks(tmp_path / "b.csv", [(0, 2), (2, 1), (3, 2)])
    assert (tmp_path / "a.csv").read_text() == (tmp_path / "b.csv").read_text()
    assert (tmp_path / "a.csv").read_text().splitlines()[
        0
    ] == "run,seed,lr,update,episode_return,loss"
    runs, metrics = folder.read_metrics(tmp_path / "a.csv")
    assert [run["seed"] for run in runs] == ["0", "1"]
    np.testing.assert_array_equal(metrics["episode_return"], chunk_metrics(0, 5)["episode_return"])
    np.testing.assert_array_equal(metrics["loss"], chunk_metrics(0, 5)["loss"])


def test_truncating_metrics_drops_updates_after_the_checkpoint(tmp_path):
    write_chunks(tmp_path / "m.csv", [(0, 5)])
    folder.truncate_metrics(tmp_path / "m.csv", 3)
    _, metrics = folder.read_metrics(tmp_path / "m.csv")
    np.testing.assert_array_equal(metrics["episode_return"], [[1, 2, 3], [101, 102, 103]])


def test_rolling_mean_skips_nan_updates():
    values = np.array([[np.nan, 2.0, np.nan, 4.0, 6.0]])
    expected = [[np.nan, 2.0, 2.0, 3.0, 5.0]]
    np.testing.assert_allclose(plots.rolling_mean(values, window=2 + 1), expected)


def test_plot_writes_a_png(tmp_path):
    returns = np.array([[np.nan, 10.0, 20.0, 30.0], [np.nan, 12.0, 18.0, 35.0]])
    plots.plot_learning_curves(
        {"CartPole-v1": returns}, np.arange(1, 5) * 512, tmp_path / "c.png", "t"
    )
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_versions_name_the_stack():
    found = folder.versions()
    assert {"python", "ppojax", "jax", "orbax-checkpoint", "backend"} <= set(found)


def test_a_row_cut_short_by_a_kill_is_dropped_on_resume(tmp_path):
    write_chunks(tmp_path / "m.csv", [(0, 5)])
    with open(tmp_path / "m.csv", "a") as file:
        file.write("0,0,0.1,")  # the start of update 6's row
    folder.truncate_metrics(tmp_path / "m.csv", 5)
    _, metrics = folder.read_metrics(tmp_path / "m.csv")
    assert metrics["episode_return"].shape == (2, 5)


def test_metrics_that_are_not_whole_are_errors_naming_line_and_column(tmp_path):
    path = tmp_path / "m.csv"
    write_chunks(path, [(0, 3)])
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:2] + ["0,0,0.1,2,junk,1.0\n"] + lines[3:]))
    with pytest.raises(ValueError, match=f"{path}: line 3, column 'episode_return': 'junk'"):
        folder.read_metrics(path)
    path.write_text("".join(lines[:2] + lines[3:]))  # run 1's row of update 1 is gone
    with pytest.raises(ValueError, match="no row for update 1 of run 1, which the checkpoint"):
        folder.metrics_until(path, 2, runs=2)
    path.unlink()
    write_chunks(path, [(0, 5)])
    before = path.read_bytes()
    header, rows, metrics = folder.metrics_until(path, 3, runs=2)  # read-only, rows up to 3 only
    assert path.read_bytes() == before and header[:4] == ["run", "seed", "lr", "update"]
    assert len(rows) == 6
    np.testing.assert_array_equal(metrics["episode_return"], [[1, 2, 3], [101, 102, 103]])
    with pytest.raises(ValueError, match="has rows of run 1, but the run folder has 1 runs"):
        folder.metrics_until(path, 3, runs=1)
