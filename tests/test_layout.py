"""docs/layout.md lists every module of the package once, in tiers, and the imports between
modules go down or across the tiers only, without a cycle (read from the source, nothing
imported)."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYOUT = ROOT / "docs" / "layout.md"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def tiers_of(text: str) -> dict[str, int]:
    """Module name -> tier number, from the page's '## Tier N' sections and their paths."""
    tiers: dict[str, int] = {}
    tier = None
    for line in text.splitlines():
        heading = re.match(r"## Tier (\d+)", line)
        if heading:
            tier = int(heading.group(1))
            continue
        for path in re.findall(r"`(ppojax/[\w/]+\.py)`", line):
            assert tier is not None, f"docs/layout.md lists {path} before any tier"
            name = module_name(ROOT / path)
            assert name not in tiers, f"docs/layout.md lists {path} twice"
            tiers[name] = tier
    return tiers


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports, at any depth of its code."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            # ``from a import b``: the module a.b where there is one, else a itself
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        found.update(target for target in targets if target in modules and target != name)
    return found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a list of nodes, or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:  # on the path: the path from it back to it
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target, [*path, target])):
                return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start, [start])):
            return cycle
    return None


def package_imports() -> tuple[dict[str, int], dict[str, set[str]]]:
    files = {module_name(path): path for path in sorted((ROOT / "ppojax").rglob("*.py"))}
    graph = {name: imports_of(path, set(files)) for name, path in files.items()}
    return tiers_of(LAYOUT.read_text()), graph


def test_every_module_is_listed_once_and_every_listed_module_exists():
    tiers, graph = package_imports()
    assert sorted(set(graph) - set(tiers)) == [], "modules missing from docs/layout.md"
    assert sorted(set(tiers) - set(graph)) == [], "docs/layout.md lists modules that are gone"


def test_imports_go_down_or_across_the_tiers_without_a_cycle():
    tiers, graph = package_imports()
    upward = sorted(
        f"{source} (tier {tiers[source]}) imports {target} (tier {tiers[target]})"
        for source, targets in graph.items()
        for target in targets
        if tiers.get(target, -1) > tiers.get(source, -1)
    )
    assert upward == [], "move the module to a higher tier in docs/layout.md, or the import"
    assert find_cycle(graph) is None, find_cycle(graph)


def test_the_checks_see_an_upward_import_and_a_cycle():
    """The two checks above on made-up graphs: they are not vacuous."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
    tiers = tiers_of(
        "## Tier 0: x\n- `ppojax/ppo/gae.py`: y\n## Tier 3: z\n- `ppojax/ppo/train.py`\n"
    )
    assert tiers == {"ppojax.ppo.gae": 0, "ppojax.ppo.train": 3}
    with pytest.raises(AssertionError, match="twice"):
        tiers_of("## Tier 0\n- `ppojax/ppo/gae.py`, `ppojax/ppo/gae.py`\n")
    _, graph = package_imports()
    assert "ppojax.engine.gae" in graph["ppojax.ppo.train"]
    assert "ppojax.runs.plots" in graph["ppojax.cli.report"]  # imported inside a function only


def test_rlhf_builds_on_the_shared_engine_not_on_env_ppo():
    """The LM half depends on what both halves share (ppojax.engine), never on env PPO."""
    _, graph = package_imports()
    into_ppo = sorted(
        f"{source} imports {target}"
        for source, targets in graph.items()
        if source.startswith("ppojax.rlhf")
        for target in targets
        if target == "ppojax.ppo" or target.startswith("ppojax.ppo.")
    )
    assert into_ppo == [], "move what both halves need into ppojax/engine/"
    assert any(target.startswith("ppojax.engine") for target in graph["ppojax.rlhf.core.trainer"])


def test_rlhf_is_library_code_below_the_host_side():
    """ppojax.rlhf imports nothing of the host side (ppojax.runs) or the command line: its run
    folders live in ppojax.runs.lm, above both halves."""
    _, graph = package_imports()
    upward = sorted(
        f"{source} imports {target}"
        for source, targets in graph.items()
        if source.startswith("ppojax.rlhf")
        for target in targets
        if target.startswith(("ppojax.runs", "ppojax.cli"))
    )
    assert upward == [], "move host-side code into ppojax/runs/lm/"
    assert any(target.startswith("ppojax.rlhf") for target in graph["ppojax.runs.lm.jobs"])


def test_rlhf_text_envs_sit_below_the_trainer_and_nothing_imports_the_old_agents_package():
    """Inside ppojax.rlhf the rooms go envs -> core -> models -> post: the text envs import
    nothing of the trainer (core plays them), and no module imports the deprecated
    ppojax.rlhf.agents, which keeps its old names a release for users only."""
    _, graph = package_imports()
    up = sorted(
        f"{source} imports {target}"
        for source, targets in graph.items()
        if source.startswith("ppojax.rlhf.envs")
        for target in targets
        if target.startswith("ppojax.rlhf.") and not target.startswith("ppojax.rlhf.envs")
    )
    assert up == [], "the text envs must not import the trainer: move it to ppojax/rlhf/core/"
    assert "ppojax.rlhf.envs.env" in graph["ppojax.rlhf.core.episodes"]
    old = sorted(source for source, targets in graph.items() if "ppojax.rlhf.agents" in targets)
    assert old == [], "import from ppojax.rlhf.envs, core or post, not the deprecated agents"
