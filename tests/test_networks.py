import functools
import os
import re
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppojax
from ppojax.networks import householder_qr_q, init_params, observation_template, orthogonal
from ppojax.ppo.train import make_agent


def network_and_observation(**settings):
    """The network of ``PPOConfig(**settings)`` and its env's observation template."""
    agent = make_agent(ppojax.PPOConfig(**settings))
    return agent.network, observation_template(agent.env)


@pytest.mark.parametrize("shape", [(4, 4), (64, 64), (4, 64), (64, 2), (3, 5, 7)])
def test_orthogonal_matches_jax_initializer_for_the_same_key(shape):
    key = jax.random.key(3)
    ours = orthogonal(1.7)(key, shape)
    reference = jax.nn.initializers.orthogonal(1.7)(key, shape)
    # Householder in XLA ops against LAPACK's QR: entries of order 1.7 / sqrt(n), each a
    # product of up to 64 reflections, so ~100 ulps of 1.7 (2e-5).
    np.testing.assert_allclose(ours, reference, atol=2e-5)


def test_householder_q_has_orthonormal_columns_and_reproduces_the_matrix():
    matrix = jax.random.normal(jax.random.key(0), (50, 20))
    q = householder_qr_q(matrix)
    np.testing.assert_allclose(q.T @ q, np.eye(20), atol=2e-5)
    r = q.T @ matrix
    np.testing.assert_allclose(np.tril(r, -1), 0.0, atol=2e-5)  # upper triangular
    assert (np.diag(r) > 0).all()
    np.testing.assert_allclose(q @ r, matrix, atol=2e-5)


def test_init_params_gives_scaled_orthogonal_kernels_and_zero_biases():
    network, observation = network_and_observation(env_id="Pendulum-v1", hidden_sizes=(64, 32))
    params = init_params(jax.random.key(0), network, observation)
    scales = {
        ("actor_torso", "MLP_0", "Dense_0"): np.sqrt(2),
        ("actor_torso", "MLP_0", "Dense_1"): np.sqrt(2),
        ("actor_head",): 0.01,
        ("critic_torso", "MLP_0", "Dense_0"): np.sqrt(2),
        ("critic_torso", "MLP_0", "Dense_1"): np.sqrt(2),
        ("critic_head",): 1.0,
    }
    for path, scale in scales.items():
        layer = params["params"]
        for name in path:
            layer = layer[name]
        kernel = np.asarray(layer["kernel"]) / scale
        small = min(kernel.shape)
        gram = kernel.T @ kernel if kernel.shape[0] >= kernel.shape[1] else kernel @ kernel.T
        np.testing.assert_allclose(gram, np.eye(small), atol=1e-5, err_msg=str(path))
        np.testing.assert_array_equal(layer["bias"], 0.0)
    np.testing.assert_array_equal(params["params"]["log_std"], 0.0)
    other = init_params(jax.random.key(1), network, observation)
    first = params["params"]["actor_torso"]["MLP_0"]["Dense_0"]["kernel"]
    assert not np.allclose(first, other["params"]["actor_torso"]["MLP_0"]["Dense_0"]["kernel"])
    # every layer gets its own draw
    hidden = params["params"]["critic_torso"]["MLP_0"]["Dense_0"]["kernel"]
    assert not np.allclose(np.abs(first), np.abs(hidden))


def _custom_calls(init_fn) -> set[str]:
    keys = jax.random.split(jax.random.key(0), 8)
    text = jax.jit(jax.vmap(init_fn)).lower(keys).compile().as_text()
    return set(re.findall(r'custom_call_target="([^"]+)"', text))


def _calls_lapack(init_fn) -> bool:
    return any("lapack" in target for target in _custom_calls(init_fn))


def test_vmapped_init_calls_no_lapack_kernel():
    """The deadlock comes from batched LAPACK QR kernels; ours compile to plain XLA ops."""

    def ours(key):
        return orthogonal()(key, (256, 256))

    def reference(key):
        return jax.nn.initializers.orthogonal()(key, (256, 256))

    assert _calls_lapack(reference)  # the detector does see LAPACK QR
    assert not _calls_lapack(ours)
    network, observation = network_and_observation(hidden_sizes=(256, 256))
    assert not _calls_lapack(lambda key: init_params(key, network, observation))


@pytest.mark.heavy
def test_vmapping_eight_seeds_of_a_wide_network_does_not_hang():
    """jit(vmap(train)) over 8 seeds with 256x256 layers finishes (in a subprocess with a
    time limit, so a hang fails the test instead of stalling the suite)."""
    script = textwrap.dedent(
        """
        import jax, ppojax
        config = ppojax.PPOConfig(hidden_sizes=(256, 256), num_envs=4, num_steps=8,
                                  total_timesteps=64, update_epochs=1, num_minibatches=1)
        keys = jax.random.split(jax.random.key(0), 8)
        train = jax.jit(jax.vmap(ppojax.train, in_axes=(None, 0))).lower(config, keys).compile()
        for _ in range(3):  # the hang came at run time, in some runs only
            out = jax.block_until_ready(train(config, keys))
        print("finished", out.metrics["policy_loss"].shape)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "finished (8, 2)" in result.stdout


def test_network_outputs_have_the_right_shapes():
    for env_id, discrete in (("CartPole-v1", True), ("Pendulum-v1", False)):
        network, observation = network_and_observation(
            env_id=env_id, hidden_sizes=(32, 32), activation="relu"
        )
        params = init_params(jax.random.key(0), network, observation)
        obs = jnp.zeros((5, *observation.shape))
        head, log_std, value, hidden = network.apply(params, obs, None)
        assert head.shape == (5, network.spec.action_dim)
        assert (log_std is None) == discrete
        assert value.shape == (5,) and hidden is None
        np.testing.assert_array_equal(network.apply(params, obs, None, method="value"), value)


def test_cnn_on_a_hand_case_and_against_a_numpy_convolution():
    from ppojax.networks.modules import CNN

    # Hand case: a 3x3 kernel of ones over the 4x4 image 4 i + j, no bias: each output is its
    # window's sum, 45 at (0, 0), +9 per column and +36 per row.
    hand = CNN(channels=(1,), kernel_size=3, stride=1, hidden_sizes=(), activation="relu")
    image = jnp.arange(16.0).reshape(1, 4, 4, 1)
    ones = {"params": {"Conv_0": {"kernel": jnp.ones((3, 3, 1, 1)), "bias": jnp.zeros(1)}}}
    np.testing.assert_array_equal(hand.apply(ones, image), [[45.0, 54.0, 81.0, 90.0]])

    # Two layers (the second with stride 2) and a dense layer, against NumPy loops.
    cnn = CNN(channels=(3, 2), kernel_size=2, stride=2, hidden_sizes=(5,), activation="tanh")
    x = jax.random.normal(jax.random.key(0), (2, 7, 7, 2))
    params = cnn.init(jax.random.key(1), x)
    params = jax.tree.map(
        lambda leaf: jax.random.normal(jax.random.key(leaf.size), leaf.shape), params
    )
    p = jax.tree.map(np.asarray, params["params"])

    def conv(image, kernel, bias, stride):
        k = kernel.shape[0]
        rows = (image.shape[1] - k) // stride + 1
        cols = (image.shape[2] - k) // stride + 1
        out = np.zeros((image.shape[0], rows, cols, kernel.shape[-1]))
        for i in range(rows):
            for j in range(cols):
                window = image[:, i * stride : i * stride + k, j * stride : j * stride + k, :]
                out[:, i, j] = np.einsum("bhwc,hwco->bo", window, kernel) + bias
        return out

    y = np.tanh(conv(np.asarray(x, np.float64), p["Conv_0"]["kernel"], p["Conv_0"]["bias"], 2))
    y = np.tanh(conv(y, p["Conv_1"]["kernel"], p["Conv_1"]["bias"], 2))
    assert y.shape == (2, 1, 1, 2)  # 7 -> 3 -> 1 with 2x2 kernels, stride 2
    dense = p["MLP_0"]["Dense_0"]
    want = np.tanh(y.reshape(2, -1) @ dense["kernel"] + dense["bias"])
    # float32 sums of 8-12 products of order-1 normals against float64: ~1e-6 of the sums.
    np.testing.assert_allclose(cnn.apply(params, x), want, rtol=1e-5, atol=1e-5)


def test_the_cnn_encoder_reads_minatar_images_with_orthogonal_conv_kernels():
    network, observation = network_and_observation(
        env_id="Breakout-MinAtar", encoder="cnn", cnn_channels=(16, 8), hidden_sizes=(32,)
    )
    assert observation.shape == (10, 10, 4)
    params = init_params(jax.random.key(0), network, observation)
    torso = params["params"]["actor_torso"]["CNN_0"]
    assert torso["Conv_0"]["kernel"].shape == (3, 3, 4, 16)
    assert torso["Conv_1"]["kernel"].shape == (3, 3, 16, 8)
    assert torso["MLP_0"]["Dense_0"]["kernel"].shape == (6 * 6 * 8, 32)  # 10 -> 8 -> 6
    matrix = np.asarray(torso["Conv_0"]["kernel"]).reshape(36, 16) / np.sqrt(2)
    np.testing.assert_allclose(matrix.T @ matrix, np.eye(16), atol=1e-5)
    head, _, value, _ = network.apply(params, jnp.ones((3, 10, 10, 4)), None)
    assert head.shape == (3, network.spec.action_dim) and value.shape == (3,)


def test_the_mlp_encoder_flattens_and_concatenates_an_observation_pytree():
    from ppojax.networks import flatten_observation

    obs = {"b": jnp.arange(8.0).reshape(2, 4), "a": jnp.arange(12.0).reshape(2, 2, 3)}
    flat = flatten_observation(obs)
    want = np.concatenate([np.arange(12.0).reshape(2, 6), np.arange(8.0).reshape(2, 4)], -1)
    np.testing.assert_array_equal(flat, want)  # leaves in pytree (sorted key) order


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def test_gru_and_lstm_cells_follow_their_formulas():
    from ppojax.networks.modules import GRUCore, LSTMCore

    x = np.asarray(jax.random.normal(jax.random.key(0), (3, 5)))
    h = np.asarray(jax.random.normal(jax.random.key(1), (3, 4)))

    def random_params(module, state):
        params = module.init(jax.random.key(2), x, state)
        return jax.tree.map(lambda leaf: jax.random.normal(jax.random.key(3), leaf.shape), params)

    gru = GRUCore(4)
    params = random_params(gru, h)
    p = jax.tree.map(np.asarray, params["params"])
    gx = x @ p["input"]["kernel"] + p["input"]["bias"]
    gh = h @ p["hidden"]["kernel"] + p["hidden"]["bias"]
    r = _sigmoid(gx[:, :4] + gh[:, :4])
    z = _sigmoid(gx[:, 4:8] + gh[:, 4:8])
    n = np.tanh(gx[:, 8:] + r * gh[:, 8:])
    out, state = gru.apply(params, x, h)
    # float32 against float64 on sums of 4-5 order-1 products and a few exp/tanh: ~1e-6.
    np.testing.assert_allclose(out, (1 - z) * n + z * h, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(out, state)

    lstm = LSTMCore(4)
    c = np.asarray(jax.random.normal(jax.random.key(4), (3, 4)))
    params = random_params(lstm, np.concatenate([c, h], -1))
    p = jax.tree.map(np.asarray, params["params"])
    gates = x @ p["input"]["kernel"] + p["input"]["bias"] + h @ p["hidden"]["kernel"]
    i, f, g, o = np.split(gates, 4, axis=-1)
    c_new = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    h_new = _sigmoid(o) * np.tanh(c_new)
    out, state = lstm.apply(params, x, np.concatenate([c, h], -1))
    np.testing.assert_allclose(out, h_new, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(state, np.concatenate([c_new, h_new], -1), rtol=1e-5, atol=1e-5)


def test_recurrent_kernels_are_orthogonal_with_unit_gain():
    network, observation = network_and_observation(recurrent="gru", recurrent_size=8)
    params = init_params(jax.random.key(0), network, observation)
    core = params["params"]["critic_torso"]["core"]
    for name in ("input", "hidden"):
        kernel = np.asarray(core[name]["kernel"])  # [64 or 8, 24]
        rows, cols = kernel.shape
        gram = kernel.T @ kernel if rows >= cols else kernel @ kernel.T
        np.testing.assert_allclose(gram, np.eye(min(rows, cols)), atol=1e-5, err_msg=name)


@pytest.mark.parametrize(
    "shape, features, kernel, stride", [((10, 10, 4), 16, 3, 1), ((11, 9, 3), 5, 3, 2)]
)
def test_patch_convolution_equals_xla_convolution_with_its_gradients(
    shape, features, kernel, stride
):
    """The CNN's matmul-over-patches convolution against flax's nn.Conv (lax.conv) with the same
    parameters: outputs and the gradients of both parameters and the input. Two programs that sum
    in different orders: an output sums k*k*C <= 36 products of order 1 (ulp 1.2e-7, so 1e-5
    is ~80 ulps); a kernel gradient sums B*H'*W' = 320 terms, of magnitude up to ~20 (ulp
    1.9e-6, so 1e-4 is ~50 ulps)."""
    import flax.linen as nn

    from ppojax.networks.modules import PatchConv

    x = jax.random.normal(jax.random.key(0), (5, *shape))
    patch = PatchConv(features, kernel, stride)
    reference = nn.Conv(features, (kernel, kernel), strides=(stride, stride), padding="VALID")
    params = patch.init(jax.random.key(1), x)
    ours = patch.apply(params, x)
    np.testing.assert_allclose(ours, reference.apply(params, x), atol=1e-5)

    def loss(module, params, x):
        return jnp.sum(jnp.sin(module.apply(params, x)))

    ours_grads = jax.grad(functools.partial(loss, patch), argnums=(0, 1))(params, x)
    want_grads = jax.grad(functools.partial(loss, reference), argnums=(0, 1))(params, x)
    for have, want in zip(jax.tree.leaves(ours_grads), jax.tree.leaves(want_grads), strict=True):
        np.testing.assert_allclose(have, want, atol=1e-4)


def test_state_dependent_std_is_a_head_whose_std_varies_with_the_observation():
    """Off: one log_std parameter [A], the same for every observation. On: a dense head on
    the actor's features, [B, A], different per observation, and the sampled log-prob's
    gradient reaches its kernel (so training can shape where the policy explores)."""
    obs = jax.random.normal(jax.random.key(1), (6, 3))
    network, observation = network_and_observation(env_id="Pendulum-v1")
    params = init_params(jax.random.key(0), network, observation)
    _, log_std, _, _ = network.apply(params, obs, None)
    assert log_std.shape == (1,) and "log_std_head" not in params["params"]

    network, observation = network_and_observation(env_id="Pendulum-v1", state_dependent_std=True)
    params = init_params(jax.random.key(0), network, observation)
    assert "log_std" not in params["params"]
    _, log_std, _, _ = network.apply(params, obs, None)
    assert log_std.shape == (6, 1)
    assert np.ptp(np.asarray(log_std)) > 1e-4  # a 0.01-gain kernel: small, not zero
    head = params["params"]["log_std_head"]
    scaled = {**params["params"], "log_std_head": {**head, "kernel": head["kernel"] * 100}}
    _, wide, _, _ = network.apply({"params": scaled}, obs, None)
    assert np.ptp(np.asarray(wide)) > 0.1  # std differs by more than 10% between observations

    def log_prob(params):
        mean, log_std, _, _ = network.apply(params, obs, None)
        return (-0.5 * jnp.square((1.0 - mean) / jnp.exp(log_std)) - log_std).sum()

    grads = jax.grad(log_prob)(params)["params"]["log_std_head"]["kernel"]
    assert np.abs(np.asarray(grads)).max() > 0


@pytest.mark.parametrize("state_dependent", [False, True])
def test_init_log_std_sets_the_initial_std(state_dependent):
    obs = jax.random.normal(jax.random.key(1), (6, 3))
    settings = {"env_id": "Pendulum-v1", "state_dependent_std": state_dependent}
    network, observation = network_and_observation(**settings)
    default = network.apply(init_params(jax.random.key(0), network, observation), obs, None)[1]
    network, observation = network_and_observation(**settings, init_log_std=-1.5)
    params = init_params(jax.random.key(0), network, observation)
    log_std = network.apply(params, obs, None)[1]
    # a 0.01-gain head on features of norm ~1 moves the log-std by ~0.01 from its bias
    tolerance = 0.05 if state_dependent else 0.0
    np.testing.assert_allclose(default, 0.0, atol=tolerance)
    np.testing.assert_allclose(log_std, -1.5, atol=tolerance)
    np.testing.assert_allclose(log_std - default, -1.5, atol=1e-6)  # the same kernels


def encoder_dot_dtypes(network, params, obs, hidden):
    """The operand dtypes of every matrix product in the lowered network, in order."""
    text = jax.jit(lambda p: network.apply(p, obs, hidden)).lower(params).as_text()
    return re.findall(r"stablehlo.dot_general.*\(tensor<[^>]*x(bf16|f32)>", text)


@pytest.mark.parametrize(
    "settings",
    [
        {"env_id": "CartPole-v1"},
        {"env_id": "Breakout-MinAtar", "encoder": "cnn", "hidden_sizes": (32,)},
        {"env_id": "CartPole-v1", "recurrent": "gru", "recurrent_size": 16},
    ],
)
def test_bfloat16_computes_the_encoder_in_bfloat16_and_the_rest_in_float32(settings):
    network, observation = network_and_observation(**settings)
    bf16, _ = network_and_observation(**settings, compute_dtype="bfloat16")
    params = init_params(jax.random.key(0), network, observation)
    obs = jax.random.uniform(jax.random.key(1), (6, *observation.shape))
    hidden = None if settings.get("recurrent") is None else jnp.full((6, 32), 0.1)
    full = network.apply(params, obs, hidden)
    half = bf16.apply(params, obs, hidden)
    # the same parameters serve both; every output and the recurrent state stay float32
    for have, want in zip(jax.tree.leaves(half), jax.tree.leaves(full), strict=True):
        assert have.dtype == jnp.float32 and have.shape == want.shape
        # bfloat16 keeps 8 bits of mantissa (relative error 2^-9 per rounding): a few
        # roundings per layer of unit-scale activations and outputs of order 1
        np.testing.assert_allclose(have, want, rtol=0.05, atol=0.05)
    assert any(
        not np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(half), jax.tree.leaves(full), strict=True)
    )
    # the encoder's products take bfloat16 operands, the core's and the heads' float32
    depth = len(settings.get("hidden_sizes", (64, 64))) + (settings.get("encoder") == "cnn")
    dtypes = encoder_dot_dtypes(bf16, params, obs, hidden)
    assert dtypes.count("bf16") == 2 * depth  # actor's and critic's torsos
    assert set(encoder_dot_dtypes(network, params, obs, hidden)) == {"f32"}


def test_compute_dtype_must_be_a_known_name():
    with pytest.raises(ppojax.ConfigError, match="compute_dtype"):
        ppojax.PPOConfig(compute_dtype="float16")
