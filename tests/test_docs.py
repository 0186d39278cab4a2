"""The pages a user reads hold true: docs/configuration.md lists every PPOConfig field once,
with its type, default and whether it is static or traced, and no field PPOConfig lacks; the
README keeps the line CI runs and the learning-table markers; relative links point to files."""

import ast
import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pytest
from benchmark_script import run_benchmark

import ppojax

ROOT = Path(__file__).resolve().parents[1]


HEADER = ["field", "type", "default", "kind", "meaning"]


def split_row(line: str) -> list[str]:
    """The cells of a markdown table row, stripped (no cell of these tables holds a '|')."""
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def unquote(cell: str) -> str:
    """A cell's text without the backticks of a code span."""
    return cell.replace("`", "").strip()


def field_rows(text: str) -> list[dict[str, str]]:
    """Every row of every table whose header is HEADER, as {column: cell}."""
    rows, columns = [], None
    for line in text.splitlines():
        if not line.startswith("|"):
            columns = None
            continue
        cells = split_row(line)
        if columns is None:
            columns = cells
        elif columns == HEADER and not set("".join(cells)) <= set("-: "):
            assert len(cells) == len(HEADER), f"docs/configuration.md: {line!r}"
            rows.append(dict(zip(HEADER, cells, strict=True)))
    return rows


def documented() -> dict[str, dict[str, str]]:
    rows = field_rows((ROOT / "docs" / "configuration.md").read_text())
    names = [unquote(row["field"]) for row in rows]
    twice = sorted({name for name in names if names.count(name) > 1})
    assert not twice, f"docs/configuration.md lists these fields more than once: {twice}"
    return {unquote(row["field"]): row for row in rows}


FIELDS = {field.name: field for field in dataclasses.fields(ppojax.PPOConfig)}


def test_the_parser_reads_a_table_and_skips_other_tables():
    text = "\n".join(
        [
            "| property | value |",
            "|---|---|",
            "| `batch_size` | x |",
            "",
            "| field | type | default | kind | meaning |",
            "|---|---|---|---|---|",
            "| `gamma` | `float` | `0.99` | traced | discount |",
        ]
    )
    assert field_rows(text) == [
        {
            "field": "`gamma`",
            "type": "`float`",
            "default": "`0.99`",
            "kind": "traced",
            "meaning": "discount",
        }
    ]


def test_every_field_is_documented_and_every_documented_field_exists():
    rows = documented()
    assert sorted(set(FIELDS) - set(rows)) == [], "fields missing from docs/configuration.md"
    assert sorted(set(rows) - set(FIELDS)) == [], "docs/configuration.md lists no such field"


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_a_fields_default_type_and_kind_are_as_documented(name):
    row = documented()[name]
    field = FIELDS[name]
    default = ast.literal_eval(unquote(row["default"]))
    assert default == field.default, row
    # 1 == True == 1.0 in Python: the documented default must have the field's own type too
    # (env_kwargs' EnvKwargs is a dict, written as one)
    expected = dict if isinstance(field.default, dict) else type(field.default)
    assert type(default) is expected, row
    assert unquote(row["type"]).replace(" or ", " | ") == str(field.type), row
    static = not field.metadata.get("pytree_node", True)
    assert row["kind"] == ("static" if static else "traced"), row
    assert row["meaning"], row


def vocabulary_rows() -> list[list[str]]:
    """The rows of configuration.md's table of names shared with RLHFConfig."""
    rows, columns = [], None
    for line in (ROOT / "docs" / "configuration.md").read_text().splitlines():
        if not line.startswith("|"):
            columns = None
            continue
        cells = split_row(line)
        if columns is None:
            columns = cells
        elif columns == ["name", "in", "meaning"] and not set("".join(cells)) <= set("-: "):
            rows.append(cells)
    return rows


def test_the_vocabulary_table_holds_for_both_configs():
    """Each name is a field of the config(s) its row says, and of no other; the RLHF names
    no longer in use are no field."""
    from ppojax.rlhf import RLHFConfig

    configs = {
        "PPOConfig": {f.name for f in dataclasses.fields(ppojax.PPOConfig)},
        "RLHFConfig": {f.name for f in dataclasses.fields(RLHFConfig)},
    }
    rows = vocabulary_rows()
    assert len(rows) >= 10
    for names, where, meaning in rows:
        wanted = set(configs) if where == "both" else {where}
        for name in re.findall(r"`(\w+)`", names):
            assert {c for c, fields in configs.items() if name in fields} == wanted, name
        assert meaning
    assert not {"ppo_epochs", "target_kl"} & configs["RLHFConfig"]


def test_the_readme_keeps_the_test_command_ci_runs():
    lines = (ROOT / "README.md").read_text().splitlines()
    marker = lines.index("<!-- test-command: .ci/run runs the next line verbatim -->")
    assert lines[marker + 1] == "```bash"
    assert lines[marker + 2] == (
        'python3 -m venv .venv && .venv/bin/pip install -e ".[dev,gpu-aot,tpu-aot]" && '
        "JAX_PLATFORMS=cpu PPOJAX_REQUIRE_GPU_AOT=1 PPOJAX_REQUIRE_TPU_AOT=1 "
        ".venv/bin/python -m pytest -q -n 2 --dist worksteal --durations=20"
    )
    marker = lines.index("<!-- test-command-3.12: .ci/run runs the next line verbatim too -->")
    assert lines[marker + 1] == "```bash"
    assert lines[marker + 2] == (
        'python3.12 -m venv .venv-3.12 && .venv-3.12/bin/pip install -e ".[dev,gpu-aot,tpu-aot]" '
        "&& JAX_PLATFORMS=cpu PPOJAX_REQUIRE_GPU_AOT=1 PPOJAX_REQUIRE_TPU_AOT=1 "
        ".venv-3.12/bin/python -m pytest -q -n 2 --dist worksteal "
        '-m "jax_surface and not slow and not heavy" --durations=20'
    )


def relative_links(text: str) -> list[str]:
    """The targets of markdown links and images that are paths in the repository (no URL, no
    pure anchor), without their anchors."""
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [
        target.split("#")[0]
        for target in targets
        if not re.match(r"[a-z]+:", target) and not target.startswith("#")
    ]


def test_relative_links_finds_paths_and_skips_urls_and_anchors():
    text = "[a](docs/guide.md#sweeps) [b](https://x.org/y.md) [c](#top) ![d](../x.png)"
    assert relative_links(text) == ["docs/guide.md", "../x.png"]


PAGES = [
    "README.md",
    "benchmarks/README.md",
    *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
]


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_of_a_page_points_to_a_file(page):
    path = ROOT / page
    missing = [
        link for link in relative_links(path.read_text()) if not (path.parent / link).exists()
    ]
    assert missing == [], f"{page} links to files that do not exist"


def test_the_readme_has_the_learning_table_markers():
    text = (ROOT / "README.md").read_text()
    start = text.index("<!-- learning-table:start -->")
    assert start < text.index("<!-- learning-table:end -->")


def readme_as_written_by(script: str, tmp_path: Path) -> str:
    """The README after ``python benchmarks/SCRIPT.py --readme`` rewrote a copy of it."""
    copy = tmp_path / "README.md"
    copy.write_text((ROOT / "README.md").read_text())
    run_benchmark(script, "--readme", str(copy))
    return copy.read_text()


def test_the_readme_learning_table_is_the_one_learning_py_makes_from_the_result_file(tmp_path):
    """The README's learning rows are generated, never typed: they equal what
    ``python benchmarks/learning.py --readme README.md`` writes from learning.json."""
    assert readme_as_written_by("learning", tmp_path) == (ROOT / "README.md").read_text(), (
        "run python benchmarks/learning.py --readme README.md"
    )


def test_the_readme_speed_table_is_the_one_compare_py_makes_from_the_result_files(tmp_path):
    """The README's speed rows are generated, never typed: they equal what
    ``python benchmarks/compare.py --readme README.md`` writes from the compare-*.json files."""
    assert readme_as_written_by("compare", tmp_path) == (ROOT / "README.md").read_text(), (
        "run python benchmarks/compare.py --readme README.md"
    )


TINY_CARTPOLE = {"num_envs": 2, "num_steps": 8, "total_timesteps": 320, "num_minibatches": 1}


def learning_with_preset(preset: dict, *args: str, check: bool = True):
    """``learning.py ARGS`` run while CartPole-v1's preset is ``preset``."""
    before = f"import ppojax\nppojax.PRESETS['CartPole-v1'] = {preset!r}"
    return run_benchmark("learning", *args, before=before, check=check)


@pytest.mark.heavy
def test_learning_rows_come_from_run_folders_of_presets_and_mark_an_earlier_preset(
    tmp_path, monkeypatch
):
    """``learning.py --from-run``: a ``ppojax train`` folder of today's preset gives the row a
    run of learning.py computes (final training return over the last 5% of updates, the last
    evaluation); one whose config differs from the preset is refused by field, and a row whose
    preset has changed since is marked in the table with the values it was measured with."""
    from ppojax.runs import folder
    from ppojax.runs.experiment import Experiment, run_experiment

    preset = {**TINY_CARTPOLE, "eval_every": 10}
    monkeypatch.setitem(ppojax.PRESETS, "CartPole-v1", preset)
    run_dir, out = tmp_path / "run", tmp_path / "learning.json"
    run_experiment(Experiment(ppojax.PPOConfig.preset("CartPole-v1"), seeds=2), run_dir)
    learning_with_preset(preset, "--from-run", str(run_dir), "--out", str(out))
    (row,) = json.loads(out.read_text())["tasks"]
    _, metrics = folder.read_metrics(run_dir / folder.METRICS_FILE)
    returns = np.asarray(metrics["episode_return"], np.float64)  # [2, 20]: the last update
    expected = returns[:, -1]

    def per_seed(name):  # JSON has no NaN: None where no episode ended
        return np.asarray([np.nan if v is None else v for v in row[name]], np.float64)

    # the row keeps 2 decimals: equal to within half a unit of the last
    np.testing.assert_allclose(per_seed("final_training_return_per_seed"), expected, atol=0.005)
    evals = np.asarray(metrics["eval_return"], np.float64)
    np.testing.assert_allclose(per_seed("final_eval_return_per_seed"), evals[:, -1], atol=0.005)
    assert row["task"] == "CartPole-v1" and row["seeds"] == 2 and row["budget"] == 320
    table = learning_with_preset(preset, "--table", "--out", str(out)).stdout
    assert "| CartPole-v1 | 320 |" in table and "earlier preset" not in table

    changed = {**preset, "gamma": 0.9}
    refused = learning_with_preset(changed, "--from-run", str(run_dir), check=False)
    assert refused.returncode != 0
    assert "differs from the CartPole-v1 preset in gamma" in refused.stderr
    table = learning_with_preset(changed, "--table", "--out", str(out)).stdout.strip()
    assert "| CartPole-v1 * | 320 |" in table
    assert table.endswith("earlier preset, where it differed: CartPole-v1: gamma 0.99")


def test_the_pbt_tables_in_the_docs_are_the_result_file_s():
    # the guide and benchmarks/README.md copy pbt.py's summary table: it must not go stale.
    printed = run_benchmark("pbt", "--table").stdout
    table = printed.split("\n\n")[0].strip()
    assert table.startswith("| task | budget per member |")
    for doc in (ROOT / "docs" / "guide.md", ROOT / "benchmarks" / "README.md"):
        assert table in doc.read_text(), f"{doc}: rerun `python benchmarks/pbt.py --table`"


def test_the_plan_table_in_the_rlhf_guide_is_the_result_file_s():
    table = run_benchmark("plan", "--table").stdout.strip()
    assert table.startswith("| model | step | GPUs |")
    guide = ROOT / "docs" / "rlhf.md"
    assert table in guide.read_text(), f"{guide}: rerun `python benchmarks/plan.py --table`"


def test_the_agents_table_in_the_rlhf_guide_is_the_result_files():
    table = run_benchmark("agents_sft", "--table").stdout.strip()
    assert table.startswith("| env | seed | success after SFT | SFT + GRPO | SFT + PPO |")
    guide = ROOT / "docs" / "rlhf.md"
    assert table in guide.read_text(), f"{guide}: rerun `python benchmarks/agents_sft.py --table`"


def test_the_shell_agents_table_in_the_rlhf_guide_is_the_result_files():
    table = run_benchmark("agents_shell", "--table").stdout.strip()
    assert table.startswith("| env | seed | success at step 0 | after SFT | after RL |")
    guide = ROOT / "docs" / "rlhf.md"
    assert table in guide.read_text(), f"{guide}: rerun `python benchmarks/agents_shell.py --table`"


def test_the_shell_agents_ppo_table_in_the_rlhf_guide_is_the_result_files():
    table = run_benchmark("agents_shell", "--algorithm", "ppo", "--table").stdout.strip()
    assert table.startswith("| env | seed | success at step 0 | after SFT | after RL |")
    guide = ROOT / "docs" / "rlhf.md"
    assert table in guide.read_text(), (
        f"{guide}: rerun `python benchmarks/agents_shell.py --algorithm ppo --table`"
    )


def test_the_precision_table_in_the_rlhf_guide_is_the_result_file_s():
    table = run_benchmark("precision", "--table").stdout.strip()
    assert table.startswith("| run | state | compute | first 10 steps |")
    guide = ROOT / "docs" / "rlhf.md"
    assert table in guide.read_text(), f"{guide}: rerun `python benchmarks/precision.py --table`"


def table_cells(table: str, column: int) -> dict[str, str]:
    """A markdown table's ``column`` (0 = the task), by task (its * mark dropped)."""
    rows = [line.split(" | ") for line in table.splitlines()[2:] if line.startswith("| ")]
    return {row[0][2:].removesuffix(" *"): row[column] for row in rows}


def test_learning_py_s_table_takes_the_fresh_seed_column_from_seeds_json_beside_it(tmp_path):
    """The worst seed and the never-learning count of a task seeds.py ran, "not run" with the
    reason's kind for one it lists as not run, "-" for one it does not know (a variant); no
    column without seeds.json."""
    out = tmp_path / "learning.json"
    out.write_text((ROOT / "benchmarks" / "results" / "learning.json").read_text())
    without = run_benchmark("learning", "--table", "--out", str(out)).stdout
    robustness = {
        "seeds": 16,
        "tasks": [{"task": "Pendulum-v1", "worst": -171.26, "never_learn": 1, "seeds": 16}],
        "not_run": [
            {"task": "Breakout-MinAtar", "not_run": "needs a GPU: hours on a 2-core CPU"},
            {"task": "navix/Navix-Empty-5x5-v0", "not_run": "no published return"},
        ],
    }
    (tmp_path / "seeds.json").write_text(json.dumps(robustness))
    table = run_benchmark("learning", "--table", "--out", str(out)).stdout
    assert table.splitlines()[0].count("|") == without.splitlines()[0].count("|") + 1
    assert "| 16 fresh seeds: worst; never learn |" in table.splitlines()[0]
    cells = table_cells(table, 4)
    assert cells["Pendulum-v1"] == "-171.3; 1 of 16"
    assert cells["Breakout-MinAtar"] == "not run (GPU)"
    assert cells["navix/Navix-Empty-5x5-v0"] == "not run (no midpoint)"
    assert cells["CartPole-v1:bf16"] == "-"
    assert table_cells(without, 4) == table_cells(table, 5)  # the published column moved on


@pytest.mark.heavy
def test_seeds_py_counts_the_seeds_below_the_random_published_midpoint(tmp_path):
    """Two seeds of CartPole and MountainCar trained 1024 steps: the midpoint is halfway from
    the random policy's return to the published one, and every seed below it is counted.
    MountainCar pays -1 a step until the flag, which uniformly random actions never reach in
    the 200-step limit, so its random return is exactly -200 (midpoint (-200 - 118) / 2);
    CartPole's random episodes last about 22 steps."""
    out = tmp_path / "seeds.json"
    args = ("--tasks", "CartPole-v1", "MountainCar-v0", "--seeds", "2")
    run_benchmark("seeds", *args, "--total-timesteps", "1024", "--out", str(out))
    result = json.loads(out.read_text())
    cartpole, mountain_car = result["tasks"]
    assert mountain_car["random_return"] == -200.0 and mountain_car["midpoint"] == -159.0
    assert 18.0 < cartpole["random_return"] < 27.0, cartpole["random_return"]
    assert cartpole["midpoint"] == pytest.approx((cartpole["random_return"] + 500) / 2, abs=0.01)
    for row in (cartpole, mountain_car):
        finals = np.asarray(row["final_return_per_seed"])
        assert row["never_learn_seeds"] == np.flatnonzero(finals < row["midpoint"]).tolist()
        assert row["never_learn"] == len(row["never_learn_seeds"])
        assert row["worst"] == finals.min() and row["worst_seed"] == finals.argmin()
        assert row["mean"] == pytest.approx(finals.mean(), abs=0.01)
        assert len(row["final_entropy_per_seed"]) == 2
    assert "Pendulum-v1" not in {row["task"] for row in result["tasks"]}
    not_run = {row["task"]: row["not_run"] for row in result["not_run"]}
    assert "GPU" in not_run["Breakout-MinAtar"] and "CartPole-v1:bf16" not in not_run
