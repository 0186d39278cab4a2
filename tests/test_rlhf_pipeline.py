"""End-to-end tests of ppojax.rlhf: the jitted PPO step, the beta sweep and the entry point."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.rlhf import PPO_METRICS, RLHFConfig, init_model_params, init_rlhf_state, ppo_step
from ppojax.rlhf.__main__ import main
from ppojax.rlhf.pipeline import TABLE_COLUMNS
from ppojax.rlhf.task import sample_prompts

TINY = dict(
    num_digits=6,
    prompt_len=4,
    response_len=5,
    d_model=16,
    num_heads=2,
    num_layers=1,
    batch_size=8,
    num_minibatches=2,
    ppo_epochs=2,
)


def tiny_state(config: RLHFConfig, kl_coef: float):
    params = init_model_params(config, jax.random.key(0))
    head = params["params"]["value_head"]
    kernel = jax.random.normal(jax.random.key(1), head["kernel"].shape)
    reward = {"params": {**params["params"], "value_head": {**head, "kernel": kernel}}}
    return init_rlhf_state(config, params, reward, kl_coef)


def test_ppo_step_compiles_once_is_deterministic_and_vmaps_over_beta():
    config = RLHFConfig(**TINY)
    prompts = sample_prompts(jax.random.key(2), 8, 4, 6)
    key = jax.random.key(3)
    step = jax.jit(chex.assert_max_traces(ppo_step, n=1))
    singles = [step(config, tiny_state(config, beta), prompts, key) for beta in (0.0, 0.5)]
    again = step(config, tiny_state(config, 0.0), prompts, key)
    chex.assert_trees_all_equal(again, singles[0])
    assert set(PPO_METRICS) <= set(singles[0][1])
    chex.assert_shape([singles[0][1][name] for name in PPO_METRICS], ())

    def step_with_beta(beta: jax.Array):
        return ppo_step(config, tiny_state(config, beta), prompts, key)

    swept = jax.jit(jax.vmap(step_with_beta))(jnp.array([0.0, 0.5]))
    for index, single in enumerate(singles):
        chex.assert_trees_all_close(
            jax.tree.map(lambda x, i=index: x[i], swept), single, rtol=1e-4, atol=1e-5
        )
    assert int(singles[0][0].step) == 1


def test_adaptive_k3_separate_critic_step_lowers_beta_when_kl_is_zero():
    config = RLHFConfig(
        **TINY,
        adaptive_kl=True,
        kl_estimator="k3",
        separate_critic=True,
        missing_eos_penalty=1.0,
        target_kl=1.0,
        kl_horizon=80.0,
    )
    prompts = sample_prompts(jax.random.key(4), 8, 4, 6)
    state, metrics = jax.jit(ppo_step)(config, tiny_state(config, 0.2), prompts, jax.random.key(5))
    assert float(metrics["kl"]) == 0.0  # the policy starts as the reference
    np.testing.assert_allclose(state.kl_coef, 0.2 * (1 - 0.2 * 8 / 80), rtol=1e-6)
    assert set(state.params) == {"policy", "critic"}
    assert all(np.isfinite(float(metrics[name])) for name in PPO_METRICS if name != "kl_coef")


@pytest.mark.slow
def test_entry_point_runs_all_stages_and_prints_the_table(capsys):
    args = ["--seed", "1", "--sft-steps", "3", "--rm-steps", "3", "--ppo-steps", "3"]
    tiny = {"--" + k.replace("_", "-"): str(v) for k, v in TINY.items()}
    args += [item for pair in tiny.items() for item in pair] + ["--rm-batch-size", "8"]
    assert main(args + ["--adaptive-kl", "true"]) == 0
    out = capsys.readouterr().out
    assert "SFT: 3 steps" in out and "reward model: 3 steps" in out and "PPO: 3 steps" in out
    header = next(line for line in out.splitlines() if line.startswith("step "))
    assert header.split()[1:] == list(TABLE_COLUMNS)
    rows = [line for line in out.splitlines() if line[:4].strip().isdigit()]
    assert [int(row.split()[0]) for row in rows] == [0, 1, 2]


def test_entry_point_rejects_bad_values():
    with pytest.raises(ValueError, match="kl_estimator"):
        main(["--kl-estimator", "k9"])
