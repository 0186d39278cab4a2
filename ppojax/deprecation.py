"""Old module paths and names kept importing for a release, from the data in ``ppojax.moved``.

One finder on ``sys.meta_path`` (``install``, called first thing by ``import ppojax``) serves
both kinds of entry, importing nothing until one is asked for:

- a module that is gone imports as an alias module holding its old public names, each the
  object at its new home, with one ``DeprecationWarning`` naming that home;
- a module that stays but lost names gets a module ``__getattr__`` (unless it defines one,
  as ``ppojax.rlhf`` does) that returns each lost name from its new home with a warning.

A name removed with no successor is an ``AttributeError`` saying what to use instead, or that
nothing replaces it."""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence

from ppojax.moved import EARLIER_PATHS, GONE_MODULES, MOVED_NAMES, REMOVED_IN, REMOVED_NAMES

# The modules that stay and get a __getattr__: those with moved names or removed ones.
REMOVED_FROM = {name.rpartition(".")[0] for name in REMOVED_NAMES}
HOOKED = {*MOVED_NAMES, *REMOVED_FROM} - {*GONE_MODULES, *EARLIER_PATHS}


def resolve(where: str) -> object:
    """The object at ``where``, a "module.attribute" path, importing its module."""
    module, _, attribute = where.rpartition(".")
    return getattr(importlib.import_module(module), attribute)


def moved_alias(package: str, name: str, where: str | None, stacklevel: int = 3) -> object:
    """A package's ``__getattr__`` for its deprecated ``name``: the object at ``where``
    (``module.attribute``), imported now, with a ``DeprecationWarning`` at the caller's
    line; an ``AttributeError`` where ``where`` is None (no such name). The default
    ``stacklevel`` goes past this function and the ``__getattr__`` to the line that asked."""
    if where is None:
        raise AttributeError(f"module '{package}' has no attribute {name!r}")
    warnings.warn(
        f"{package}.{name} is deprecated: use {where} (the alias goes in ppojax {REMOVED_IN})",
        DeprecationWarning,
        stacklevel=stacklevel,
    )
    return resolve(where)


def moved_attribute(module: str, name: str) -> object:
    """``module``'s ``__getattr__`` from the data: a moved name from its new home with a
    warning, a removed one as an ``AttributeError`` saying what to use instead."""
    # an earlier path of a gone module shares the later path's entries
    removed = f"{EARLIER_PATHS.get(module, module)}.{name}"
    if removed in REMOVED_NAMES:
        instead = REMOVED_NAMES[removed]
        raise AttributeError(
            f"{module}.{name} was removed"
            + (", with nothing in its place" if instead is None else f": use {instead}")
        )
    # stacklevel 4: past moved_alias, this function and the module's __getattr__
    return moved_alias(module, name, MOVED_NAMES.get(module, {}).get(name), stacklevel=4)


def attribute_hook(module: str):
    """A module ``__getattr__`` for ``module``'s moved and removed names."""

    def __getattr__(name: str) -> object:  # noqa: N807  the module hook's own name
        return moved_attribute(module, name)

    return __getattr__


def gone(old: str) -> tuple[str, dict[str, str]]:
    """A gone path's entry: its home and its names (an earlier path's, the later path's)."""
    return GONE_MODULES[EARLIER_PATHS.get(old, old)]


def homes(old: str) -> list[str]:
    """The modules that hold a gone module's names now, its main home first."""
    home, names = gone(old)
    found = [home]
    for where in names.values():
        module = where.rpartition(".")[0]
        if module not in found:
            found.append(module)
    return found


class AliasLoader(importlib.abc.Loader):
    """Makes the alias module of a gone path: its public names set to the objects at their
    new homes, one DeprecationWarning naming those homes, removed names left to
    ``moved_attribute``."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        old = module.__name__
        # the import system's own frames are skipped: stacklevel 2 is the importing line
        warnings.warn(
            f"{old} is deprecated: import from {', '.join(homes(old))}"
            f" (the alias goes in ppojax {REMOVED_IN})",
            DeprecationWarning,
            stacklevel=2,
        )
        names = gone(old)[1]
        module.__doc__ = f"Deprecated alias of {homes(old)[0]}, removed in ppojax {REMOVED_IN}."
        module.__all__ = list(names)
        module.__getattr__ = attribute_hook(old)
        for name, where in names.items():
            setattr(module, name, resolve(where))


class HookedLoader(importlib.abc.Loader):
    """A module's own loader, which then gives the module the ``__getattr__`` of its moved
    names unless it defines one itself."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> object:
        return getattr(self.loader, name)  # get_source, get_filename, ...: the real loader's

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self.loader.exec_module(module)
        hook(module)


def hook(module: types.ModuleType) -> None:
    if "__getattr__" not in vars(module):
        module.__getattr__ = attribute_hook(module.__name__)


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the gone paths (as aliases) and the modules whose names moved or went (as
    themselves, hooked); every other import passes by."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname in GONE_MODULES or fullname in EARLIER_PATHS:
            # a path that was a package keeps one, so that its old submodules import too
            package = any(other.startswith(f"{fullname}.") for other in GONE_MODULES)
            return importlib.util.spec_from_loader(fullname, AliasLoader(), is_package=package)
        if fullname in HOOKED:
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = HookedLoader(spec.loader)
            return spec
        return None


def install() -> None:
    """Puts the finder first on ``sys.meta_path`` (once), and hooks the modules with moved
    or removed names that are imported already."""
    if not any(isinstance(finder, MovedFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
    for name in HOOKED:
        if name in sys.modules:
            hook(sys.modules[name])
