"""The RLHF trainer's state sharded FSDP-style over a ("data", "fsdp") mesh.

The multi-device cases run in a subprocess on 4 virtual CPU devices (XLA_FLAGS must be set
before JAX starts): one PPO step (value head on the policy) over a 1 x 4 mesh and one GRPO step
over a 2 x 2 mesh on the tiny Qwen2 fixture, against the same step on one device.

Tolerances. Both programs sample the same tokens (the same key and threefry's bits do not
depend on the layout; a token would flip only at a near tie of two logits), so every
difference comes from float32 sums reduced in another order across devices:

- metrics are means of per-token terms of order 1 (log-probs ~ -5.7, ratios ~ 1, normalized
  advantages) or of order 10 (the gradient norm): a few float32 ulps of their scale, so rtol
  1e-5 and atol 2e-6 (~16 ulps of 1; a policy loss of -9e-5 differed by 2e-8);
- Adam's moments are linear (mu) and quadratic (nu) in the gradients, whose elements are sums
  of hundreds of products: each element agrees to ~1e-6 of the largest element of its leaf,
  so atol 1e-4 x that largest element;
- the params after Adam: an element whose true gradient is ~0 gets a gradient of pure
  rounding noise, which Adam's normalization g / (|g| + eps) turns into a step of up to
  learning_rate either way; so each element is within 2 x learning_rate per Adam step of the
  single-device one, and the update of each leaf as a whole (its norm dominated by real
  gradients) agrees to 1%.
A layout bug (a gradient not summed over the data shards, a slice of a tensor lost) moves
moments and updates by their own order of magnitude.
"""

import os
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest
from jax.sharding import Mesh, PartitionSpec

from ppojax.rlhf.core.sharding import FSDP, leaf_spec, make_mesh, state_shardings

SCRIPT = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax
import jax.numpy as jnp
import numpy as np
from ppojax.rlhf import RLHFConfig, from_pretrained, make_trainer
from ppojax.rlhf.core.sharding import bytes_per_device, make_mesh, shard_trainer

FOLDER = "tests/fixtures/hf/qwen2"
LR = 1e-3
lm = from_pretrained(FOLDER)
params = lm.init_value_head(lm.params)
prompts = jax.random.randint(jax.random.key(5), (8, 6), 3, 288)
mask = jnp.ones((8, 6), bool).at[:2, :2].set(False)


def reward(prompts, prompt_mask, responses, response_mask):
    return (responses % 7 == 0).mean(axis=1).astype(jnp.float32)


def check_leaves(name, one, four, start, steps):
    flat = jax.tree_util.tree_flatten_with_path(one)[0]
    for (path, a), b, s in zip(flat, jax.tree.leaves(four), jax.tree.leaves(start)):
        a, b, s = np.asarray(a), np.asarray(b), np.asarray(s)
        where = f"{name} {jax.tree_util.keystr(path)}"
        np.testing.assert_array_less(np.abs(b - a), 2 * LR * steps + 1e-7, err_msg=where)
        assert np.linalg.norm(b - a) <= 1e-2 * np.linalg.norm(a - s) + 1e-7, where


def compare(config, mesh, rows, lm_params):
    trainer = make_trainer(config, lm.policy_apply, reward, critic_apply=lm.critic_apply,
                           kv_cache=lm.kv_cache)
    start = trainer.init(params, jax.random.key(1))
    one, one_metrics = jax.jit(trainer.step)(start, prompts[:rows], mask[:rows],
                                             jax.random.key(2))
    sharded = shard_trainer(trainer, mesh, min_size=256)
    four = sharded.init(lm_params, jax.random.key(1))
    q = four.reference["params"]["layers_0"]["self_attn"]["q_proj"]["kernel"]
    assert q.addressable_shards[0].data.shape == (64 // mesh.shape["fsdp"], 64), q.sharding
    held = sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves(four))
    assert bytes_per_device(start, mesh, min_size=256) == held
    four, four_metrics = sharded.step(four, prompts[:rows], mask[:rows], jax.random.key(2))
    mu = four.opt_state[1][0].mu["policy"]["params"]["layers_1"]["mlp"]["up_proj"]["kernel"]
    assert mu.addressable_shards[0].data.shape == (64, 96 // mesh.shape["fsdp"]), mu.sharding
    for name in one_metrics:
        np.testing.assert_allclose(four_metrics[name], one_metrics[name], rtol=1e-5,
                                   atol=2e-6, err_msg=name)
    adam_one, adam_four = one.opt_state[1][0], four.opt_state[1][0]
    for moment in ("mu", "nu"):
        for a, b in zip(jax.tree.leaves(getattr(adam_one, moment)),
                        jax.tree.leaves(getattr(adam_four, moment))):
            scale = float(np.max(np.abs(a)))
            np.testing.assert_allclose(b, a, rtol=0, atol=1e-4 * scale, err_msg=moment)
    steps = config.update_epochs * config.num_minibatches
    check_leaves(config.algorithm, one.params, four.params, start.params, steps)


mesh = make_mesh(fsdp=4)
loaded = from_pretrained(FOLDER, mesh=mesh)
embed = loaded.params["params"]["embed"]["embedding"]
assert embed.addressable_shards[0].data.shape == (72, 64), embed.sharding
q = loaded.params["params"]["layers_0"]["self_attn"]["q_proj"]["kernel"]
assert q.sharding.is_fully_replicated  # 4096 elements, below the default min_size
for a, b in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(lm.params)):
    np.testing.assert_array_equal(a, b)

ppo = RLHFConfig(algorithm="ppo", response_len=6, update_epochs=1, num_minibatches=2,
                 pad_id=0, eos_id=2, learning_rate=LR)
compare(ppo, mesh, 8, loaded.init_value_head(loaded.params))
grpo = RLHFConfig(algorithm="grpo", group_size=2, response_len=6, update_epochs=1,
                  num_minibatches=2, pad_id=0, eos_id=2, learning_rate=LR)
compare(grpo, make_mesh(fsdp=2, data=2), 4, params)
trainer = shard_trainer(make_trainer(grpo, lm.policy_apply, reward), mesh)
state = trainer.init(params, jax.random.key(1))
try:
    trainer.step(state, prompts[:6], mask[:6], jax.random.key(2))
except ValueError as error:
    assert "prompts has 6 rows" in str(error) and "multiple of 4" in str(error), error
    print("sharded steps ok")
"""


def test_sharded_ppo_and_grpo_steps_equal_the_single_device_step():
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sharded steps ok" in result.stdout


def test_a_large_leaf_splits_along_its_largest_divisible_axis():
    assert leaf_spec("w", (896, 4864), 8, 1024) == PartitionSpec(None, FSDP)
    assert leaf_spec("w", (151936, 896), 8, 1024) == PartitionSpec(FSDP)
    # GPT-2's vocabulary of 50257 is odd: its embedding splits along the width instead.
    assert leaf_spec("wte", (50257, 768), 4, 1024) == PartitionSpec(None, FSDP)
    assert leaf_spec("square", (64, 64), 4, 1024) == PartitionSpec(FSDP)


def test_small_leaves_and_one_device_stay_whole():
    assert leaf_spec("scale", (896,), 8, 1024) == PartitionSpec()
    assert leaf_spec("count", (), 8, 1024) == PartitionSpec()
    assert leaf_spec("w", (896, 4864), 1, 1024) == PartitionSpec()


def test_a_large_leaf_no_axis_of_which_divides_is_named():
    with pytest.raises(ValueError, match=r"tensor params/q_proj/kernel of shape \(64, 64\)"):
        leaf_spec("params/q_proj/kernel", (64, 64), 3, 1024)


def test_a_mesh_that_does_not_fit_the_devices_is_refused():
    with pytest.raises(ValueError, match="needs data x fsdp = 1 devices"):
        make_mesh(fsdp=2)


def test_a_mesh_without_the_axis_names_is_refused():
    mesh = Mesh(np.asarray(jax.devices()[:1]), ("devices",))
    with pytest.raises(ValueError, match=r"needs exactly \('data', 'fsdp'\)"):
        state_shardings({"w": np.zeros((4, 4))}, mesh)
