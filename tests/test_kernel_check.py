"""ppojax.runtime.kernel_check and ``ppojax doctor``: a platform default proves itself on the
device before a program keeps it. Driven on the CPU through ``fake_accelerator``: a kernel
that fails at lowering (a Pallas call outside the interpreter, which a CPU cannot lower), one
that computes another number and one that is right, each with its verdict, the program's
fallback, a single warning, the stored file and a recheck; then the bad files, an unwritable
folder, and a CPU program unchanged with the check present."""

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import pallas as pl

import ppojax
from ppojax.cli import doctor
from ppojax.cli.commands import main
from ppojax.runtime import kernel_check, kernels
from ppojax.runtime.kernel_check import KernelCheckWarning, Probe, Trial

DEVICE = kernel_check.Accelerator("cuda", "Fake GPU")
FAILS_TO_LOWER, WRONG, RIGHT = "associative_gae", "elementwise_argmax", "packed_steps"


def compiled_pallas_sin(x):
    """sin(x) in a Pallas kernel compiled for the device (not interpreted): a CPU refuses to
    lower it, as a GPU whose Triton cannot lower a kernel would."""

    def body(x_ref, out_ref):
        out_ref[...] = jnp.sin(x_ref[...])

    return pl.pallas_call(body, out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype))(x)


FAKE_KERNELS = {
    FAILS_TO_LOWER: compiled_pallas_sin,
    WRONG: lambda x: jnp.sin(x) + 1e-3,  # 1e-3 off: thousands of ulps
    RIGHT: jnp.sin,
}


class Probes(dict):
    """Fake probes of the three kernels above (sin on 8 floats, 4 ulps), counting builds:
    a build is a check."""

    def __init__(self, kernels_by_name=FAKE_KERNELS, plain=jnp.sin):
        self.builds: list[str] = []
        for name, kernel in kernels_by_name.items():
            self[name] = Probe(self._builder(name, kernel, plain))

    def _builder(self, name, kernel, plain):
        def build(dtype, large):
            self.builds.append(name)
            x = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
            return Trial(plain, kernel, (x,), ulps=4)

        return build


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    """A fresh cache folder and a process that has checked nothing."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    kernel_check.forget()
    yield tmp_path / "cache" / "ppojax"
    kernel_check.forget()


def program(name):
    """A program's call of the platform default ``name``: plain x * 2, the candidate sin."""
    return kernels.by_platform(name, lambda x: x * 2.0, jnp.sin)


def traced(name) -> str:
    return str(jax.make_jaxpr(lambda x: program(name)(x))(jnp.ones(8)))


def kernel_warnings(record) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, KernelCheckWarning)]


def stored_entries(folder):
    data = json.loads((folder / kernel_check.FILE_NAME).read_text())
    assert data["format"] == kernel_check.FORMAT and data["version"] == kernel_check.FORMAT_VERSION
    return data["entries"]


@pytest.mark.parametrize(
    "name, works, reason",
    [
        (FAILS_TO_LOWER, False, "it does not compile"),
        (WRONG, False, "it computes another result"),
        (RIGHT, True, "it agrees with its plain form"),
    ],
)
def test_a_kernel_is_checked_once_kept_or_dropped_warned_stored_and_rechecked(
    cache_home, name, works, reason
):
    probes = Probes()
    with warnings.catch_warnings(record=True) as record, kernel_check.fake_accelerator(probes):
        warnings.simplefilter("always")
        first, second = traced(name), traced(name)  # two programs, one check
        assert probes.builds == [name]
        # the fallback: a dropped kernel leaves the plain form alone in the program; a kept
        # one is traced beside it for the platform's lowering
        assert ("sin" in first) is works and first == second
        # what the CPU runs of a program keeping it is still the plain form
        out = jax.jit(lambda x: program(name)(x))(jnp.arange(3.0))
        np.testing.assert_array_equal(out, jnp.arange(3.0) * 2.0)
    said = kernel_warnings(record)
    if works:
        assert said == []
    else:
        assert len(said) == 1 and "\n" not in said[0]
        assert said[0].startswith(f"kernel {name} (float32) failed its check on Fake GPU: {reason}")
        assert "ppojax doctor --recheck" in said[0] and f"PPOJAX_PLAIN_KERNELS={name}" in said[0]

    # the stored verdict, keyed by device, versions and kernel
    key = kernel_check.entry_key("Fake GPU", name, "float32")
    entry = stored_entries(cache_home)[key]
    assert entry["works"] is works and entry["reason"].startswith(reason)
    assert entry["device"] == "Fake GPU" and entry["kernel"] == name
    assert entry["ppojax"] == ppojax.__version__ and entry["jax"] == jax.__version__
    assert entry["compiled"] is (name != FAILS_TO_LOWER)
    if name == WRONG:
        assert entry["max_error"] > 4 and entry["tolerance"] == 4
    if works:
        assert entry["max_error"] <= entry["tolerance"]

    # a later process reads it and checks nothing; it warns once again where dropped
    kernel_check.forget()
    with warnings.catch_warnings(record=True) as record, kernel_check.fake_accelerator(probes):
        warnings.simplefilter("always")
        assert traced(name) == first
        assert probes.builds == [name]
        assert kernel_check.verdict(name, "float32", DEVICE).source == "stored"
    assert len(kernel_warnings(record)) == (0 if works else 1)

    # a recheck runs the probe again and stores what it finds now
    fixed = Probes({name: jnp.sin})
    with kernel_check.fake_accelerator(fixed):
        again = kernel_check.verdict(name, "float32", DEVICE, recheck=True)
    assert fixed.builds == [name] and again.works and again.source == "checked"
    assert stored_entries(cache_home)[key]["works"] is True


def test_a_program_keeps_the_kernels_that_pass_and_drops_the_others(cache_home):
    probes = Probes()
    with warnings.catch_warnings(record=True) as record, kernel_check.fake_accelerator(probes):
        warnings.simplefilter("always")
        jaxpr = str(jax.make_jaxpr(lambda x: [program(name)(x) for name in FAKE_KERNELS])(1.0))
    assert jaxpr.count("sin") == 1  # the right one's
    assert sorted(probes.builds) == sorted(FAKE_KERNELS)
    assert len(kernel_warnings(record)) == 2
    assert len(stored_entries(cache_home)) == 3


def test_a_tpu_checks_its_own_defaults_only(cache_home):
    """On a TPU the check covers TPU_DEFAULTS; "packed_steps", CUDA's alone, is not traced
    for a TPU at all, so it is never checked there."""
    probes = Probes()
    with (
        warnings.catch_warnings(record=True) as record,
        kernel_check.fake_accelerator(probes, kind="Fake TPU", platform="tpu"),
    ):
        warnings.simplefilter("always")
        assert "sin" not in traced(FAILS_TO_LOWER)  # a TPU default that fails there
        assert "sin" not in traced(RIGHT)  # not a TPU default: the plain form, unchecked
    assert probes.builds == [FAILS_TO_LOWER]
    assert kernel_warnings(record)[0].startswith(f"kernel {FAILS_TO_LOWER} (float32) failed")
    entry = stored_entries(cache_home)[
        kernel_check.entry_key("Fake TPU", FAILS_TO_LOWER, "float32")
    ]
    assert entry["platform"] == "tpu" and not entry["works"]


BAD_FILES = {
    "empty": "",
    "truncated": '{"format": "ppojax kernel checks", "version": 1, "entries": {"Fake',
    "not JSON": "works = true\n",
    "a list": "[1, 2]",
    "another program's": '{"format": "something else", "entries": {}}',
    "another format": '{"format": "ppojax kernel checks", "version": 99, "entries": {}}',
    "entries not an object": '{"format": "ppojax kernel checks", "version": 1, "entries": []}',
}


@pytest.mark.parametrize("kind", list(BAD_FILES))
def test_a_bad_verdict_file_means_a_check_and_is_rewritten(cache_home, kind):
    cache_home.mkdir(parents=True)
    (cache_home / kernel_check.FILE_NAME).write_text(BAD_FILES[kind])
    _, state = kernel_check.read_store()
    assert state not in ("read", "absent")
    probes = Probes()
    with kernel_check.fake_accelerator(probes), warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelCheckWarning)
        assert "sin" in traced(RIGHT)
    assert probes.builds == [RIGHT]
    assert kernel_check.read_store()[1] == "read"
    assert stored_entries(cache_home)[kernel_check.entry_key("Fake GPU", RIGHT, "float32")]["works"]


def stored_right_entry(cache_home, **changes):
    """The file after a check of the right kernel, its entry changed by ``changes``."""
    with kernel_check.fake_accelerator(Probes()):
        kernel_check.verdict(RIGHT, "float32", DEVICE)
    path = cache_home / kernel_check.FILE_NAME
    data = json.loads(path.read_text())
    key = kernel_check.entry_key("Fake GPU", RIGHT, "float32")
    data["entries"][key].update(changes)
    path.write_text(json.dumps(data))
    kernel_check.forget()


@pytest.mark.parametrize(
    "changes",
    [
        {"ppojax": "0.0.1"},  # written by another ppojax version
        {"jaxlib": "0.0.1"},  # ... or another jaxlib
        {"works": "yes"},  # not a bool
        {"device": "Other GPU"},  # not the device of its key
    ],
)
def test_an_entry_of_other_versions_or_malformed_means_a_check(cache_home, changes):
    stored_right_entry(cache_home, **changes)
    probes = Probes()
    with kernel_check.fake_accelerator(probes):
        found = kernel_check.verdict(RIGHT, "float32", DEVICE)
    assert probes.builds == [RIGHT] and found.source == "checked" and found.works


def test_an_entry_of_another_device_is_not_this_device_s(cache_home):
    stored_right_entry(cache_home)
    probes = Probes()
    with kernel_check.fake_accelerator(probes, kind="Other GPU"):
        traced(RIGHT)
    assert probes.builds == [RIGHT]
    assert len(stored_entries(cache_home)) == 2  # both devices' verdicts kept


def test_an_unwritable_cache_folder_checks_in_memory_and_says_so_once(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")  # XDG_CACHE_HOME is a file: its ppojax folder cannot be made
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    kernel_check.forget()
    probes = Probes()
    try:
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            with kernel_check.fake_accelerator(probes):
                assert "sin" in traced(RIGHT) and "sin" not in traced(WRONG)
                traced(RIGHT), traced(WRONG)  # in memory: no second check
        assert sorted(probes.builds) == sorted([RIGHT, WRONG])
        said = kernel_warnings(record)
        memory = [line for line in said if line.startswith("kernel checks kept in memory only")]
        assert len(memory) == 1 and "XDG_CACHE_HOME" in memory[0] and str(blocker) in memory[0]
        assert len(said) == 2  # the memory notice and the dropped kernel
    finally:
        kernel_check.forget()


def test_a_cpu_program_is_unchanged_with_the_check_present(cache_home, tiny_config, monkeypatch):
    """No check runs on the CPU: the lowered text of a CPU program with the check present
    is the one lowered with it removed (no accelerator for it to see), and nothing was
    probed or written. A deviceless compile for CUDA checks nothing either, even where an
    accelerator is attached (here a fake one)."""
    key = jax.random.key(0)
    with monkeypatch.context() as patch:
        patch.setattr(kernel_check, "run_check", trap)
        present = jax.jit(lambda c, k: ppojax.train(c, k)).lower(tiny_config, key).as_text()
    with monkeypatch.context() as patch:
        patch.setattr(kernel_check, "accelerator", lambda: None)
        removed = jax.jit(lambda c, k: ppojax.train(c, k)).lower(tiny_config, key).as_text()
    assert present == removed
    assert not cache_home.exists()
    probes = Probes()
    with kernel_check.fake_accelerator(probes), kernels.lowering_for_cuda():
        assert "sin" in traced(RIGHT)  # both forms traced, as a deviceless compile traces
    assert probes.builds == [] and not cache_home.exists()


def trap(*args, **kwargs):
    raise AssertionError("a kernel check ran")


def test_timing_drops_a_kernel_more_than_10_percent_slower(cache_home, monkeypatch):
    medians = {"value": (1.0, 1.2)}
    monkeypatch.setattr(kernel_check, "paired_medians", lambda *a, **k: medians["value"])
    with kernel_check.fake_accelerator(Probes()):
        slow = kernel_check.verdict(RIGHT, "float32", DEVICE, timing=True)
        assert not slow.works and slow.reason == "it is 20% slower than its plain form here"
        assert (slow.plain_s, slow.kernel_s) == (1.0, 1.2)
        medians["value"] = (1.0, 1.05)
        near = kernel_check.verdict(RIGHT, "float32", DEVICE, timing=True, recheck=True)
        assert near.works
        untimed = kernel_check.verdict(RIGHT, "float32", DEVICE, recheck=True)
        assert untimed.works and untimed.kernel_s is None  # a run's check does not time


def test_paired_medians_alternate_the_forms_and_take_medians():
    calls, ticks = [], iter(range(100))

    def clock():
        return float(next(ticks)) ** 2  # later calls look slower: the pairing cancels it

    plain, kernel = (lambda: calls.append("p")), (lambda: calls.append("k"))
    plain_s, kernel_s = kernel_check.paired_medians(plain, kernel, pairs=4, clock=clock)
    assert calls == ["p", "k"] + ["p", "k", "k", "p"] * 2  # one warm call each, then paired
    assert plain_s > 0 and kernel_s > 0


def test_ulp_error_counts_float32_ulps_and_refuses_other_structures():
    one = np.float32(1.0)
    assert kernel_check.ulp_error([one + np.float32(2**-23)], [one]) == pytest.approx(0.5)
    assert kernel_check.ulp_error(jnp.bfloat16(1.0078125), jnp.float32(1.0)) > 1000
    assert kernel_check.ulp_error(jnp.bfloat16(1.0), jnp.float32(1.0)) == 0.0
    assert kernel_check.ulp_error(np.array([np.nan, 1.0]), np.array([np.nan, 1.0])) == 0.0
    assert kernel_check.ulp_error(np.array([np.nan]), np.array([1.0])) == np.inf
    assert kernel_check.ulp_error(np.array([1, 2]), np.array([1, 3])) == np.inf
    assert kernel_check.ulp_error((one,), [one]) == np.inf
    assert kernel_check.ulp_error(np.ones(2), np.ones(3)) == np.inf
    # absolute: against the scale alone
    assert kernel_check.ulp_error(3.0 + 2**-20, 3.0, scale=1.0, relative=False) == pytest.approx(
        2**-20 / kernel_check.EPS32
    )


def test_every_platform_default_has_a_probe_in_its_program_s_dtypes():
    from ppojax.runs.kernel_probes import PROBES

    assert set(PROBES) == set(kernels.PLATFORM_DEFAULTS)
    assert PROBES["pallas_decode_attention"].dtype_for("bfloat16") == "bfloat16"
    assert PROBES["associative_gae"].dtype_for("bfloat16") == "float32"
    assert kernel_check.program_dtype((jnp.ones(2, jnp.bfloat16), jnp.ones(2))) == "bfloat16"
    assert kernel_check.program_dtype((jnp.ones(2, jnp.int32),)) == "float32"


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.heavy) if name == "pallas_ppo_loss" else name
        for name in kernels.PLATFORM_DEFAULTS
    ],
)  # the loss probe builds two agents and traces the kernel's gradient: 36 s on 2 busy cores
def test_each_probe_traces_its_kernel_in_one_form_and_not_the_other(name):
    """A probe compares two programs, not one with itself: the kernel's form traces another
    program than the plain form's (a Pallas call, an associative scan, a packed scan...)."""
    from ppojax.runs.kernel_probes import PROBES

    trial = PROBES[name].build("float32", False)
    plain_form, kernel_form = kernels._check_forms(name)
    texts = []
    for fn, form in ((trial.plain, plain_form), (trial.kernel, kernel_form)):
        with form():
            texts.append(str(jax.make_jaxpr(lambda *a, fn=fn: fn(*a))(*trial.args)))
    assert texts[0] != texts[1]
    if name.startswith("pallas_"):
        assert "pallas_call" in texts[1] and "pallas_call" not in texts[0]


# the real probes on this CPU, Pallas's kernels in its interpreter (``ppojax doctor --interpret``)
CPU_AS_DEVICE = kernel_check.Accelerator("cuda", "cpu")


@pytest.mark.parametrize("name", ["associative_gae", "elementwise_argmax"])
def test_the_real_probes_pass_on_the_cpu(name):
    found = kernel_check.check_here(name, "float32", CPU_AS_DEVICE, timing=False)
    assert found.works, found.reason
    assert found.compiled and found.max_error <= found.tolerance


@pytest.mark.heavy
@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
@pytest.mark.parametrize(
    "name, dtype",
    [
        ("pallas_ppo_loss", "float32"),
        ("packed_steps", "float32"),
        ("flat_params", "float32"),
        ("elementwise_argmax", "bfloat16"),
        ("pallas_decode_attention", "float32"),
        ("pallas_decode_attention", "bfloat16"),
    ],
)
def test_the_other_real_probes_pass_in_pallas_s_interpreter(name, dtype):
    found = kernel_check.check_here(name, dtype, CPU_AS_DEVICE, timing=False)
    assert found.works, found.reason


# ppojax doctor


def test_doctor_says_plainly_that_no_accelerator_is_present(cache_home, tmp_path, capsys):
    assert main(["doctor", "--json", str(tmp_path / "table.json")]) == 0
    out = capsys.readouterr().out
    assert "device: no accelerator (JAX's default backend is cpu)" in out
    assert "ppojax doctor --interpret" in out and "Traceback" not in out
    report = json.loads((tmp_path / "table.json").read_text())
    assert report["device"] is None and report["kernels"] == []
    assert report["verdict_file"] == str(cache_home / kernel_check.FILE_NAME)


@pytest.mark.parametrize("where", ["missing/table.json", "."])
def test_doctor_refuses_a_json_path_it_cannot_write(tmp_path, capsys, where):
    assert main(["doctor", "--json", str(tmp_path / where)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"ppojax doctor: error: --json {tmp_path / where}")


def test_doctor_says_in_one_line_that_it_keeps_the_verdicts_in_memory(
    tmp_path, monkeypatch, capsys
):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    monkeypatch.setattr(kernel_check, "paired_medians", lambda *a, **k: (1.0, 1.0))
    try:
        with kernel_check.fake_accelerator(all_defaults()):
            assert doctor.main([]) == 0
    finally:
        kernel_check.forget()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("ppojax doctor: warning: kernel checks kept in memory only")


def all_defaults(slow=(), failing_plain=()):
    """Fake probes of all six CUDA defaults: WRONG computes another number, the rest sin."""
    probes = Probes({name: FAKE_KERNELS.get(name, jnp.sin) for name in kernels.CUDA_DEFAULTS})
    for name in failing_plain:
        probes[name] = Probe(lambda dtype, large: Trial(trap, jnp.sin, (np.ones(2),), ulps=4))
    return probes


def test_doctor_checks_each_default_times_it_stores_and_rechecks(
    cache_home, tmp_path, capsys, monkeypatch
):
    times = {"flat_params": (1.0, 1.5)}  # 50% slower there: dropped

    def medians(plain, kernel, **_):
        plain(), kernel()
        return times.get(probes.builds[-1], (2.0, 1.0))

    monkeypatch.setattr(kernel_check, "paired_medians", medians)
    probes = all_defaults()
    table = tmp_path / "doctor.json"
    with kernel_check.fake_accelerator(probes), warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelCheckWarning)
        assert doctor.main(["--json", str(table)]) == 0  # the plain forms all work
        first = capsys.readouterr().out
        report = json.loads(table.read_text())
        rows = {row["kernel"]: row for row in report["kernels"]}
        assert report["device"] == "Fake GPU" and report["platform"] == "cuda"
        assert set(rows) == set(kernels.CUDA_DEFAULTS)
        assert rows[FAILS_TO_LOWER]["compiled"] is False
        assert rows[FAILS_TO_LOWER]["verdict"].startswith("dropped: it does not compile")
        assert rows[WRONG]["verdict"].startswith("dropped: it computes another result")
        slower = "dropped: it is 50% slower than its plain form here"
        assert rows["flat_params"]["verdict"] == slower
        assert rows[RIGHT]["verdict"] == "kept" and rows[RIGHT]["kernel_s"] == 1.0
        assert "Fake GPU" in first and "(stored)" not in first
        built = len(probes.builds)
        # again: the stored verdicts, timed already, are read
        assert doctor.main([]) == 0
        assert len(probes.builds) == built and "(stored)" in capsys.readouterr().out
        # --recheck: every one checked again
        assert doctor.main(["--recheck"]) == 0
        assert len(probes.builds) > built
    # runs read the verdicts doctor stored: the slow kernel is dropped there too
    kernel_check.forget()
    with kernel_check.fake_accelerator(probes), warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelCheckWarning)
        assert "sin" not in traced("flat_params") and "sin" in traced(RIGHT)


def test_doctor_exits_1_where_a_plain_form_fails_and_shows_forced_plain_forms(
    cache_home, capsys, monkeypatch
):
    monkeypatch.setattr(kernel_check, "paired_medians", lambda *a, **k: (1.0, 1.0))
    probes = all_defaults(failing_plain=["flat_params"])
    with kernel_check.fake_accelerator(probes), kernels.plain("pallas_ppo_loss"):
        assert doctor.main([]) == 1
    out = capsys.readouterr().out
    assert "the plain form of flat_params fails here too" in out
    assert "plain form (PPOJAX_PLAIN_KERNELS)" in out
    assert "pallas_ppo_loss" not in probes.builds


def test_doctor_interpret_checks_every_default_untimed_and_unstored(
    cache_home, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(kernel_check, "paired_medians", trap)
    probes = Probes({name: jnp.sin for name in kernels.PLATFORM_DEFAULTS})
    table = tmp_path / "interpret.json"
    with kernel_check.fake_accelerator(probes):
        assert doctor.main(["--interpret", "--json", str(table)]) == 0
    assert sorted(probes.builds) == sorted(kernels.PLATFORM_DEFAULTS)
    assert not (cache_home / kernel_check.FILE_NAME).exists()
    rows = json.loads(table.read_text())["kernels"]
    assert all(row["verdict"] == "kept" and row["kernel_s"] is None for row in rows)
    assert "checks took" in capsys.readouterr().out


def test_the_train_command_shows_a_dropped_kernel_as_one_plain_line(capsys):
    from ppojax.cli.commands import show_warning

    def fallback(*args):
        raise AssertionError("shown the Python way")

    show_warning(fallback, "kernel flat_params (float32) failed its check", KernelCheckWarning)
    assert capsys.readouterr().err == (
        "ppojax: warning: kernel flat_params (float32) failed its check\n"
    )


@pytest.mark.heavy
@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_a_program_traced_for_a_device_checks_its_defaults_with_the_real_probes(
    cache_home, tiny_config
):
    """The tiny config's program traced as on a CUDA device (the fake one, Pallas's kernels
    interpreted on this CPU): each default it traces is checked once with its real probe,
    inside the trace, passes, is stored, and stays in the program."""
    from ppojax.runs.kernel_probes import PROBES

    with kernel_check.fake_accelerator(PROBES, kind="CPU as a GPU"):
        text = jax.jit(lambda c, k: ppojax.train(c, k)).lower(tiny_config, jax.random.key(0))
    entries = stored_entries(cache_home).values()
    checked = {entry["kernel"] for entry in entries}
    assert checked == set(kernels.CUDA_DEFAULTS) - {"pallas_decode_attention"}
    assert all(entry["works"] for entry in entries), [e["reason"] for e in entries]
    with kernels.plain(*kernels.CUDA_DEFAULTS):
        plain = jax.jit(lambda c, k: ppojax.train(c, k)).lower(tiny_config, jax.random.key(0))
    assert text.as_text().count("stablehlo.case") > plain.as_text().count("stablehlo.case")


def test_the_file_is_replaced_whole_or_not_at_all(cache_home, monkeypatch):
    """Written to a temporary file renamed over the old one: a write that fails halfway
    leaves the old file as it was and no temporary file behind."""
    stored_right_entry(cache_home)
    path = cache_home / kernel_check.FILE_NAME
    before = path.read_text()

    def half_written(data, file, **kwargs):
        file.write(json.dumps(data)[:20])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kernel_check.json, "dump", half_written)
    with kernel_check.fake_accelerator(Probes()), warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        assert not kernel_check.verdict(WRONG, "float32", DEVICE).works
    assert path.read_text() == before
    assert sorted(p.name for p in cache_home.iterdir()) == [kernel_check.FILE_NAME]
    assert "No space left on device" in kernel_warnings(record)[0]
