"""What the benchmark scripts share: the record of when, where and how a result was made,
a dataclass of sizes as flags, result files written whole, rows merged into them, markdown
tables and README blocks built from them, NaN-aware numbers, and rejax set up as ppojax's
opponent.

Scripts run as ``python benchmarks/NAME.py`` from the repository root; Python then puts
benchmarks/ first on the path, so ``import common`` (and a sibling script) needs nothing more.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import math
import os
import platform
import shlex
import subprocess
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

# --------------------------------------------------------------------------------------------
# Where and with what a result was made


def now() -> str:
    """The UTC time to the second, as every result file dates itself."""
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit() -> str:
    """The checkout's commit (``+dirty`` with uncommitted changes to tracked files), else
    $PPOJAX_COMMIT (a copy of the tree without .git, as on the GPU machine), else unknown."""

    def git(*args: str) -> str:
        found = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True)
        return found.stdout.strip()

    try:
        dirty = git("status", "--porcelain", "--untracked-files=no")
        return git("rev-parse", "HEAD") + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get("PPOJAX_COMMIT", "unknown")


def versions(*packages: str) -> dict[str, str | None]:
    """ppojax's own list (Python, jax, jaxlib, flax, optax, gymnax, numpy, ... and the JAX
    backend and devices), then ``packages``, then the commit the code came from."""
    from ppojax.runs import folder

    found: dict[str, str | None] = dict(folder.versions())
    found.update({name: package_version(name) for name in packages})
    return {**found, "ppojax_commit": git_commit()}


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict[str, Any]:
    """The CPU's model and cores, the platform, Python and JAX, JAX's backend and devices."""
    import jax

    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "device": jax.devices()[0].device_kind,
        "device_count": jax.device_count(),
        "devices": [str(device) for device in jax.devices()],
    }


def command_line(script: str, argv: Sequence[str]) -> str:
    """The command as typed from the repository root: ``python benchmarks/NAME.py ARGS``."""
    return shlex.join(["python", f"benchmarks/{Path(script).name}", *argv])


def record(script: str, argv: Sequence[str], *packages: str) -> dict[str, Any]:
    """What every result file states about itself: date, machine, versions (ppojax's list and
    ``packages``) and the exact command."""
    return {
        "date": now(),
        "machine": machine(),
        "versions": versions(*packages),
        "command": command_line(script, argv),
    }


def add_size_flags(parser: argparse.ArgumentParser, sizes: type) -> None:
    """A flag ``--NAME`` for each number of the dataclass ``sizes`` (its switches get none)."""
    for field in size_fields(sizes):
        parser.add_argument("--" + field.name.replace("_", "-"), type=type(field.default))


def with_size_flags(sizes: Any, args: argparse.Namespace) -> Any:
    """``sizes`` with the numbers given by ``add_size_flags``'s flags in place of its own."""
    given = {f.name: getattr(args, f.name) for f in size_fields(type(sizes))}
    return dataclasses.replace(sizes, **{k: v for k, v in given.items() if v is not None})


def size_fields(sizes: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(sizes) if not isinstance(f.default, bool)]


def failure(error: Exception) -> str:
    """An error as a result row keeps it (the traceback to the log)."""
    traceback.print_exc()
    return f"{type(error).__name__}: {error}"[:2000]


# --------------------------------------------------------------------------------------------
# Result files


def result_path(out: Path | None, smoke: bool, name: str) -> Path:
    """Where a script writes its result file ``name``: ``--out`` when given, else a temporary
    folder for a ``--smoke`` run (never over the committed results), else benchmarks/results."""
    if out is not None:
        return Path(out)
    return Path(tempfile.gettempdir()) / "ppojax-smoke" / name if smoke else RESULTS / name


def write_json(path: Path, document: Any, mirror: Path | None = None) -> None:
    """``document`` into ``path`` whole (ppojax's atomic write), readable by everyone, and a
    copy into the folder ``mirror`` when given."""
    from ppojax.runs import folder

    for target in [Path(path)] + ([Path(mirror) / Path(path).name] if mirror else []):
        target.parent.mkdir(parents=True, exist_ok=True)
        folder.write_json(target, document)
        target.chmod(0o644)  # the temporary file was private; a result file is for everyone


def read_rows(path: Path, benchmark: str, description: str) -> dict[str, Any]:
    """The result file at ``path``, or an empty one (its rows under ``tasks``)."""
    from ppojax.runs import folder

    if Path(path).exists():
        return folder.read_json(path)
    return {"benchmark": benchmark, "description": description, "tasks": []}


def merge_row(
    results: dict[str, Any],
    row: dict[str, Any],
    key: str,
    order: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """``results`` with ``row`` in place of the old row whose ``key`` matches (rows sorted by
    ``order`` of their key when given), dated by the row."""
    rows = [old for old in results["tasks"] if old[key] != row[key]] + [row]
    if order is not None:
        rows.sort(key=lambda r: order(r[key]))
    return {**results, "tasks": rows, "updated": row["date"]}


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A markdown table: the header, its rule, a line per row (cells as ``str`` gives them)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def with_block(text: str, start: str, end: str, block: str) -> str:
    """``text`` with what stands between the markers ``start`` and ``end`` replaced by
    ``block`` (a README's generated table)."""
    if start not in text or end not in text:
        raise ValueError(f"no {start} ... {end} block")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{block}\n{end}{tail}"


# --------------------------------------------------------------------------------------------
# Numbers


def pyplot() -> Any:
    """matplotlib's pyplot drawing into files (the Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def moving_mean(values: Any, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(steps, means): the mean of each ``window`` consecutive values, at the step (counted
    from 1) that ends it."""
    means = np.convolve(np.asarray(values), np.ones(window) / window, mode="valid")
    return np.arange(len(means)) + window, means


def timed(function: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """(result, seconds) of ``function(*args)``, waiting for every array to be ready."""
    import jax

    start = time.perf_counter()
    result = jax.block_until_ready(function(*args))
    return result, time.perf_counter() - start


def rounded(value: Any, digits: int = 3) -> float | None:
    """``value`` rounded, None for NaN (JSON has no NaN)."""
    value = float(value)
    return None if math.isnan(value) else round(value, digits)


def nanmean(values: np.ndarray, axis: Any = None) -> np.ndarray:
    """np.nanmean without the warning for all-NaN slices (they give NaN)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=RuntimeWarning)
        return np.nanmean(values, axis=axis)


# --------------------------------------------------------------------------------------------
# The opponents: the env alone (a ceiling) and rejax 0.1.3, timed against ppojax by compare.py
# and gpu.py


def env_alone(env_id: str, envs: int, steps: int) -> Callable[[Any], Any]:
    """``key -> total``: gymnax's ``env_id`` alone, ``envs`` of it under vmap for ``steps``
    steps of uniformly random actions (discrete, or in [-1, 1]), auto-reset included: what
    no trainer of that env can outrun. The total keeps XLA from skipping the work."""
    import gymnax
    import jax
    import jax.numpy as jnp

    env, params = gymnax.make(env_id)
    space = env.action_space(params)

    def random_action(key: Any) -> Any:
        if hasattr(space, "n"):
            return jax.random.randint(key, (envs,), 0, space.n)
        return jax.random.uniform(key, (envs, *space.shape), minval=-1.0, maxval=1.0)

    def run(key: Any) -> Any:
        obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(key, envs), params)

        def step(carry: tuple, _: None) -> tuple:
            state, key, total = carry
            key, action_key, step_key = jax.random.split(key, 3)
            obs, state, reward, _, _, _ = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                jax.random.split(step_key, envs), state, random_action(action_key), params
            )
            return (state, key, total + reward.sum() + obs.sum()), None

        (_, _, total), _ = jax.lax.scan(step, (state, key, jnp.float32(0)), None, steps)
        return total

    return run


def keys_for(runs: int, repeat: int) -> Any:
    """The keys of a timed repeat: the same for both libraries, new for each repeat."""
    import jax

    return jax.random.split(jax.random.key(1000 + repeat), runs)


def legacy_step_env(env: Any) -> Any:
    """gymnax 1.0's env with the old five-value ``step`` that rejax 0.1.3 unpacks."""
    from gymnax.wrappers import LegacyStepAPIWrapper

    class LegacyStep(LegacyStepAPIWrapper):
        def __getattr__(self, name: str) -> Any:
            # rejax deep-copies its env; copy probes attributes of an instance whose _env is
            # not set yet, and the wrapper's lookup of _env would recurse forever.
            if name == "_env":
                raise AttributeError(name)
            return super().__getattr__(name)

    return LegacyStep(env)


def rejax_algo(config: Any) -> Any:
    """rejax's PPO with the hyperparameters and networks of the PPOConfig ``config``, its
    periodic evaluation off (ppojax's timed training loop has none either)."""
    import gymnax
    import jax.numpy as jnp
    from rejax import PPO

    env, env_params = gymnax.make(config.env_id)
    steps = config.num_updates * config.batch_size
    algo = PPO.create(
        env=legacy_step_env(env),
        env_params=env_params,
        num_envs=config.num_envs,
        num_steps=config.num_steps,
        num_epochs=config.update_epochs,
        num_minibatches=config.num_minibatches,
        total_timesteps=steps,
        eval_freq=steps,
        skip_initial_evaluation=True,
        learning_rate=config.learning_rate,
        max_grad_norm=config.max_grad_norm,
        gamma=config.gamma,
        gae_lambda=config.gae_lambda,
        clip_eps=config.clip_eps,
        ent_coef=config.ent_coef,
        vf_coef=config.vf_coef,
        normalize_observations=config.normalize_observations,
        normalize_rewards=config.normalize_rewards,
        agent_kwargs={"activation": config.activation, "hidden_layer_sizes": config.hidden_sizes},
    )
    return algo.replace(eval_callback=lambda algo, ts, key: jnp.zeros(()))
