"""``ppojax rlhf``: the run folder it writes, and a killed run resuming bit-exactly."""

import csv
import json
import os
import pathlib
import shutil
import socket
import types

import chex
import jax
import numpy as np
import pytest

from ppojax.rlhf import RLHFConfig, make_trainer, run_steps
from ppojax.rlhf.models.transformer import zero_value_head
from ppojax.rlhf.tasks.digits import EOS, PAD, DigitTask
from ppojax.rlhf.tasks.reversal import checker, reversal_sft
from ppojax.runs import checkpoints, folder, loop
from ppojax.runs.lm.task_run import frozen_params, main, prepare

TINY_RUN = [
    "--small",
    "--task",
    "reversal",
    "--algorithm",
    "ppo",
    "--batch-size",
    "4",
    "--num-minibatches",
    "2",
    "--update-epochs",
    "1",
    "--steps",
    "4",
    "--checkpoint-every",
    "2",
    "--learning-rate",
    "0.01",
    "--no-progress",
]


def restore_state(run_dir, step):
    settings = folder.read_json(run_dir / folder.CONFIG_FILE)
    _, template, _ = prepare(settings, frozen_params(settings, run_dir, resume=True))
    return checkpoints.restore_checkpoint(run_dir, template, step)[0]


@pytest.mark.slow
def test_run_folder_and_bit_exact_resume(tmp_path, capsys):
    assert main([*TINY_RUN, "--out", str(tmp_path / "runs")]) == 0
    (full,) = (tmp_path / "runs").iterdir()
    assert "run folder:" in capsys.readouterr().out
    for name in ("config.json", "metrics.csv", "curves.png", "summary.json", "frozen"):
        assert (full / name).exists(), name
    assert sorted(int(p.name) for p in (full / "checkpoints").iterdir()) == [2, 4]
    with open(full / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["update"] for row in rows] == ["1", "2", "3", "4"]
    assert {"objective/kl", "policy/approxkl_avg", "val/ratio", "rewards/checker/mean"} <= set(
        rows[0]
    )
    summary = json.loads((full / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["response_tokens_per_s"] > 0

    assert summary["resumed_from_step"] is None and summary["timed_steps"] == 4
    assert summary["wall_s"] > 0 and summary["finished_utc"] and summary["versions"]["jax"]
    settings = json.loads((full / "config.json").read_text())
    assert settings["rlhf"]["update_epochs"] == 1 and "ppo_epochs" not in settings["rlhf"]

    # A run killed after its checkpoint at step 2: step 4's checkpoint and rows never came. Its
    # config.json has the names of older versions (ppo_epochs; target_kl, the adaptive target).
    killed = tmp_path / "killed"
    shutil.copytree(full, killed)
    shutil.rmtree(killed / "checkpoints" / "4")
    folder.truncate_metrics(killed / "metrics.csv", 2)
    rlhf = settings["rlhf"]
    rlhf["ppo_epochs"], rlhf["target_kl"] = rlhf.pop("update_epochs"), rlhf.pop("kl_target")
    folder.write_json(killed / "config.json", settings)
    assert main(["--resume", str(killed), "--no-progress"]) == 0
    resumed = json.loads((killed / "summary.json").read_text())
    assert resumed["resumed_from_step"] == 2 and resumed["timed_steps"] == 2
    assert (killed / "metrics.csv").read_text() == (full / "metrics.csv").read_text()
    chex.assert_trees_all_equal(restore_state(killed, 4), restore_state(full, 4))
    assert not jax.tree.all(
        jax.tree.map(
            lambda a, b: bool((a == b).all()), restore_state(full, 2), restore_state(full, 4)
        )
    )


def test_the_chunks_compile_with_ppojaxs_options(tmp_path, monkeypatch):
    """The RLHF run's chunk programs take ppojax's compiler options (``compiler_options()``):
    given one XLA does not know, the run fails naming it."""
    monkeypatch.setattr(loop, "compiler_options", lambda: {"xla_no_such_option": 1})
    with pytest.raises(Exception, match="xla_no_such_option"):
        main([*TINY_RUN, "--out", str(tmp_path / "runs")])


def test_bad_values_name_the_field():
    with pytest.raises(ValueError, match="RLHFConfig.kl_estimator"):
        main(["--kl-estimator", "k9"])
    with pytest.raises(ValueError, match="not a run folder"):
        main(["--resume", "/nonexistent/run"])


def test_a_task_run_folder_in_use_is_refused(tmp_path):
    """Both forms' run folders hold a ``lock`` while a process trains there."""
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "lock").write_text(f"{os.getppid()} {socket.gethostname()}\n")
    with pytest.raises(ValueError, match=f"is in use: process {os.getppid()} on"):
        main(["--resume", str(tmp_path), "--no-progress"])
    assert (tmp_path / "lock").read_text().split()[0] == str(os.getppid())


def test_a_model_run_folders_old_names_are_read_as_the_new_fields():
    """config.json of an older ``ppojax rlhf --model`` run keeps the flags given, under their
    old names; ``run_config`` reads them as the new fields."""
    from ppojax.runs.lm.text_job import run_config

    lm = types.SimpleNamespace(tokenizer=types.SimpleNamespace(eos_id=3, pad_id=3))
    old = {"rlhf": {"ppo_epochs": 1, "target_kl": 0.5, "adaptive_kl": True}}
    expected = RLHFConfig(update_epochs=1, kl_target=0.5, adaptive_kl=True, pad_id=0, eos_id=3)
    assert run_config(old, lm) == expected


REVERSAL = DigitTask(
    num_digits=6,
    min_digits=2,
    max_digits=4,
    response_len=5,
    d_model=32,
    num_heads=2,
    num_layers=1,
    sft_steps=150,
    sft_batch_size=32,
)


@pytest.fixture(scope="module")
def reversal_start():
    """An imperfect SFT model of the reversal task (checker score about 0.3)."""
    return jax.jit(reversal_sft, static_argnums=0)(REVERSAL, jax.random.key(0))[0]


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_ppo_and_grpo_train_the_verifiable_task_from_sft(reversal_start, algorithm):
    group_size = 1 if algorithm == "ppo" else 4
    config = RLHFConfig(
        algorithm=algorithm,
        group_size=group_size,
        pad_id=PAD,
        eos_id=EOS,
        response_len=REVERSAL.response_len,
        num_minibatches=2,
        update_epochs=2,
        learning_rate=3e-3,
        kl_coef=0.01,
    )
    lm = REVERSAL.model()
    critic = lm.critic_apply if algorithm == "ppo" else None
    trainer = make_trainer(config, lm.policy_apply, [checker], critic, kv_cache=lm.kv_cache)
    critic_params = zero_value_head(reversal_start) if algorithm == "ppo" else None

    def train(key):
        state = trainer.init(reversal_start, key, critic_params)
        prompt_fn = lambda k: REVERSAL.prompts(k, 32 // group_size)  # noqa: E731
        return run_steps(trainer, state, prompt_fn, key, 100)[1]["objective/scores"]

    scores = np.asarray(jax.jit(train)(jax.random.key(2)))
    # 32 responses per step: the per-step mean has a std of about 0.05, a 20-step mean's about
    # 0.011, so a rise of 0.05 between the first and last 20 steps is over 3 of the
    # difference's std (GRPO from this start rose 0.07-0.10 over 100 steps on keys 2-4)
    assert scores[-20:].mean() > scores[:20].mean() + 0.05, scores


def test_a_task_run_that_never_recovers_exits_3_without_a_summary(tmp_path, capsys):
    """The task form ends a run whose last step skipped all its updates as the model form
    does: one line, exit status 3, the curves and checkpoints kept, no summary.json."""
    argv = [arg for arg in TINY_RUN if arg != "0.01"]
    argv[argv.index("--learning-rate") + 1 : argv.index("--learning-rate") + 1] = ["1e30"]
    assert main([*argv, "--out", str(tmp_path / "runs")]) == 3
    (run_dir,) = (tmp_path / "runs").iterdir()
    error = capsys.readouterr().err
    assert "ppojax rlhf: error: the run diverged and never recovered: from step 1 on" in error
    assert (run_dir / "curves.png").exists() and not (run_dir / "summary.json").exists()
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir()) == [2, 4]


LEGACY_RUN = pathlib.Path(__file__).parent / "fixtures" / "legacy_rlhf_run"


@pytest.mark.slow
def test_a_run_folder_of_the_earlier_builtin_transformer_resumes_to_the_same_state(tmp_path):
    """tests/fixtures/legacy_rlhf_run was written by ``TINY_RUN`` when the built-in
    transformer had parameter names of its own (Block_0/CausalSelfAttention_0/qkv, ...). Its
    frozen SFT params and checkpoints read back in the decoder's names; killed after step 2,
    it trains steps 3 and 4 to the state it saved at step 4. The decoder computes the earlier
    module's ops, compiled as another program: its states agree to float32 rounding (6e-8 at
    most, one ulp of parameters of order 1). Two Adam steps of lr 0.01 move each parameter by
    lr x m / sqrt(v), whose rounding stays a few ulps of the step: atol 1e-5 leaves two
    orders of magnitude above that, and below the 1e-2 a step moves."""
    killed = tmp_path / "legacy"
    shutil.copytree(LEGACY_RUN, killed)
    shutil.rmtree(killed / "checkpoints" / "4")
    folder.truncate_metrics(killed / "metrics.csv", 2)
    assert main(["--resume", str(killed), "--no-progress"]) == 0
    resumed = restore_state(killed, 4)
    assert {"wte", "wpe", "layers_0", "ln_f", "lm_head"} <= set(resumed.params["policy"]["params"])
    chex.assert_trees_all_close(resumed, restore_state(LEGACY_RUN, 4), atol=1e-5)
