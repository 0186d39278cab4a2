"""Every module path and public name of the previous layout (the list in ppojax.moved) still
imports, with one DeprecationWarning naming its new home, as the very object at that home;
a name removed with no successor says what to use instead. Imports only: nothing compiles."""

import importlib
import os
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from ppojax.moved import EARLIER_PATHS, GONE_MODULES, MOVED_NAMES, REMOVED_IN, REMOVED_NAMES

ROOT = Path(__file__).resolve().parents[1]


def at(where: str) -> object:
    """The object at "module.attribute", looked up here rather than by the code under test."""
    module, _, attribute = where.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def forget(old: str) -> None:
    """Drops an alias module and its old submodules from sys.modules and from their parent
    packages, so that the next import makes it again (and warns again)."""
    for name in [name for name in sys.modules if name == old or name.startswith(f"{old}.")]:
        del sys.modules[name]
        parent, _, child = name.rpartition(".")
        if parent in sys.modules and child in vars(sys.modules[parent]):
            delattr(sys.modules[parent], child)


def deprecations(caught: list[warnings.WarningMessage]) -> list[str]:
    """ppojax's own deprecation warnings (a suite's import may add its libraries')."""
    messages = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)]
    return [message for message in messages if message.startswith("ppojax.")]


def removed_message(removed: str, module: str | None = None) -> str:
    """The pattern of the AttributeError a removed name raises, asked of ``module`` (its own
    by default): what to use, or nothing."""
    instead = REMOVED_NAMES[removed]
    tail = ", with nothing in its place" if instead is None else f": use {instead}"
    name = removed if module is None else f"{module}.{removed.rpartition('.')[2]}"
    return "^" + re.escape(f"{name} was removed{tail}") + "$"


def home_or_skip(module: str) -> None:
    """Imports a new home, skipping the test where a suite it adapts is not installed."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is None or error.name.split(".")[0] == "ppojax":
            raise
        pytest.skip(f"{module} needs {error.name}, not installed")


@pytest.mark.parametrize("old", sorted([*GONE_MODULES, *EARLIER_PATHS]))
def test_a_gone_module_imports_with_one_warning_naming_its_home_and_holds_its_old_names(old):
    later = EARLIER_PATHS.get(old, old)  # an earlier path holds the later one's names
    home, names = GONE_MODULES[later]
    home_or_skip(home)
    forget(old)
    parent = old.rpartition(".")[0]
    if parent in GONE_MODULES:
        with warnings.catch_warnings(record=True):  # the parent's own warning is its test's
            warnings.simplefilter("always")
            importlib.import_module(parent)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            __import__(old)  # as an import statement does: no frame of importlib's
        module = sys.modules[old]
        messages = deprecations(caught)
        assert len(messages) == 1, messages
        assert messages[0].startswith(f"{old} is deprecated: import from {home}")
        assert f"ppojax {REMOVED_IN}" in messages[0]
        for where in names.values():  # every module its names come from is named
            assert where.rpartition(".")[0] in messages[0]
        ours = [w for w in caught if str(w.message).startswith("ppojax.")]
        assert Path(ours[0].filename) == Path(__file__)  # at the importing line
        assert sorted(module.__all__) == sorted(names)
        for name, where in names.items():
            assert getattr(module, name) is at(where), f"{old}.{name} is not {where}"
        for removed in REMOVED_NAMES:
            if removed.rpartition(".")[0] == later:
                name = removed.rpartition(".")[2]
                with pytest.raises(AttributeError, match=removed_message(removed, old)):
                    getattr(module, name)
        with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
            module.no_such_name  # noqa: B018
    finally:
        forget(old)


MOVED = sorted((module, name) for module, names in MOVED_NAMES.items() for name in names)


@pytest.mark.parametrize(("module", "name"), MOVED, ids=[f"{m}.{n}" for m, n in MOVED])
def test_a_name_moved_out_of_a_module_that_stays_resolves_with_one_warning(module, name):
    where = MOVED_NAMES[module][name]
    package = importlib.import_module(module)
    assert name not in vars(package), f"{module} defines {name} again: drop its moved entry"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = getattr(package, name)
    assert deprecations(caught) == [
        f"{module}.{name} is deprecated: use {where} (the alias goes in ppojax {REMOVED_IN})"
    ]
    assert Path(caught[0].filename) == Path(__file__)
    assert found is at(where)


def test_names_removed_from_modules_that_stay_say_what_to_use_instead():
    kept = [name for name in REMOVED_NAMES if name.rpartition(".")[0] not in GONE_MODULES]
    assert kept  # runs.loop.LoopOptions and others
    for removed in kept:
        module, _, name = removed.rpartition(".")
        with pytest.raises(AttributeError, match=removed_message(removed)):
            getattr(importlib.import_module(module), name)


def test_the_list_is_consistent_with_the_tree():
    """Gone paths have no file, their homes and every target exist and are not themselves
    deprecated, and no name is both moved and removed."""
    for old, (home, names) in GONE_MODULES.items():
        path = ROOT / old.replace(".", "/")
        assert not path.with_suffix(".py").exists() and not path.is_dir(), f"{old} exists"
        assert home not in GONE_MODULES
        importlib.import_module(home)
        for where in names.values():
            assert where.rpartition(".")[0] not in GONE_MODULES, where
    for earlier, later in EARLIER_PATHS.items():
        assert later in GONE_MODULES and earlier not in GONE_MODULES
        assert not (ROOT / earlier.replace(".", "/")).with_suffix(".py").exists()
    for module, names in MOVED_NAMES.items():
        for name, where in names.items():
            assert f"{module}.{name}" not in REMOVED_NAMES
            assert where.rpartition(".")[0] not in GONE_MODULES, where
    assert "ppojax.rlhf.agents.demos" in GONE_MODULES and "ppojax.cli.text" in MOVED_NAMES


def test_no_old_path_would_shadow_a_name_of_its_package():
    """Importing a submodule binds it on its package: an old path named like one of the
    package's names (ppojax.train, the function) would replace that name, so it has none."""
    for old in [*GONE_MODULES, *EARLIER_PATHS]:
        parent, _, child = old.rpartition(".")
        if parent not in GONE_MODULES:
            package = importlib.import_module(parent)
            assert child not in dir(package) or sys.modules.get(old) is getattr(package, child)
    assert "ppojax.train" not in GONE_MODULES
    import ppojax

    assert callable(ppojax.train)


def run_python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter where every warning but a DeprecationWarning is an
    error (the last -W is checked first)."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run(
        [sys.executable, "-W", "error", "-W", "always::DeprecationWarning", "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )


def test_a_script_written_against_the_old_paths_runs_with_only_deprecation_warnings():
    script = textwrap.dedent(
        """
        from ppojax.rlhf.agents.demos import play_demos, train_on_demos
        from ppojax.rlhf.agents.env import make_text_env
        from ppojax.rlhf.agents.trainer import make_episode_trainer
        from ppojax.rlhf.apps.jobs import sft_job
        from ppojax.rlhf.sizing import plan
        from ppojax.config import PPOConfig
        import ppojax
        import ppojax.rlhf.post.demos as demos

        assert play_demos is demos.play_demos and train_on_demos is demos.train_on_demos
        assert PPOConfig is ppojax.PPOConfig
        env = make_text_env("guessing")
        print(type(env).__name__, callable(make_episode_trainer), callable(sft_job), plan)
        """
    )
    result = run_python(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("NumberGuessing True True <function plan")
    warned = re.findall(r"DeprecationWarning: (ppojax\.[\w.]+) is deprecated", result.stderr)
    assert warned == [
        "ppojax.rlhf.agents.demos",
        "ppojax.rlhf.agents.env",
        "ppojax.rlhf.agents.trainer",
        "ppojax.rlhf.apps",
        "ppojax.rlhf.apps.jobs",
        "ppojax.rlhf.sizing",
        "ppojax.config",
    ]


def test_importing_ppojax_warns_nothing_and_imports_none_of_the_old_homes():
    result = run_python(
        "import sys, ppojax\n"
        "print(sorted(m for m in sys.modules if m.startswith(('ppojax.rlhf', 'ppojax.plan'))))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.strip() == "[]"
