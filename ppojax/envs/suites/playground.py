"""MuJoCo Playground (``playground/<name>``, ``pip install "ppojax[playground]"``) behind
gymnax's API.

A Playground env has brax's interface (``reset(key) -> State``, ``step(state, action) ->
State`` with ``obs``, ``reward`` and ``done``), so the adapter is brax's: ``done`` marks a
terminal state, and the episode length of the env's config (``episode_length``, 1000 for the
DeepMind Control suite) is a truncation, so GAE bootstraps it, with the true final
observation kept and resets drawn in one batch per rollout. Playground's own training wrapper
would instead fold the time limit into ``done`` and drop the final observation.

``env_kwargs``: ``max_steps_in_episode`` overrides the episode length; every other key sets a
field of the env's config (``registry.get_default_config(name)``). ``impl`` defaults to
``"jax"``, MJX's pure-JAX pipeline, instead of Playground's ``"warp"``, whose kernels run about
15x slower on a CPU. Observations are the env's ``obs``: a vector, or a dict of arrays for
envs with several (a pytree, as for Jumanji); actions a Box [-1, 1]^d. The DeepMind Control
suite's envs build offline; Playground's locomotion and manipulation envs fetch their robot
models from the internet on first use.
"""

from __future__ import annotations

from typing import Any

from mujoco_playground import registry

from ppojax.envs.registry import unknown_parameter
from ppojax.envs.suites.adapter import unknown_name
from ppojax.envs.suites.brax import Brax, BraxParams

CPU_IMPL = "jax"


class Playground(Brax):
    """A Playground env: brax's adapter under its own prefix (dict observations included)."""

    suite = "playground"


def make(name: str, **kwargs: Any) -> tuple[Playground, BraxParams]:
    """``(env, params)`` of Playground's ``name``: ``registry.load`` with its default config,
    ``impl="jax"`` and ``kwargs`` set on it; the time limit is the config's episode length."""
    known = registry.ALL_ENVS
    if name not in known:
        raise unknown_name(Playground.suite, name, known)
    config = registry.get_default_config(name)
    settings = {"impl": CPU_IMPL, **kwargs}
    for key in settings:
        if key not in config:
            raise unknown_parameter(
                f"{Playground.suite}/{name}",
                key,
                ["max_steps_in_episode", *config.keys()],
                f"It takes max_steps_in_episode and the fields of its config: "
                f"{', '.join(sorted(config.keys()))}.",
            )
    config.update(settings)
    env = registry.load(name, config=config)
    return Playground(env, name), BraxParams(max_steps_in_episode=int(config.episode_length))
