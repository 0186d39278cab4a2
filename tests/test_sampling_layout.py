"""Sampling in a layout of its own (``ppojax.rlhf.core.sharding.SAMPLE_LAYOUTS``): the policy's
compute copy resharded once a step, replicated or tensor-parallel, never gathered per token.

The multi-device cases run in a subprocess on 4 virtual CPU devices (XLA_FLAGS must be set
before JAX starts). Tokens are compared exactly: every layout draws from the same keys, and a
token differs only where two logits tie to within the float32 rounding of a sum reduced in
another order, which the tiny Qwen2 fixture's logits (spread over ~1) do not come near. The
step's metrics are compared as tests/test_hf_sharding.py argues: rtol 1e-5, atol 2e-6.
"""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from ppojax.rlhf.core import sharding
from ppojax.rlhf.core.sharding import FSDP, make_mesh, tensor_spec

SCRIPT = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax
import jax.numpy as jnp
import numpy as np
from ppojax.rlhf import RLHFConfig, from_pretrained, make_trainer
from ppojax.rlhf.core import sharding
from ppojax.rlhf.core.sampling import SamplingSettings, sample_responses

lm = from_pretrained("tests/fixtures/hf/qwen2")
prompts = jax.random.randint(jax.random.key(5), (8, 6), 3, 288)
mask = jnp.ones((8, 6), bool).at[:2, :2].set(False)
settings = SamplingSettings(response_len=8, temperature=1.0, pad_id=0, eos_id=2)
key = jax.random.key(3)


def sample(params, prompts, mask):
    return sample_responses(lm.kv_cache, params, prompts, mask, key, settings, group_size=2)


one = jax.jit(sample)(lm.params, prompts, mask)
for devices, data in ((2, 1), (4, 1), (4, 2)):
    mesh = sharding.make_mesh(fsdp=devices // data, data=data, devices=jax.devices()[:devices])
    for layout in ("replicated", "tensor", "fsdp", "auto"):

        def step(params, prompts, mask):
            params = sharding.constrain(params, mesh, 64)  # as training lays them out
            with sharding.rows_on(mesh, layout):
                rows = (prompts, mask)
                out = sharding.sample_with(params, rows, lambda p, rows: sample(p, *rows))
                return sharding.rows_split(out)

        got = jax.jit(step)(lm.params, prompts, mask)
        for name, a, b in zip(one._fields, one, got):
            assert np.array_equal(np.asarray(a), np.asarray(b)) or (
                name == "log_probs" and np.allclose(a, b, rtol=1e-5, atol=2e-6)
            ), (devices, data, layout, name)
        print("same tokens", devices, data, layout)


def reward(prompts, prompt_mask, responses, response_mask):
    return (responses % 7 == 0).mean(axis=1).astype(jnp.float32)


config = RLHFConfig(
    algorithm="grpo", group_size=2, response_len=6, pad_id=0, eos_id=2, update_epochs=1,
    num_minibatches=2, learning_rate=1e-3,
)
trainer = make_trainer(config, lm.policy_apply, reward, kv_cache=lm.kv_cache)
state = trainer.init(lm.params, jax.random.key(1))
_, single = jax.jit(trainer.step)(state, prompts, mask, jax.random.key(2))
for layout in ("replicated", "tensor"):
    sharded = sharding.shard_trainer(trainer, sharding.make_mesh(fsdp=4), 64, sample_layout=layout)
    _, metrics = sharded.step(sharded.init(lm.params, jax.random.key(1)), prompts, mask,
                              jax.random.key(2))
    for name, value in single.items():
        np.testing.assert_allclose(metrics[name], value, rtol=1e-5, atol=2e-6, err_msg=name)
    print("same step", layout)
"""


@pytest.mark.heavy
def test_every_layout_samples_the_one_device_tokens_on_two_and_four_devices():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        capture_output=True, text=True, cwd=root, env=env, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("same tokens") == 12 and done.stdout.count("same step") == 2


PATH = tuple(jax.tree_util.DictKey(name) for name in ("params", "layers_0"))


def spec(*names: str, shape: tuple[int, ...], size: int = 4) -> PartitionSpec:
    return tensor_spec(PATH + tuple(jax.tree_util.DictKey(n) for n in names), shape, size)


def test_tensor_layout_splits_heads_and_mlp_columns_out_and_rows_back():
    column, row = PartitionSpec(None, FSDP), PartitionSpec(FSDP)
    for module in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "c_attn", "c_fc"):
        assert spec("self_attn", module, "kernel", shape=(64, 32)) == column, module
    assert spec("self_attn", "q_proj", "bias", shape=(32,)) == row  # the bias's one axis
    for module in ("o_proj", "down_proj", "c_proj"):
        assert spec("mlp", module, "kernel", shape=(96, 64)) == row, module
        assert spec("mlp", module, "bias", shape=(64,)) == PartitionSpec()  # added once, whole
    assert tensor_spec((jax.tree_util.DictKey("embed"), jax.tree_util.DictKey("embedding")),
                       (288, 64), 4) == row  # fmt: skip
    assert spec("lm_head", "kernel", shape=(64, 288)) == column
    assert spec("input_layernorm", "scale", shape=(64,)) == PartitionSpec()
    # an axis the device count does not divide stays whole, as does everything on one device
    assert spec("self_attn", "q_proj", "kernel", shape=(64, 30)) == PartitionSpec()
    assert spec("self_attn", "q_proj", "kernel", shape=(64, 32), size=1) == PartitionSpec()


def test_auto_replicates_what_fits_a_share_of_a_device_and_splits_what_does_not(monkeypatch):
    mesh = make_mesh(fsdp=1)
    tree = {"w": jax.ShapeDtypeStruct((1024, 1024), np.float32)}  # 4 MiB
    assert sharding.resolve_sample_layout("auto", tree, mesh) == "replicated"  # one device
    assert sharding.resolve_sample_layout("tensor", tree, mesh) == "tensor"  # as given

    class Mesh2:
        devices = np.zeros((1, 2))

    monkeypatch.setattr(sharding, "device_memory", lambda mesh: 8 << 20)  # 4 MiB > 25% of 8
    assert sharding.resolve_sample_layout("auto", tree, Mesh2()) == "tensor"
    monkeypatch.setattr(sharding, "device_memory", lambda mesh: 16 << 20)  # 25% of 16: fits
    assert sharding.resolve_sample_layout("auto", tree, Mesh2()) == "replicated"
    monkeypatch.setattr(sharding, "device_memory", lambda mesh: None)  # a CPU says nothing
    assert sharding.resolve_sample_layout("auto", tree, Mesh2()) == "replicated"


def test_an_unknown_layout_is_refused_naming_the_flag_and_the_choices():
    with pytest.raises(ValueError, match="--sample-layout 'rows' is not one of auto, replicated"):
        sharding.check_sample_layout("rows")
    with pytest.raises(ValueError, match="sample_layout 'x'"):
        sharding.shard_trainer(None, make_mesh(fsdp=1), sample_layout="x")
    with pytest.raises(ValueError, match="--sample-layout"):
        with sharding.rows_on(make_mesh(fsdp=1), "x"):
            pass


def test_outside_a_sharded_step_sampling_runs_on_the_params_as_they_are():
    params = {"w": np.ones(3)}
    assert sharding.for_sampling(params) is params
    assert sharding.sample_with(params, (1,), lambda p, rows: (p, rows)) == (params, (1,))
