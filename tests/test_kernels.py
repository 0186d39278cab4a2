"""ppojax.runtime.kernels: the stand-in computes what its plain form computes, and ``plain()``
really swaps the plain form in."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerance import (
    TRAINING_ULPS,
    assert_close,
    assert_states_close,
    assert_trees_close,
    host,
)

import ppojax
from ppojax.ppo.kernels import pallas_loss
from ppojax.ppo.train import init_state, make_agent
from ppojax.ppo.update import ppo_loss_function
from ppojax.runs.kernel_probes import made_up_samples
from ppojax.runtime import kernels


def test_plain_switches_the_stand_ins_off_and_back():
    with kernels.plain():
        assert not kernels.stand_ins_on() and not kernels.stand_in("noise")
    assert kernels.stand_ins_on()
    with kernels.plain("noise"):
        assert not kernels.stand_in("noise")
    with pytest.raises(ValueError, match="no stand-in named"):
        with kernels.plain("permutation"):
            pass


def test_scan_drawing_draws_ahead_or_per_step():
    def draw(key, steps):
        return {"u": jax.random.uniform(key, (steps, 3))}

    def step(total, noise):
        return total + noise["u"].sum(), noise["u"]

    key = jax.random.key(2)
    total, drawn = kernels.scan_drawing(step, 0.0, key, draw, 5)
    np.testing.assert_array_equal(drawn, draw(key, 5)["u"])  # all five drawn at once
    with kernels.plain():
        plain_total, per_step = kernels.scan_drawing(step, 0.0, key, draw, 5)
    step_keys = jax.random.split(key, 5)
    for i in range(5):  # each step drew its own, from its own key
        np.testing.assert_array_equal(per_step[i], draw(step_keys[i], 1)["u"][0])
    # 15 uniforms summed in another order: a few ulps of the total (~7.5)
    assert_close(plain_total, per_step.sum(), ulps=8, scale=8.0)
    assert_close(total, drawn.sum(), ulps=8, scale=8.0)


@pytest.mark.parametrize("unroll", [1, 3])
def test_packed_scan_stores_what_scan_stores_bit_for_bit(unroll):
    """ "packed_steps": a step's 32-bit and boolean outputs stored as one vector of words per
    step, ``unroll`` steps a trip (3 of 7: a remainder too), every bit as ``lax.scan`` stores
    them; other dtypes (here bfloat16) stay outputs of their own."""

    def step(carry, x):
        y = {
            "f": x * carry,
            "i": jnp.int32(-3) * carry.astype(jnp.int32),
            "b": jnp.reshape(x > 0.5, (1, 3)),
            "u": jax.lax.bitcast_convert_type(x, jnp.uint32),
            "h": x.astype(jnp.bfloat16),
            "none": None,
        }
        return carry + x.sum(), y

    xs = jax.random.normal(jax.random.key(4), (7, 3))
    expected = jax.lax.scan(step, jnp.float32(1.0), xs)
    packed = kernels.packed_scan(step, jnp.float32(1.0), xs, unroll)
    assert jax.tree.structure(packed) == jax.tree.structure(expected)
    for have, want in zip(jax.tree.leaves(packed), jax.tree.leaves(expected), strict=True):
        assert have.dtype == want.dtype and have.shape == want.shape
        np.testing.assert_array_equal(host(have), host(want))
    (scan,) = [
        e
        for e in jax.make_jaxpr(kernels.packed_scan, static_argnums=(0, 3))(
            step, jnp.float32(1.0), xs, unroll
        ).eqns
        if e.primitive.name == "scan"
    ]
    assert scan.params["unroll"] == unroll
    assert len(scan.outvars) == 1 + 2  # the carry, the words, the bfloat16 leaf


@pytest.mark.heavy
def test_the_cuda_defaults_of_rollout_gae_and_optimizer_train_as_the_plain_forms(tiny_config):
    # The rollout's outputs are stored bit for bit, its actions are the same argmax, the
    # parameters step as one vector with the same arithmetic, and GAE adds the same terms in
    # another order (a few ulps of advantages of order 1 to 10, then normalized): the float
    # leaves get TRAINING_ULPS as other programs computing the same, counters and keys exactly.
    plain = jax.jit(ppojax.train)(tiny_config, jax.random.key(0))
    with kernels.use("packed_steps", "associative_gae", "flat_params", "elementwise_argmax"):
        fast = jax.jit(lambda c, k: ppojax.train(c, k))(tiny_config, jax.random.key(0))
    assert_states_close(fast.state, plain.state, ulps=TRAINING_ULPS)
    assert_trees_close(fast.metrics, plain.metrics, ulps=TRAINING_ULPS, scale=100.0)


@pytest.mark.parametrize("reset_pool", [None, 2])
def test_rollouts_with_per_step_draws_run_and_restart_episodes(tiny_config, reset_pool):
    config = tiny_config.replace(reset_pool=reset_pool)
    with kernels.plain():
        out = jax.jit(lambda c, k: ppojax.train(c, k))(config, jax.random.key(1))
    finished = np.asarray(out.metrics["episodes_finished"])
    assert finished.sum() >= 3  # 192 steps of a random CartPole policy: episodes of ~20 steps
    returns = np.asarray(out.metrics["episode_return"])[finished > 0]
    assert np.isfinite(returns).all() and (returns >= 1).all()


def test_use_chooses_the_candidates_and_only_inside_its_block():
    assert not any(kernels.stand_in(name) for name in kernels.CANDIDATES)  # off by default
    with kernels.use("gather_once"):
        assert kernels.stand_in("gather_once") and not kernels.stand_in("fused_actor_critic")
    with kernels.use():
        assert all(kernels.stand_in(name) for name in kernels.CANDIDATES)
    assert not kernels.stand_in("gather_once")
    with pytest.raises(ValueError, match="no candidate named"):
        with kernels.use("noise"):
            pass
    with pytest.raises(ValueError, match="no stand-in named"):
        kernels.stand_in("fused")


def test_candidates_from_the_environment_name_the_variable_when_wrong(monkeypatch):
    def chosen():
        return kernels._names_from_environment("PPOJAX_KERNELS", kernels.CANDIDATES)

    monkeypatch.setenv("PPOJAX_KERNELS", " " + ", ".join(kernels.CANDIDATES[:2]))
    assert chosen() == frozenset(kernels.CANDIDATES[:2])  # spaces around names ignored
    monkeypatch.setenv("PPOJAX_KERNELS", ",".join(kernels.CANDIDATES))
    assert chosen() == frozenset(kernels.CANDIDATES)
    monkeypatch.setenv("PPOJAX_KERNELS", "fused_actor_critic")
    assert chosen() == {"fused_actor_critic"}
    monkeypatch.setenv("PPOJAX_KERNELS", "1")
    assert chosen() == frozenset(kernels.CANDIDATES)
    monkeypatch.setenv("PPOJAX_KERNELS", "gather_once,pallas")
    with pytest.raises(ValueError, match="PPOJAX_KERNELS names \\['pallas'\\]"):
        chosen()


def top_level_primitives(fn, *args) -> set[str]:
    return {eqn.primitive.name for eqn in jax.make_jaxpr(fn)(*args).jaxpr.eqns}


def test_scan_epochs_gathers_every_epoch_at_once_or_in_each_epoch():
    data = jax.numpy.arange(12.0)

    def shuffle(key):
        return data[jax.random.permutation(key, 12)].reshape(3, 4)

    def epoch(carry, minibatches):  # a running record of what each epoch saw
        return carry * 100.0 + minibatches[0, 0]

    keys = jax.random.split(jax.random.key(3), 4)
    plain = kernels.scan_epochs(epoch, 0.0, keys, shuffle)
    with kernels.use("gather_once"):
        once = kernels.scan_epochs(epoch, 0.0, keys, shuffle)
        gathered_ahead = top_level_primitives(
            lambda k: kernels.scan_epochs(epoch, 0.0, k, shuffle), keys
        )
    assert plain == once  # same permutations, same epochs
    assert "gather" in gathered_ahead  # the gather left the loop...
    assert "gather" not in top_level_primitives(
        lambda k: kernels.scan_epochs(epoch, 0.0, k, shuffle), keys
    )  # ...which the plain form gathers in


@pytest.mark.heavy
@pytest.mark.parametrize("recurrent", [None, "gru"])
def test_gather_once_trains_as_the_plain_shuffle(tiny_config, recurrent):
    # The same samples in the same minibatches and the same arithmetic on them: every bit
    # equal here, but two programs may fuse (and contract to FMAs) differently on another
    # CPU, so the float leaves get TRAINING_ULPS (a few ulps per step, carried by 6 Adam
    # steps) and every other leaf (counters, keys) must match exactly.
    config = tiny_config.replace(recurrent=recurrent)
    plain = jax.jit(ppojax.train)(config, jax.random.key(0))
    with kernels.use("gather_once"):
        once = jax.jit(lambda c, k: ppojax.train(c, k))(config, jax.random.key(0))
    assert_states_close(once.state, plain.state, ulps=TRAINING_ULPS)
    # metrics: losses and returns of order 1 to 100 (episode returns up to ~60 here)
    assert_trees_close(once.metrics, plain.metrics, ulps=TRAINING_ULPS, scale=100.0)


def dot_count(fn, *args) -> int:
    return jax.jit(fn).lower(*args).as_text().count("stablehlo.dot_general")


@pytest.mark.parametrize(
    "settings",
    [
        {"env_id": "CartPole-v1"},
        {"env_id": "Pendulum-v1"},
        {"env_id": "Pendulum-v1", "state_dependent_std": True, "hidden_sizes": (32, 48, 16)},
    ],
)
def test_fused_actor_critic_computes_both_networks_in_half_the_products(settings):
    config = ppojax.PPOConfig(**settings)
    agent = make_agent(config)
    state = init_state(config, jax.random.key(0))
    params = state.params
    obs = jax.random.normal(jax.random.key(1), (8, *state.obs.shape[1:]))

    def loss(params):  # every output, and a gradient through all of them
        head, log_std, value, _ = agent.network.apply(params, obs, None)
        return (head**2).sum() + (value**2).sum() + (0.0 if log_std is None else log_std.sum())

    def outputs(params):
        return agent.network.apply(params, obs, None), jax.grad(loss)(params)

    plain = jax.jit(outputs)(params)
    plain_dots = dot_count(lambda p: agent.network.apply(p, obs, None), params)
    with kernels.use("fused_actor_critic"):
        fused = jax.jit(lambda p: outputs(p))(params)
        fused_dots = dot_count(lambda p: agent.network.apply(p, obs, None), params)
    # one product per layer and head of each network against one per layer for both
    depth = len(config.hidden_sizes)
    assert (plain_dots, fused_dots) == (2 * depth + 2 + config.state_dependent_std, depth + 1)
    # Sums of <= 64 products of order-1 terms (unit-scale inputs, orthogonal kernels) in
    # another order, with exact zeros added: a few ulps of the terms; gradients sum 8 rows more.
    assert_trees_close(fused, plain, ulps=64, scale=4.0)


def test_fused_actor_critic_trains_as_the_two_networks(tiny_config):
    # TRAINING_ULPS: the two programs' sums differ by ulps, which 6 Adam steps carry on
    plain = jax.jit(ppojax.train)(tiny_config, jax.random.key(0))
    with kernels.use("fused_actor_critic"):
        fused = jax.jit(lambda c, k: ppojax.train(c, k))(tiny_config, jax.random.key(0))
    assert_states_close(fused.state, plain.state, ulps=TRAINING_ULPS)


@pytest.mark.parametrize(
    "settings",
    [
        {"shared_torso": True},
        {"recurrent": "gru"},
        {"env_id": "Breakout-MinAtar", "encoder": "cnn"},
    ],
)
def test_fused_actor_critic_leaves_other_networks_as_they_are(tiny_config, settings):
    network = make_agent(tiny_config).network
    with kernels.use("fused_actor_critic"):
        assert network.fusable()
        assert not make_agent(tiny_config.replace(**settings)).network.fusable()


def test_fused_actor_critic_computes_in_the_encoder_dtype():
    config = ppojax.PPOConfig(compute_dtype="bfloat16")
    agent = make_agent(config)
    state = init_state(config, jax.random.key(0))
    obs = jax.random.normal(jax.random.key(1), (8, *state.obs.shape[1:]))
    plain = agent.network.apply(state.params, obs, None)
    with kernels.use("fused_actor_critic"):
        fused = jax.jit(lambda p: agent.network.apply(p, obs, None))(state.params)
        text = jax.jit(lambda p: agent.network.apply(p, obs, None)).lower(state.params).as_text()
    assert text.count("xbf16>") > 0  # the fused layers' products in bfloat16 too
    # the same bfloat16 roundings, up to one of them in another place: 2^-8 relative, of
    # outputs of order 1
    for have, want in zip(jax.tree.leaves(fused), jax.tree.leaves(plain), strict=True):
        np.testing.assert_allclose(have, want, rtol=2**-6, atol=2**-6)


def pallas_batch(config: ppojax.PPOConfig, rows: int):
    """An agent, its initial parameters and a minibatch of ``rows`` made-up samples whose
    ratios and value changes fall on both sides of the clip ranges."""
    agent = make_agent(config)
    state = init_state(config, jax.random.key(0))
    # log pi_old 0.1 off the initial policy's: ratios of about 0.75 to 1.35, both sides of
    # the clip range
    batch = made_up_samples(agent.env.spec, state.obs.shape[1:], rows, jax.random.key(5))
    return agent, state.params, batch


def pallas_and_plain(config: ppojax.PPOConfig, rows: int):
    agent, params, batch = pallas_batch(config, rows)

    def value_and_grad(params, batch):
        loss_fn = ppo_loss_function(agent, config, jnp.float32(1.0))
        return jax.value_and_grad(loss_fn, has_aux=True)(params, batch)

    plain = jax.jit(value_and_grad)(params, batch)
    with kernels.use("pallas_ppo_loss"):
        assert pallas_loss.applies(agent, config)
        pallas = jax.jit(lambda p, b: value_and_grad(p, b))(params, batch)
    return pallas, plain


@pytest.mark.parametrize(
    "settings, rows",
    [
        ({}, 128),  # the classic CartPole config, one block
        ({"activation": "relu", "hidden_sizes": (32, 48, 16), "vf_clip_eps": None}, 300),
        ({"env_id": "Acrobot-v1", "normalize_advantages": False}, 64),
        ({"env_id": "Pendulum-v1", "init_log_std": -0.5}, 128),  # Gaussian, one action
        ({"env_id": "Reacher-misc", "activation": "relu"}, 200),  # Gaussian, two actions
    ],
)
def test_pallas_ppo_loss_gives_ppo_loss_and_its_gradient(settings, rows):
    pallas, plain = pallas_and_plain(ppojax.PPOConfig(**settings), rows)
    (loss, metrics), grads = pallas
    (plain_loss, plain_metrics), plain_grads = plain
    # Means of a few hundred terms of order 1 (ratios ~1, normalized advantages, unit
    # targets), summed in another order and in blocks: a few ulps of 1. A wrong term or a
    # missing branch of a clip moves them by 1e-3 or more.
    assert 0.0 < metrics["clip_fraction"] < 1.0  # both sides of the policy clip are taken
    assert_close(loss, plain_loss, ulps=64)
    assert_trees_close(metrics, plain_metrics, ulps=64)
    assert_trees_close(grads, plain_grads, ulps=64)


def test_pallas_ppo_loss_adds_up_blocks_and_programs(monkeypatch):
    # 100 rows in blocks of 16, two blocks a program: 4 programs, 28 padded rows of weight 0
    monkeypatch.setattr(pallas_loss, "BLOCK_ROWS", 16)
    monkeypatch.setattr(pallas_loss, "BLOCKS_PER_PROGRAM", 2)
    pallas, plain = pallas_and_plain(ppojax.PPOConfig(), 100)
    (loss, metrics), grads = pallas
    (plain_loss, plain_metrics), plain_grads = plain
    assert_close(loss, plain_loss, ulps=64)  # as above
    assert_trees_close(metrics, plain_metrics, ulps=64)
    assert_trees_close(grads, plain_grads, ulps=64)


@pytest.mark.heavy
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_pallas_ppo_loss_trains_as_ppo_loss_over_seeds(tiny_config, env_id):
    # vmapped over two seeds (the kernel's grid gains the seed axis); TRAINING_ULPS: the two
    # programs' sums differ by ulps, which 6 Adam steps carry on
    tiny_config = tiny_config.replace(env_id=env_id)
    keys = jax.random.split(jax.random.key(0), 2)
    plain = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0)))(tiny_config, keys)
    with kernels.use("pallas_ppo_loss"):
        pallas = jax.jit(lambda c, k: jax.vmap(ppojax.train, in_axes=(None, 0))(c, k))(
            tiny_config, keys
        )
    assert_states_close(pallas.state, plain.state, ulps=TRAINING_ULPS)


@pytest.mark.parametrize(
    "settings",
    [
        {"env_id": "Pendulum-v1", "state_dependent_std": True},
        {"shared_torso": True},
        {"recurrent": "gru"},
        {"policy_objective": "penalty"},
        {"activation": "gelu"},
        {"compute_dtype": "bfloat16"},
    ],
)
def test_pallas_ppo_loss_leaves_other_configs_to_ppo_loss(tiny_config, settings):
    with kernels.use("pallas_ppo_loss"):
        assert pallas_loss.applies(make_agent(tiny_config), tiny_config)
        config = tiny_config.replace(**settings)
        assert not pallas_loss.applies(make_agent(config), config)
    assert not pallas_loss.applies(make_agent(tiny_config), tiny_config)  # off by default


TRITON_CALL = "__gpu$xla.gpu.triton"
MOSAIC_CALL = "@tpu_custom_call"


def exported_text(fn, args, platform: str) -> str:
    """The StableHLO text of ``jax.jit(fn)`` on ``args`` exported for ``platform`` from this
    CPU-only machine.

    For CUDA it is exported under an abstract H200: jax 0.11's Pallas Triton lowering reads
    the target GPU's compute capability from the device, or from the abstract mesh's device
    when there is none ("No supported GPU devices found, please specify an abstract GPU
    device"); jax 0.10.2 assumed compute capability 9.0, the H200's, and ignores the mesh."""
    from jax import export
    from jax.sharding import AbstractDevice, AbstractMesh, AxisType, use_abstract_mesh

    # the device's name is what the lowering reads; 132 is the H200's SM count. Auto axes:
    # jax 0.11.2's Pallas lowering fails on an Explicit one ("Length of sharding.spec (2)
    # must be equal to aval's ndim (1)")
    device = AbstractDevice(device_kind="NVIDIA H200", num_cores=132, platform="gpu")
    if platform == "tpu":  # Pallas's Mosaic lowering reads the TPU's generation the same way
        device = AbstractDevice(device_kind="TPU v5 lite", num_cores=1, platform="tpu")
    mesh = AbstractMesh((1,), ("x",), (AxisType.Auto,), abstract_device=device)
    with use_abstract_mesh(mesh):
        exported = export.export(
            jax.jit(fn),
            platforms=[platform],
            disabled_checks=[export.DisabledSafetyCheck.custom_call(TRITON_CALL)],
        )(*args)
    return exported.mlir_module()


def pallas_kernel_module(platform: str, continuous: bool, interpret: bool | None = None) -> str:
    """The StableHLO text of ``loss_and_grads`` on 8192 rows of the classic MLP, exported for
    ``platform`` (``exported_text``)."""

    def layers(sizes):
        return [
            (jax.ShapeDtypeStruct((a, b), jnp.float32), jax.ShapeDtypeStruct((b,), jnp.float32))
            for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        ]

    rows = 8192
    floats = jax.ShapeDtypeStruct((rows,), jnp.float32)
    if continuous:
        action = jax.ShapeDtypeStruct((rows, 3), jnp.float32)
    else:
        action = jax.ShapeDtypeStruct((rows,), jnp.int32)
    inputs = (jax.ShapeDtypeStruct((rows, 4), jnp.float32), action) + (floats,) * 4
    log_std = jax.ShapeDtypeStruct((3,), jnp.float32) if continuous else None
    network = pallas_loss.Network(layers([4, 64, 64, 3]), layers([4, 64, 64, 1]), log_std)
    coefficients = pallas_loss.Coefficients(*[jax.ShapeDtypeStruct((), jnp.float32)] * 4)
    settings = pallas_loss.LossSettings("tanh", 3, True, continuous)

    def loss(coefficients, network, inputs):
        return pallas_loss.loss_and_grads(
            settings, coefficients, network, inputs, interpret=interpret
        )

    return exported_text(loss, (coefficients, network, inputs), platform)


# jax 0.11 warns on every Triton lowering that the backend will go; docs/architecture.md
# ("Pallas backends") holds the plan
@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
@pytest.mark.parametrize("continuous", [False, True])
def test_pallas_ppo_kernel_lowers_to_triton(continuous):
    # What a CPU can check of the GPU path: the kernel lowers to one Triton call for CUDA
    # (Pallas's Triton lowering checks shapes, dtypes and the ops it supports), chosen by the
    # platform it is lowered for although this machine's default backend is the CPU.
    assert jax.default_backend() == "cpu"
    assert pallas_kernel_module("cuda", continuous).count(TRITON_CALL) == 1


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
@pytest.mark.parametrize("continuous", [False, True])
def test_pallas_ppo_kernel_lowers_to_mosaic_for_tpu(continuous):
    # Lowered for a TPU, the same kernel is one Mosaic call in blocks of TPU_BLOCK_ROWS rows
    # (benchmarks/tpu_program.py compiles it with libtpu); neither Triton nor the interpreter
    tpu = pallas_kernel_module("tpu", continuous)
    assert tpu.count(MOSAIC_CALL) == 1 and tpu.count(TRITON_CALL) == 0
    assert tpu.count("stablehlo.while") == 0


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_pallas_ppo_kernel_is_interpreted_when_lowered_for_cpu():
    # Pallas's interpreter lowers the grid and the blocks as XLA while loops over plain ops
    cpu = pallas_kernel_module("cpu", continuous=False)
    assert cpu.count(TRITON_CALL) == 0 and cpu.count("stablehlo.while") >= 2
    # interpret=True is the interpreter for CUDA too; the default is Triton there
    interpreted = pallas_kernel_module("cuda", continuous=False, interpret=True)
    assert interpreted.count(TRITON_CALL) == 0 and interpreted.count("stablehlo.while") >= 2
    assert pallas_kernel_module("cuda", continuous=False).count("stablehlo.while") == 0


def loss_gradient_module(config: ppojax.PPOConfig, platform: str) -> str:
    """The StableHLO of the update's loss and gradient on 128 rows, exported for ``platform``."""
    agent, params, batch = pallas_batch(config, 128)

    def value_and_grad(params, batch):
        loss_fn = ppo_loss_function(agent, config, jnp.float32(1.0))
        return jax.value_and_grad(loss_fn, has_aux=True)(params, batch)

    # as a deviceless compile for a GPU (a TPU) traces it
    lowering = kernels.lowering_for_tpu if platform == "tpu" else kernels.lowering_for_cuda
    with lowering():
        return exported_text(value_and_grad, (params, batch), platform)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_pallas_ppo_loss_is_the_default_only_for_cuda():
    """Unchosen, "pallas_ppo_loss" (a CUDA default) is the loss of programs lowered for CUDA,
    and ``plain`` turns it off there; lowered for the CPU the loss is ppo_loss, no kernel nor
    its interpreter's loops; where the kernel does not fit, ppo_loss everywhere."""
    assert "pallas_ppo_loss" in kernels.CUDA_DEFAULTS
    config = ppojax.PPOConfig()
    assert not pallas_loss.applies(make_agent(config), config)  # not chosen
    assert loss_gradient_module(config, "cuda").count(TRITON_CALL) == 1
    cpu = loss_gradient_module(config, "cpu")
    assert cpu.count(TRITON_CALL) == 0 and cpu.count("stablehlo.while") == 0
    with kernels.plain("pallas_ppo_loss"):
        assert loss_gradient_module(config, "cuda").count(TRITON_CALL) == 0
    shared = config.replace(shared_torso=True)
    assert loss_gradient_module(shared, "cuda").count(TRITON_CALL) == 0


def test_pallas_ppo_loss_is_a_tpu_default_in_mosaic():
    """Unchosen, "pallas_ppo_loss" (a TPU default too: benchmarks/tpu_program.py
    --candidates) is Mosaic's kernel in programs lowered for a TPU, and ``plain`` turns it off
    there; neither Triton nor Pallas's interpreter."""
    assert "pallas_ppo_loss" in kernels.TPU_DEFAULTS
    config = ppojax.PPOConfig()
    tpu = loss_gradient_module(config, "tpu")
    assert tpu.count(MOSAIC_CALL) == 1 and tpu.count(TRITON_CALL) == 0
    assert tpu.count("stablehlo.while") == 0
    with kernels.plain("pallas_ppo_loss"):
        assert loss_gradient_module(config, "tpu").count(MOSAIC_CALL) == 0


def optimized_instructions(compiled) -> str:
    """A compiled program's optimized HLO without its module name, op metadata and stack
    frames (the Python names and lines the trace passed through)."""
    text = compiled.as_text().split("\n", 1)[1].split("FileNames")[0]
    text = re.sub(r", metadata=\{[^}]*\}", "", text)
    return re.sub(r", stack_frame_id=\d+", "", text)


# each platform's defaults, the switch of a deviceless compile for it, and whether it may be
# lowered for it here
PLATFORMS = {
    "cuda": (kernels.CUDA_DEFAULTS, kernels.lowering_for_cuda, kernels.may_lower_for_cuda),
    "tpu": (kernels.TPU_DEFAULTS, kernels.lowering_for_tpu, kernels.may_lower_for_tpu),
}


@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_platform_defaults_leave_the_cpu_program_as_it_was(tiny_config, platform):
    """The CPU program with CUDA's (or a TPU's) defaults on (the default) is, instruction for
    instruction, the one traced with them off: every CPU result stays bit for bit."""
    defaults, lowering_for, may_lower = PLATFORMS[platform]
    assert defaults

    def default(config, key):
        return ppojax.train(config, key)

    def turned_off(config, key):
        return ppojax.train(config, key)

    key = jax.random.key(0)
    with lowering_for():  # both forms traced, as where the platform is possible
        with_defaults = jax.jit(default).lower(tiny_config, key)
    with kernels.plain(*defaults):
        without = jax.jit(turned_off).lower(tiny_config, key)
    # traced apart: the default's lowering holds the platform's choice (a case on a constant)
    assert with_defaults.as_text().count("stablehlo.case") > without.as_text().count(
        "stablehlo.case"
    )
    compiled = [optimized_instructions(lowered.compile()) for lowered in (with_defaults, without)]
    assert compiled[0] == compiled[1]
    # where the platform cannot lower it (this machine), the default traces the plain form alone
    assert not may_lower()
    alone = jax.jit(lambda config, key: ppojax.train(config, key)).lower(tiny_config, key)
    assert alone.as_text().count("stablehlo.case") == without.as_text().count("stablehlo.case")


def decode_operands(dtype, length: int = 48, head_dim: int = 16, group: int = 3, seed: int = 0):
    """One decoded token's queries [3, 1, 2 * group, head_dim] and a cache of ``length``
    positions, 2 KV heads, in ``dtype`` (normal draws), and a key mask of ragged rows: left
    padding of 0, 5 and 20 positions."""
    keys = jax.random.split(jax.random.key(seed), 3)
    queries = jax.random.normal(keys[0], (3, 1, 2 * group, head_dim)).astype(dtype)
    cache = [jax.random.normal(key, (3, length, 2, head_dim)).astype(dtype) for key in keys[1:]]
    key_mask = jnp.arange(length)[None, :] >= jnp.array([0, 5, 20])[:, None]
    return queries, *cache, key_mask


def interpreted_decode(queries, keys, values, key_mask, start, scores):
    from ppojax.rlhf.models import decode_attention

    def kernel(queries, keys, values, key_mask, start):  # the token's own keys written back
        new = [jax.lax.dynamic_slice_in_dim(x, start, 1, 1) for x in (keys, values)]
        operands = (queries, *new, keys, values, key_mask, start)
        return decode_attention.attend(*operands, scores, interpret=True)[0]

    return jax.jit(kernel)(queries, keys, values, key_mask, jnp.int32(start))


# scale, softcap, window: a plain layer, Gemma 2's softcap, a window of 7 positions
DECODE_SCORES = [(0.25, None, None), (0.25, 5.0, None), (0.25, None, 7)]


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
@pytest.mark.parametrize("scale, softcap, window", DECODE_SCORES)
@pytest.mark.parametrize("start", [0, 17, 47])
def test_pallas_decode_attention_is_the_plain_attention_in_float32(scale, softcap, window, start):
    """The kernel (Pallas's interpreter) against ``attention.attend`` for one query a row: a
    group of 3 query heads a KV head (padded to 16 in the kernel), 3 rows of 0, 5 and 20
    padding positions (at start 17 the last row sees its own key alone), 48 positions in 3
    blocks of 16, the token first, in the middle and last."""
    from ppojax.rlhf.models import attention

    scores = attention.Scores(scale, softcap, window)
    queries, keys, values, key_mask = decode_operands(jnp.float32)
    out = interpreted_decode(queries, keys, values, key_mask, start, scores)
    plain = attention.attend(queries, keys, values, key_mask, start, scores)
    assert out.shape == plain.shape == (3, 1, 6 * 16) and out.dtype == jnp.float32
    # Each output is a weighted mean of values (|v| < 5): the two sum the same terms in
    # another order (over blocks, rescaled between them) and the weights' exponents differ by
    # ulps of the scores (|s| < 4), a few ulps of the values' scale; measured <= 3 ulps of 1
    assert_close(out, plain, ulps=32, scale=float(jnp.abs(values).max()))


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
@pytest.mark.parametrize("scale, softcap, window", DECODE_SCORES)
@pytest.mark.parametrize("start", [17, 47])
def test_pallas_decode_attention_in_bfloat16_rounds_only_its_weights_and_output(
    scale, softcap, window, start
):
    """In bfloat16 against the float32 attention of the same (rounded) operands: the kernel
    rounds its weights (<= 1 a key) to bfloat16 before their product with the values, 2^-9
    relative each, and its output, 2^-9 relative to |out| <= max |v|; its products and
    softmax stay float32. So it is within 2^-8 max |v| (measured: 2^-9.6); the plain bfloat16
    form also rounds the scores' product, and came within 2^-8.5."""
    from ppojax.rlhf.models import attention

    scores = attention.Scores(scale, softcap, window)
    operands = decode_operands(jnp.bfloat16, seed=1)
    out = interpreted_decode(*operands, start, scores)
    assert out.dtype == jnp.bfloat16
    wide = [x.astype(jnp.float32) for x in operands[:3]]
    reference = attention.attend(*wide, operands[3], start, scores)
    bound = 2.0**-8 * float(jnp.abs(wide[2]).max())
    np.testing.assert_allclose(np.asarray(out, np.float32), reference, rtol=0, atol=bound)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_pallas_decode_attention_takes_a_group_of_16_and_blocks_of_64():
    """A group already 16 wide (no padded queries) and 128 positions in 2 blocks of 64, head
    size 32: the kernel's other shapes."""
    from ppojax.rlhf.models import attention, decode_attention

    assert decode_attention.key_block(128) == 64 and decode_attention.key_block(48) == 16
    scores = attention.Scores(0.2)
    operands = decode_operands(jnp.float32, length=128, head_dim=32, group=16, seed=2)
    out = interpreted_decode(*operands, 100, scores)
    plain = attention.attend(*operands, 100, scores)
    assert_close(out, plain, ulps=32, scale=float(jnp.abs(operands[2]).max()))  # as above


def decode_logits(config, tokens: int = 3, length: int = 32):
    """Logits [tokens, B, V] of ``tokens`` tokens decoded one at a time through the KV cache
    of a random float32 decoder of ``config``, after a left-padded prompt of 5 positions, and
    whether the program holds a Pallas call."""
    from ppojax.rlhf.models.decoder import Decoder, empty_cache

    module = Decoder(config, jnp.float32)
    prompt = jax.random.randint(jax.random.key(3), (2, 5), 0, config.vocab_size)
    prompt_mask = jnp.array([[True] * 5, [False, False, True, True, True]])
    params = module.init(jax.random.key(4), prompt, prompt_mask)

    def run(params):
        cache = empty_cache(config, 2, length, jnp.float32)
        logits, cache = module.apply(params, prompt, prompt_mask, cache, 0)
        steps = []
        for index in range(tokens):
            token = jnp.argmax(logits[:, -1], axis=-1)[:, None]
            logits, cache = module.apply(params, token, jnp.ones((2, 1), bool), cache, 5 + index)
            steps.append(logits[:, -1])
        return jnp.stack(steps)

    return jax.jit(run)(params), "pallas_call" in str(jax.make_jaxpr(run)(params))


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_the_decoder_decodes_through_pallas_decode_attention_as_through_the_plain_form():
    """A Qwen2-shaped decoder (4 query heads on 2 KV heads of 16 and of 32, GQA) decoding 3
    tokens with the candidate chosen gives the plain decoder's logits and tokens; a cache
    length without a key block (40) or a head of 8 leaves the plain form in place, bit for
    bit."""
    from ppojax.rlhf.models.config import parse_config

    shape = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 64}
    shape.update(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    shape.update(vocab_size=128, max_position_embeddings=64, eos_token_id=2)
    config, narrow = parse_config(shape), parse_config({**shape, "hidden_size": 32})
    plain, kernel_in_plain = decode_logits(config)
    with kernels.use("pallas_decode_attention"):
        chosen, kernel_in_chosen = decode_logits(config)
        unfit = [decode_logits(config, length=40), decode_logits(narrow)]
    assert kernel_in_chosen and not kernel_in_plain
    # logits of order 1 through two layers: the attention's ulps (above) carried through the
    # projections and norms, a few dozen ulps of the logits' scale
    assert_close(chosen, plain, ulps=256, scale=float(jnp.abs(plain).max()))
    np.testing.assert_array_equal(chosen.argmax(-1), plain.argmax(-1))  # the same tokens
    wide = parse_config({**shape, "hidden_size": 128})
    with kernels.use("pallas_decode_attention"):
        wide_chosen, kernel_in_wide = decode_logits(wide)
    wide_plain = decode_logits(wide)[0]
    assert kernel_in_wide
    assert_close(wide_chosen, wide_plain, ulps=256, scale=float(jnp.abs(wide_plain).max()))
    np.testing.assert_array_equal(wide_chosen.argmax(-1), wide_plain.argmax(-1))
    for (logits, kernel_in), unchosen in zip(
        unfit, [decode_logits(config, length=40), decode_logits(narrow)], strict=True
    ):
        assert not kernel_in
        np.testing.assert_array_equal(logits, unchosen[0])


def decode_program(platform: str | None) -> str:
    """One decoded token of a small Qwen2-shaped decoder (as above) through a 32-position
    cache, traced as a deviceless GPU compile traces it (``kernels.lowering_for_cuda``): its
    StableHLO exported for ``platform``, or (None) its optimized CPU program."""
    from ppojax.rlhf.models.config import parse_config
    from ppojax.rlhf.models.decoder import Decoder, empty_cache

    shape = {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 64}
    shape.update(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    shape.update(vocab_size=128, max_position_embeddings=64, eos_token_id=2)
    config = parse_config(shape)
    module = Decoder(config, jnp.float32)
    token = jax.ShapeDtypeStruct((2, 1), jnp.int32)
    params = jax.eval_shape(module.init, jax.random.key(0), token, jnp.ones((2, 1), bool))
    cache = jax.eval_shape(lambda: empty_cache(config, 2, 32, jnp.float32))

    def decode(params, token, cache, start):
        return module.apply(params, token, jnp.ones((2, 1), bool), cache, start)

    args = (params, token, cache, jax.ShapeDtypeStruct((), jnp.int32))
    with kernels.lowering_for_cuda():
        if platform is None:
            return optimized_instructions(jax.jit(decode).lower(*args).compile())
        return exported_text(decode, args, platform)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_pallas_decode_attention_is_the_default_only_for_cuda():
    """Unchosen, "pallas_decode_attention" (a CUDA default) is a decoded token's attention
    in programs lowered for CUDA, one Triton call a layer, and ``plain`` turns it off there;
    lowered for the CPU the program holds neither the kernel nor its interpreter's loops, and
    compiles to the program traced without it, instruction for instruction."""
    assert "pallas_decode_attention" in kernels.CUDA_DEFAULTS
    assert not kernels.stand_in("pallas_decode_attention")
    assert decode_program("cuda").count(TRITON_CALL) == 2
    cpu = decode_program("cpu")
    assert cpu.count(TRITON_CALL) == 0 and cpu.count("stablehlo.while") == 0
    with kernels.plain("pallas_decode_attention"):
        assert decode_program("cuda").count(TRITON_CALL) == 0
        without = decode_program(None)
    assert decode_program(None) == without


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_pallas_decode_attention_runs_on_each_device_s_rows_of_a_sharded_step():
    """Inside a sharded step (``sharding.rows_on``) the kernel runs under ``shard_map`` on
    each device's rows, where XLA's partitioner would gather a Pallas call's operands whole;
    here over a mesh of this machine's one device, the output as without the mesh."""
    from ppojax.rlhf.core import sharding
    from ppojax.rlhf.models import attention, decode_attention

    scores = attention.Scores(0.25)
    queries, keys, values, key_mask = decode_operands(jnp.float32)

    def attend(*operands):  # a new function a trace: JAX caches traces by the function
        return decode_attention.attend_cached(*operands, scores)

    operands = (queries, keys[:, :1] + 1, values[:, :1] - 1, keys, values, key_mask, 30)
    with kernels.use("pallas_decode_attention"):
        alone = jax.jit(attend)(*operands)
        with sharding.rows_on(sharding.make_mesh(fsdp=1)):
            traced = str(jax.make_jaxpr(lambda *x: attend(*x))(*operands))
            sharded = jax.jit(lambda *x: attend(*x))(*operands)
    assert "shard_map" in traced and "pallas_call" in traced
    for x, y in zip(sharded, alone, strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
@pytest.mark.parametrize("window, start, head_dim", [(None, 0, 16), (None, 17, 32), (7, 47, 32)])
def test_pallas_decode_attention_writes_the_token_into_the_cache_as_the_plain_form(
    window, start, head_dim
):
    """The kernel writes the token's key and value into the cache it reads (aliased, in
    place): the cache after it is the plain form's, bit for bit in float32, at the first, a
    middle and the last position, heads of 16 and 32, and the output the plain form's within
    the bound above, the new key seen, not the one it overwrote."""
    from ppojax.rlhf.models import attention, decode_attention

    scores = attention.Scores(0.25, None, window)
    queries, keys, values, key_mask = decode_operands(jnp.float32, head_dim=head_dim, seed=3)
    new = [jax.random.normal(jax.random.key(5 + i), (3, 1, 2, head_dim)) for i in range(2)]
    operands = (queries, *new, keys, values, key_mask, jnp.int32(start))

    def attend(*x):  # a new function a trace (below): JAX caches traces by the function
        return decode_attention.attend_cached(*x, scores)

    plain = jax.jit(attend)(*operands)
    with kernels.use("pallas_decode_attention"):
        traced = str(jax.make_jaxpr(lambda *x: attend(*x))(*operands))
        chosen = jax.jit(lambda *x: attend(*x))(*operands)
    assert "pallas_call" in traced
    for written, reference in zip(chosen[1:], plain[1:], strict=True):
        np.testing.assert_array_equal(written, reference)
    assert not np.array_equal(plain[1][:, start], keys[:, start])
    assert_close(chosen[0], plain[0], ulps=32, scale=float(jnp.abs(values).max()))


@pytest.mark.filterwarnings("ignore:The Pallas Triton backend is deprecated")
def test_gemma2_decodes_through_pallas_decode_attention_with_its_softcap_and_window():
    """The Gemma 2 fixture's decoder (scores capped at 1, a window of 4 positions on its first
    layer, heads of 32, 4 query heads on 2 KV heads) decoding 3 tokens: the plain decoder's
    logits, within the bound above."""
    import json
    from pathlib import Path

    from ppojax.rlhf.models.config import parse_config

    folder = Path(__file__).parent / "fixtures" / "hf" / "gemma2"
    config = parse_config(json.loads((folder / "config.json").read_text()))
    assert config.attn_softcap and config.layer_window(0) and not config.layer_window(1)
    plain, _ = decode_logits(config)
    with kernels.use("pallas_decode_attention"):
        chosen, kernel_in = decode_logits(config)
    assert kernel_in
    assert_close(chosen, plain, ulps=256, scale=float(jnp.abs(plain).max()))
