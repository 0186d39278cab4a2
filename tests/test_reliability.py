"""Every row of the bad-input table in docs/reliability.md, run and compared with its error
word for word, so the table and the code cannot drift apart."""

import errno
import functools
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import urllib.error
from pathlib import Path

import gymnax
import jax
import jax.numpy as jnp
import pytest
from gymnax.environments import spaces

import ppojax
from ppojax.cli.commands import main
from ppojax.envs import PPOEnv, registry
from ppojax.envs.env import StepAPIWarning
from ppojax.ppo.config import PPOConfig
from ppojax.rlhf import RLHFConfig, make_trainer
from ppojax.runs import Experiment, RunOptions, run_experiment
from ppojax.runs.folder import check_writable
from ppojax.runtime import compiling

TABLE = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
MARKER = "<!-- bad-inputs: tests/test_reliability.py runs every row -->"
INPUT = re.compile(
    r"^`(?P<code>[^`]+)`"
    r"(?: with (?P<file>\S+) (?P<how>holding|updated by|deleted|made read-only)"
    r"(?: `(?P<content>[^`]*)`)?)?$"
)
RUN_DIR = "run"  # the rows' finished run folder (see finished_run)


def table_rows() -> list[tuple[str, str, str | None, str | None, str | None]]:
    """(input, error, file name, how it is damaged, content) of every row after MARKER."""
    lines = TABLE.read_text().split(MARKER, 1)[1].strip().splitlines()
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        given, error = (cell.strip() for cell in line.strip().strip("|").split("|"))
        match = INPUT.match(given)
        assert match and error.startswith("`") and error.endswith("`"), line
        rows.append((match["code"], error[1:-1], match["file"], match["how"], match["content"]))
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


class FourValueEnv:
    """CartPole whose step returns four values: neither gymnax 1.0's six nor its older five."""

    def __init__(self) -> None:
        self.base, self.params = gymnax.make("CartPole-v1")

    def reset(self, key, params):
        return self.base.reset(key, params)

    def step(self, key, state, action, params):
        return self.base.step(key, state, action, params)[:4]

    def action_space(self, params):
        return self.base.action_space(params)

    def observation_space(self, params):
        return self.base.observation_space(params)


class OldStepEnv(FourValueEnv):
    """CartPole as gymnax before 1.0 stepped it: five values, one done for both endings."""

    def step(self, key, state, action, params):
        obs, state, reward, terminated, truncated, _ = self.base.step(key, state, action, params)
        return obs, state, reward, terminated | truncated, {}


def tiny_lm(params, tokens, mask):
    """Logits [B, L, 4] of one learned vector, the same at every position."""
    return jnp.broadcast_to(params["logits"], (*tokens.shape, 4))


def scalar_reward(prompts, prompt_mask, responses, response_mask):
    return jnp.float32(1.0)  # one number for the whole batch instead of one per response


@functools.cache
def rlhf_setup() -> tuple[RLHFConfig, tuple]:
    """A GRPO config and the arguments of one step: 1 prompt x 2 samples of 3 tokens."""
    config = RLHFConfig(algorithm="grpo", group_size=2, response_len=3, num_minibatches=1)
    state = make_trainer(config, tiny_lm, scalar_reward).init(
        {"logits": jnp.zeros(4)}, jax.random.key(0)
    )
    prompts = jnp.array([[3, 3]], jnp.int32)
    return config, (state, prompts, jnp.ones_like(prompts, bool), jax.random.key(1))


def namespace() -> dict:
    tuple_env = ActionSpaceEnv(spaces.Tuple([spaces.Discrete(2), spaces.Discrete(3)]))
    rlhf_config, rlhf_step_args = rlhf_setup()
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
        "four_value_env": FourValueEnv(),
        "make_trainer": make_trainer,
        "rlhf_config": rlhf_config,
        "tiny_lm": tiny_lm,
        "scalar_reward": scalar_reward,
        "rlhf_step_args": rlhf_step_args,
    }


ROWS = table_rows()


def test_the_table_holds_at_least_twenty_bad_inputs():
    assert len(ROWS) >= 20
    assert len({(row[0], row[2], row[4]) for row in ROWS}) == len(ROWS)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished run folder of a small config (2 envs x 4 steps, 3 updates, a checkpoint
    every 2, 2 seeds), which the rows on run/ damage."""
    config = PPOConfig(num_envs=2, num_steps=4, total_timesteps=24, hidden_sizes=(8,))
    folder = tmp_path_factory.mktemp("finished") / RUN_DIR
    options = RunOptions(progress=False, checkpoint_every=2)
    run_experiment(Experiment(config, seeds=2), folder, options)
    return folder


def offline_mnist(directory="/tmp/mnist"):
    """gymnax's MNIST download on a machine without network (whatever this one has)."""
    raise urllib.error.URLError(socket.gaierror(-2, "Name or service not known"))


def damage(file: str, how: str, content: str | None) -> None:
    """Write, update (merge a JSON object into), delete or make read-only ``file``; ``\\n``
    ends a line."""
    path = Path(file)
    if how == "deleted":
        path.unlink()
    elif how == "made read-only":
        path.chmod(0o555)
    elif how == "updated by":
        path.write_text(json.dumps({**json.loads(path.read_text()), **json.loads(content)}))
    else:
        path.write_text(content.replace("\\n", "\n"))


def folder_digest(folder: Path) -> dict[str, str]:
    """SHA-256 of every file below ``folder``, by relative path."""
    files = sorted(path for path in folder.rglob("*") if path.is_file())
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in files
    }


def plan_cpus_as_a_fresh_process(monkeypatch) -> None:
    """The command line's CPU planning as in a fresh ``ppojax`` process on a 2-core CPU
    machine (JAX not started yet: planning runs before most checks), asking for nothing."""
    monkeypatch.setattr(compiling, "backends_started", lambda: False)
    monkeypatch.setattr(compiling, "limit_cpu_threads", lambda threads: False)
    monkeypatch.setattr(compiling, "use_cpu_devices", lambda devices: False)
    monkeypatch.setattr(compiling, "cpu_cores", lambda: 2)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.delenv("JAX_NUM_CPU_DEVICES", raising=False)
    monkeypatch.delenv("XLA_FLAGS", raising=False)


def refuse_files_in(folder: Path, monkeypatch) -> None:
    """Make ``tempfile.mkstemp`` in ``folder`` fail as the OS does in a folder without write
    permission; for root, whom permissions do not stop."""
    real = tempfile.mkstemp

    def mkstemp(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve() == folder.resolve():
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", mkstemp)


@pytest.mark.parametrize(
    "code, error, file, how, content",
    ROWS,
    ids=[" ".join(filter(None, (row[0], row[2], row[3], row[4]))) for row in ROWS],
)
def test_bad_input_gets_the_error_in_the_table(
    code, error, file, how, content, request, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("gymnax.utils.load_mnist.load_mnist", offline_mnist)
    uses_run = RUN_DIR in shlex.split(code) or (file or "").startswith(f"{RUN_DIR}/")
    if uses_run:
        shutil.copytree(request.getfixturevalue("finished_run"), RUN_DIR)
    if file is not None:
        damage(file, how, content)
    if how == "made read-only":
        request.addfinalizer(functools.partial(Path(file).resolve().chmod, 0o755))
        if os.geteuid() == 0:
            refuse_files_in(Path(file), monkeypatch)
    before = folder_digest(Path(RUN_DIR)) if uses_run else None
    if code.startswith("ppojax "):
        plan_cpus_as_a_fresh_process(monkeypatch)
        with pytest.raises(SystemExit) as exit_info:
            main(shlex.split(code)[1:])
        assert exit_info.value.code == 2
        assert Path("runs").exists() is False  # failed before any run folder was made
        if uses_run:  # refused without touching the folder: byte for byte the same
            assert folder_digest(Path(RUN_DIR)) == before
        got = capsys.readouterr().err.strip()
    else:
        with pytest.raises(Exception) as raised:
            eval(code, namespace())
        got = f"{type(raised.value).__name__}: {raised.value}"
    assert got == error


TINY = ["--total-timesteps", "32", "--num-envs", "2", "--num-steps", "8", "--hidden-sizes", "8"]
TINY += ["--update-epochs", "1", "--num-minibatches", "2", "--no-progress"]


@pytest.fixture
def own_registry(monkeypatch):
    """Env ids registered and sys.path entries added in a test are gone after it."""
    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_a_step_of_gymnax_before_1_0_is_adapted_with_a_warning(own_registry):
    ppojax.register_env("OldStep-v0", lambda: (OldStepEnv(), OldStepEnv().params))
    with pytest.warns(StepAPIWarning, match="OldStep-v0: step.* returns gymnax's older five"):
        env = ppojax.make_env("OldStep-v0")
    _, state = env.reset(jax.random.key(0))
    for length in range(1, 50):  # always pushing left, the pole falls within a few steps
        result, state = env.step(jax.random.key(length), state, jnp.int32(0))
        if result.terminated:
            break
    assert not result.truncated and int(result.episode_length) == length < 50


def test_the_command_line_trains_an_env_of_the_older_step_and_says_so(
    own_registry, tmp_path, monkeypatch, capsys
):
    ppojax.register_env("OldStep-v0", lambda: (OldStepEnv(), OldStepEnv().params))
    monkeypatch.chdir(tmp_path)
    assert main(["train", "OldStep-v0", *TINY]) == 0
    warning = "ppojax: warning: OldStep-v0: step(key, state, action, params) returns gymnax's"
    assert warning in capsys.readouterr().err


def test_an_env_whose_step_returns_other_values_fails_before_any_run_folder(
    own_registry, tmp_path, monkeypatch, capsys
):
    ppojax.register_env("FourValue-v0", lambda: (FourValueEnv(), FourValueEnv().params))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "FourValue-v0", *TINY])
    assert exit_info.value.code == 2 and not Path("runs").exists()
    assert capsys.readouterr().err.startswith(
        "ppojax train: error: FourValue-v0: step(key, state, action, params) returned 4 "
        "values; ppojax needs gymnax >= 1.0's six (obs, state, reward, terminated, truncated, "
        "info)"
    )


def test_resume_and_eval_of_a_healthy_run_show_no_orbax_or_absl_warning(
    finished_run, tmp_path, monkeypatch, caplog, capfd
):
    shutil.copytree(finished_run, tmp_path / RUN_DIR)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--resume", RUN_DIR, "--no-progress"]) == 0
    assert main(["eval", RUN_DIR, "--episodes", "1"]) == 0
    logged = [
        f"{record.name}: {record.getMessage()}"
        for record in caplog.records
        if record.levelno >= logging.WARNING and record.name.startswith(("absl", "orbax"))
    ]
    err = capfd.readouterr().err
    assert logged == [] and "absl" not in err and "WARNING" not in err, (logged, err)


def test_the_write_check_names_the_folder_it_cannot_write(finished_run, tmp_path, monkeypatch):
    run = tmp_path / RUN_DIR
    shutil.copytree(finished_run, run)
    check_writable(run)
    assert sorted(path.name for path in run.iterdir()) == sorted(
        path.name for path in finished_run.iterdir()
    )  # the probe files are gone
    refuse_files_in(run / "checkpoints", monkeypatch)
    with pytest.raises(ValueError) as raised:
        check_writable(run)
    assert str(raised.value) == (
        f"--resume {run}: cannot write to the run folder ({run}/checkpoints: Permission "
        f"denied); make it writable (chmod -R u+w {run}) or copy it to a folder you can write to"
    )


@pytest.mark.skipif(
    os.geteuid() == 0,
    reason="root writes into read-only folders; the test above and the table's read-only row "
    "give the refusal the file system gives others",
)
def test_the_write_check_asks_the_file_system(finished_run, tmp_path):
    run = tmp_path / RUN_DIR
    shutil.copytree(finished_run, run)
    (run / "checkpoints").chmod(0o555)
    try:
        with pytest.raises(ValueError, match="checkpoints: Permission denied"):
            check_writable(run)
    finally:
        (run / "checkpoints").chmod(0o755)


CARTPOLE_MODULE = """
import gymnax

import ppojax
{imports}

def cartpole():
    return gymnax.make("CartPole-v1")


ppojax.register_env({env_id}, cartpole)
"""


def test_a_run_finds_its_env_module_from_any_working_folder(
    own_registry, tmp_path, monkeypatch, capsys
):
    lib = tmp_path / "lib"
    lib.mkdir()
    module = lib / "edge_cartpole.py"
    module.write_text(CARTPOLE_MODULE.format(imports="", env_id="'EdgeCartPole-v0'"))
    monkeypatch.chdir(lib)
    argv = ["train", "EdgeCartPole-v0", "--env-module", "edge_cartpole", "--checkpoint-every", "1"]
    try:
        assert main([*argv, *TINY, "--out", str(tmp_path / "runs")]) == 0
        (run_dir,) = (tmp_path / "runs").iterdir()
        settings = json.loads((run_dir / "run.json").read_text())
        assert settings["env_modules"] == [str(module.resolve())]
        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
        resume = ["train", "--resume", str(run_dir), "--no-progress"]
        for command in (["eval", str(run_dir), "--episodes", "1"], resume):
            # as in a fresh process: neither the id, the module nor its folder is known
            registry._FACTORIES.pop("EdgeCartPole-v0")
            sys.modules.pop("edge_cartpole")
            sys.path[:] = [entry for entry in sys.path if entry != str(lib.resolve())]
            assert main(command) == 0
    finally:
        sys.modules.pop("edge_cartpole", None)
    assert "EdgeCartPole-v0, run 0: mean return" in capsys.readouterr().out


def test_env_module_takes_the_path_of_a_py_file_in_its_package(
    own_registry, tmp_path, monkeypatch, capsys
):
    package = tmp_path / "edge_package"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ids.py").write_text("ENV_ID = 'EdgePackageCartPole-v0'\n")
    module = package / "envs.py"
    module.write_text(CARTPOLE_MODULE.format(imports="from .ids import ENV_ID", env_id="ENV_ID"))
    monkeypatch.chdir(tmp_path)
    try:
        assert main(["envs", "--env-module", "edge_package/envs.py"]) == 0
        assert "  EdgePackageCartPole-v0\n" in capsys.readouterr().out
        assert registry.env_modules("EdgePackageCartPole-v0") == (str(module.resolve()),)
    finally:
        for name in ("edge_package", "edge_package.ids", "edge_package.envs"):
            sys.modules.pop(name, None)
