"""Every row of the bad-input table in docs/reliability.md, run and compared with its error
word for word, so the table and the code cannot drift apart."""

import re
import shlex
from pathlib import Path

import gymnax
import jax
import jax.numpy as jnp
import pytest
from gymnax.environments import spaces

import ppojax
from ppojax.cli import main
from ppojax.config import PPOConfig
from ppojax.envs import PPOEnv
from ppojax.experiment import Experiment, RunOptions

TABLE = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
MARKER = "<!-- bad-inputs: tests/test_reliability.py runs every row -->"
INPUT = re.compile(r"^`(?P<code>[^`]+)`(?: with (?P<file>\S+) holding `(?P<content>[^`]*)`)?$")


def table_rows() -> list[tuple[str, str, str | None, str | None]]:
    """(input, error, file name, file content) of every row of the table after MARKER."""
    lines = TABLE.read_text().split(MARKER, 1)[1].strip().splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        given, error = (cell.strip() for cell in line.strip().strip("|").split("|"))
        match = INPUT.match(given)
        assert match and error.startswith("`") and error.endswith("`"), line
        rows.append((match["code"], error[1:-1], match["file"], match["content"]))
    return rows


class ActionSpaceEnv:
    """Pendulum with another action space (gymnax registers none but Discrete and Box)."""

    def __init__(self, action_space: spaces.Space) -> None:
        self.base, self.params = gymnax.make("Pendulum-v1")
        self.space = action_space

    def action_space(self, params):
        return self.space

    def observation_space(self, params):
        return self.base.observation_space(params)


def namespace() -> dict:
    tuple_env = ActionSpaceEnv(spaces.Tuple([spaces.Discrete(2), spaces.Discrete(3)]))
    return {
        "ppojax": ppojax,
        "jax": jax,
        "jnp": jnp,
        "PPOConfig": PPOConfig,
        "PPOEnv": PPOEnv,
        "Experiment": Experiment,
        "RunOptions": RunOptions,
        "config": PPOConfig(num_envs=2, num_steps=8, total_timesteps=32, hidden_sizes=(8,)),
        "tuple_action_env": tuple_env,
        "int_box_env": ActionSpaceEnv(spaces.Box(0, 5, (2,), jnp.int32)),
        "params": tuple_env.params,
    }


ROWS = table_rows()


def test_the_table_holds_at_least_twenty_bad_inputs():
    assert len(ROWS) >= 20
    assert len({row[0] + str(row[3]) for row in ROWS}) == len(ROWS)


@pytest.mark.parametrize("code, error, file, content", ROWS, ids=[row[0] for row in ROWS])
def test_bad_input_gets_the_error_in_the_table(
    code, error, file, content, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    if file is not None:
        Path(file).write_text(content)
    if code.startswith("ppojax "):
        with pytest.raises(SystemExit) as exit_info:
            main(shlex.split(code)[1:])
        assert exit_info.value.code == 2
        assert Path("runs").exists() is False  # failed before any run folder was made
        got = capsys.readouterr().err.strip()
    else:
        with pytest.raises(Exception) as raised:
            eval(code, namespace())
        got = f"{type(raised.value).__name__}: {raised.value}"
    assert got == error
