"""Environment ids: ids registered with ``register_env``, gymnax's registry, and suite ids.

An id resolves in that order: a registered id, a gymnax id, then ``suite/name`` for the
adapter suites in ``SUITES``, whose modules (and the suites themselves) are imported only when
one of their ids is built. Nothing here imports gymnax or a suite at import time: both start
JAX's backend, and ``import ppojax`` must not.

``env_kwargs`` (``PPOConfig.env_kwargs``) reach an env in two ways: keys the factory names in
its signature are passed to it; other keys that name a field of the env-params dataclass it
returns override that field (``max_steps_in_episode=50``); what is left goes to a factory that
takes ``**kwargs`` (``gymnax.make`` hands them to the env's constructor). Anything else is a
``ConfigError`` naming the key.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import inspect
import os
import re
import site
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import jax

from ppojax.checks import ConfigError, EnvKwargs, show

EnvFactory = Callable[..., tuple[Any, Any]]
GYMNAX_API = ("reset", "step", "action_space", "observation_space")


class Suite(NamedTuple):
    """An adapter suite: its module under ``ppojax.envs``, the package it needs and the
    ppojax extra that installs it, and one of its ids."""

    module: str
    package: str
    extra: str
    example: str


SUITES: dict[str, Suite] = {
    "brax": Suite("ppojax.envs.suites.brax", "brax", "brax", "brax/inverted_pendulum"),
    "craftax": Suite(
        "ppojax.envs.suites.craftax", "craftax", "craftax", "craftax/Craftax-Classic-Symbolic-v1"
    ),
    "jumanji": Suite("ppojax.envs.suites.jumanji", "jumanji", "jumanji", "jumanji/Snake-v1"),
    "navix": Suite("ppojax.envs.suites.navix", "navix", "navix", "navix/Navix-Empty-5x5-v0"),
    "playground": Suite(
        "ppojax.envs.suites.playground",
        "mujoco_playground",
        "playground",
        "playground/CartpoleBalance",
    ),
    "xminigrid": Suite(
        "ppojax.envs.suites.xminigrid", "xminigrid", "xminigrid", "xminigrid/MiniGrid-Empty-6x6"
    ),
}

_FACTORIES: dict[str, EnvFactory] = {}
_CHECKED: set[tuple[str, EnvKwargs, int]] = set()
_GENERATION = [0]  # bumped by register_env: a re-registered id is checked again


def register_env(env_id: str, factory: EnvFactory) -> None:
    """Make ``env_id`` trainable everywhere a gymnax id is (``PPOConfig(env_id=...)``, sweeps,
    run folders, ``ppojax.load``, the command line with ``--env-module``).

    ``factory(**env_kwargs) -> (env, env_params)`` builds the env: any object with gymnax's
    API (``reset(key, params) -> (obs, state)``, ``step(key, state, action, params) -> (obs,
    state, reward, terminated, truncated, info)`` with ``info["final_observation"]``,
    ``action_space(params)``, ``observation_space(params)``), a ``gymnax`` ``Environment``
    subclass or duck-typed. A ``step`` of gymnax's older API, five values ``(obs, state,
    reward, done, info)``, is adapted with a warning (``ppojax.envs.env.StepAPIWarning``): each
    done is taken as terminated. Registering an id again replaces its factory; a registered id
    shadows a gymnax id of the same name.
    """
    if not isinstance(env_id, str) or not env_id.strip():
        raise ValueError(f"register_env: env_id must be a non-empty str, got {show(env_id)}")
    suite = env_id.split("/", 1)[0]
    if "/" in env_id and suite in SUITES:
        raise ValueError(
            f"register_env: {env_id!r} lies in the {suite!r} suite's ids; choose an id that "
            f"does not start with {suite}/"
        )
    if not callable(factory):
        raise TypeError(
            f"register_env({env_id!r}, ...): factory must be callable as factory(**env_kwargs) "
            f"-> (env, env_params), got {show(factory)}"
        )
    _FACTORIES[env_id] = factory
    _GENERATION[0] += 1


def registered_envs() -> list[str]:
    """The ids registered with ``register_env``, sorted."""
    return sorted(_FACTORIES)


def import_gymnax() -> Any:
    """``gymnax``, imported on first use: its import starts JAX's backend."""
    import gymnax

    return gymnax


def gymnax_envs() -> list[str]:
    return list(import_gymnax().registered_envs)


def suite_installed(suite: str) -> bool:
    return importlib.util.find_spec(SUITES[suite].package) is not None


def check_env_id(env_id: Any) -> None:
    """Raise ``ConfigError`` unless ``env_id`` resolves: a registered id, a gymnax id, or
    ``suite/name`` of a known suite that is installed. Typos get the closest ids."""
    if not isinstance(env_id, str):
        raise ConfigError(
            "env_id",
            f"PPOConfig.env_id must be an env id such as 'CartPole-v1', got {show(env_id)}.",
        )
    if env_id in _FACTORIES or env_id in gymnax_envs():
        return
    suite, slash, _ = env_id.partition("/")
    if slash and suite in SUITES:
        if not suite_installed(suite):
            raise ConfigError(
                "env_id",
                f"PPOConfig.env_id {env_id!r} needs the {suite} suite: "
                f'pip install "ppojax[{SUITES[suite].extra}]".',
            )
        return
    known = registered_envs() + gymnax_envs() + [s.example for s in SUITES.values()]
    close = difflib.get_close_matches(env_id, known, n=3, cutoff=0.5)
    hint = f" Close matches: {', '.join(close)}." if close else ""
    raise ConfigError(
        "env_id",
        f"PPOConfig.env_id {env_id!r} is not a gymnax id, a registered id "
        f"(ppojax.register_env) or a suite id ({', '.join(s + '/...' for s in SUITES)}).{hint} "
        "ppojax envs lists them; --env-module imports a module that registers envs.",
    )


def env_factory(env_id: str) -> EnvFactory:
    """The factory that builds ``env_id`` (``check_env_id`` first)."""
    if env_id in _FACTORIES:
        return _FACTORIES[env_id]
    suite, slash, name = env_id.partition("/")
    gymnax = import_gymnax()
    if slash and suite in SUITES:
        module = importlib.import_module(SUITES[suite].module)
        return lambda **kwargs: module.make(name, **kwargs)

    def make_gymnax(**kwargs: Any) -> tuple[Any, Any]:
        try:
            return gymnax.make(env_id, **kwargs)
        except OSError as error:  # the few envs that download their data (MNISTBandit-bsuite)
            raise ValueError(f"gymnax could not build {env_id!r}: {error}") from None

    return make_gymnax


def unknown_parameter(env_id: str, name: str, accepted: list[str], detail: str) -> ConfigError:
    """The ``ConfigError`` for an ``env_kwargs`` key ``name`` that ``env_id`` does not take,
    with the closest of ``accepted`` and ``detail`` (what it does take)."""
    close = difflib.get_close_matches(name, accepted, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ConfigError(
        "env_kwargs", f"PPOConfig.env_kwargs: {env_id} has no parameter {name!r}.{hint} {detail}"
    )


def build_env(env_id: str, env_kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """``(env, env_params)`` of ``env_id`` with ``env_kwargs`` applied (see the module's
    docstring for where each key goes); ``ConfigError`` for a key nothing takes."""
    check_env_id(env_id)
    factory = env_factory(env_id)
    named, takes_kwargs = _parameters(factory)
    given = {key: value for key, value in env_kwargs.items() if key in named}
    env, params = _call(env_id, factory, given)
    rest = {key: value for key, value in env_kwargs.items() if key not in named}
    fields = _param_fields(params)
    overrides = {key: value for key, value in rest.items() if key in fields}
    extra = {key: value for key, value in rest.items() if key not in fields}
    if extra and not takes_kwargs:
        raise unknown_parameter(
            env_id,
            sorted(extra)[0],
            sorted(named) + sorted(fields),
            f"Its factory takes {_names(named)}; its env params have {_names(fields)}.",
        )
    if extra:
        env, params = _call(env_id, factory, {**given, **extra}, fields)
    if overrides:
        params = _replace_params(params, overrides)
    return env, params


def check_env_kwargs(env_id: str, env_kwargs: EnvKwargs) -> None:
    """Raise ``ConfigError`` unless ``env_id`` builds with ``env_kwargs``; each combination is
    built once (the check runs at every PPOConfig construction)."""
    key = (env_id, env_kwargs, _GENERATION[0])
    if key not in _CHECKED:
        build_env(env_id, dict(env_kwargs))
        _CHECKED.add(key)


def import_env_modules(modules: list[str] | tuple[str, ...], source: str) -> None:
    """Import each module so that it registers its envs: a module name (``mypackage.envs``;
    the current folder is searched first, as ``python -m`` does) or the path of its .py file
    (``envs/corridor.py``, see ``import_module_file``). ``source`` names where the modules
    came from, for the error."""
    if "" not in sys.path and "." not in sys.path:
        sys.path.insert(0, "")
    for module in modules:
        if is_module_path(module):
            import_module_file(module, source)
            continue
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ValueError(
                f"{source}: cannot import env module {module!r} ({error}); run from the folder "
                "that holds it, add that folder to PYTHONPATH or give the path of its .py file"
            ) from None


def is_module_path(module: str) -> bool:
    """Whether an env module is given as a file path (``corridor.py``, ``envs/corridor``)
    rather than a module name (``mypackage.envs``)."""
    return module.endswith(".py") or "/" in module or os.sep in module


def module_file_name(path: Path) -> tuple[str, Path]:
    """The module name of the .py file ``path`` and the folder it is imported from: the file
    alone, or inside the packages (folders with an ``__init__.py``) around it, so that its
    relative imports work (``pkg/envs.py`` -> ``pkg.envs`` from the folder holding ``pkg``)."""
    parts = [] if path.stem == "__init__" else [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts), folder


def import_module_file(module: str, source: str) -> None:
    """Import the .py file ``module`` (a path) under its module name (``module_file_name``),
    its folder added to the end of ``sys.path``; a ``ValueError`` naming ``source`` when it is
    no .py file, does not import, or its name is taken by another module."""
    path = Path(module).expanduser().resolve()
    problem = "is not a .py file" if path.exists() else "does not exist"
    if path.suffix != ".py" or not path.is_file():
        raise ValueError(
            f"{source}: env module {module} {problem}; give the path of a .py file or a "
            "module name such as mypackage.envs"
        )
    name, folder = module_file_name(path)
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    try:
        imported = importlib.import_module(name)
    except ImportError as error:
        raise ValueError(f"{source}: cannot import env module {module} ({error})") from None
    found = getattr(imported, "__file__", None)
    if found is None or Path(found).resolve() != path:
        raise ValueError(
            f"{source}: env module {module}: its name {name!r} is taken by another module "
            f"({found or 'built in'}); rename the file"
        )


def module_reference(module: str) -> str:
    """How a run folder records an env module (a name or a path, imported already) so that
    it is found again from any working directory: the absolute path of its .py file, or its
    name for a module installed with Python (in site-packages), which is found by name."""
    if is_module_path(module):
        return str(Path(module).expanduser().resolve())
    found = getattr(sys.modules.get(module), "__file__", None)
    if found is None or not found.endswith(".py"):
        return module
    path = Path(found).resolve()
    installed = {Path(folder).resolve() for folder in site.getsitepackages()}
    installed |= {Path(sysconfig.get_paths()[kind]).resolve() for kind in ("purelib", "stdlib")}
    return module if installed & set(path.parents) else str(path)


def env_id_known(env_id: Any) -> bool:
    """Whether ``check_env_id`` passes for ``env_id``."""
    try:
        check_env_id(env_id)
    except ConfigError:
        return False
    return True


def env_modules(env_id: str, given: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The modules a run folder records to find ``env_id`` again (``module_reference``):
    ``given`` (``--env-module``) and, for a registered id, the module its factory comes from
    (unless ``__main__``)."""
    factory = _FACTORIES.get(env_id)
    plain = inspect.isfunction(factory) or inspect.isclass(factory)
    module = getattr(factory, "__module__", None) if plain else None
    found = (module,) if module and module != "__main__" else ()
    return tuple(dict.fromkeys(module_reference(name) for name in (*given, *found)))


def _parameters(factory: EnvFactory) -> tuple[set[str], bool]:
    """The keyword names ``factory`` takes, and whether it takes ``**kwargs``."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return set(), True
    kinds = {parameter.name: parameter.kind for parameter in signature.parameters.values()}
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    named = {name for name, kind in kinds.items() if kind in keyword}
    return named, inspect.Parameter.VAR_KEYWORD in kinds.values()


def _call(
    env_id: str, factory: EnvFactory, kwargs: dict[str, Any], fields: tuple[str, ...] = ()
) -> tuple[Any, Any]:
    """``factory(**kwargs)``, checked to give ``(env, env_params)`` with gymnax's API; an
    unexpected keyword is a ``ConfigError`` naming it. Runs eagerly, also under ``jit``."""
    try:
        # Eagerly even inside a trace (make_agent runs under jit): suites build arrays in
        # their constructors and branch on them, and env params must hold no tracers.
        with jax.ensure_compile_time_eval():
            built = factory(**kwargs)
    except TypeError as error:
        found = re.search(r"unexpected keyword argument '(\w+)'", str(error))
        if found is None:
            raise
        raise unknown_parameter(
            env_id,
            found.group(1),
            list(fields),
            f"Its env params have {_names(fields)}; its constructor said: {error}",
        ) from None
    if not (isinstance(built, tuple) and len(built) == 2):
        raise TypeError(
            f"the factory of {env_id!r} must return (env, env_params), got {show(built)}"
        )
    missing = [name for name in GYMNAX_API if not callable(getattr(built[0], name, None))]
    if missing:
        raise TypeError(
            f"the env of {env_id!r} ({type(built[0]).__name__}) lacks gymnax's "
            f"{', '.join(missing)}; see ppojax.register_env for the API it needs"
        )
    return built


def _param_fields(params: Any) -> tuple[str, ...]:
    if dataclasses.is_dataclass(params):
        return tuple(field.name for field in dataclasses.fields(params))
    return tuple(getattr(params, "_fields", ()))  # a NamedTuple


def _replace_params(params: Any, overrides: dict[str, Any]) -> Any:
    if dataclasses.is_dataclass(params):
        return dataclasses.replace(params, **overrides)
    return params._replace(**overrides)


def _names(names: Any) -> str:
    return ", ".join(sorted(names)) or "nothing"
