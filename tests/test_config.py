import jax
import jax.numpy as jnp
import numpy as np
import pytest

import ppojax
from ppojax.ppo.config import PRESETS, ConfigError, UnknownFieldError


def test_defaults_are_the_classic_cartpole_config():
    config = ppojax.PPOConfig()
    assert (config.env_id, config.num_envs, config.num_steps) == ("CartPole-v1", 4, 128)
    assert (config.update_epochs, config.num_minibatches) == (4, 4)
    assert config.learning_rate == 2.5e-4 and config.anneal_lr
    assert config.batch_size == 512 and config.minibatch_size == 128
    assert config.num_updates == 500_000 // 512


def test_hyperparameters_are_leaves_and_shapes_are_static():
    leaves = jax.tree.leaves(ppojax.PPOConfig())
    # learning_rate ... vf_clip_eps, penalty_coef, penalty_target, obs_clip
    assert len(leaves) == 11
    assert all(isinstance(leaf, float) for leaf in leaves)
    assert len(jax.tree.leaves(ppojax.PPOConfig(vf_clip_eps=None))) == 10
    assert len(jax.tree.leaves(ppojax.PPOConfig(target_kl=0.02, reward_clip=5.0))) == 13


@pytest.mark.parametrize(
    "changes,field",
    [
        ({"num_minibatches": 3}, "num_minibatches"),
        ({"learning_rate": -1e-3}, "learning_rate"),
        ({"learning_rate": float("nan")}, "learning_rate"),
        ({"clip_eps": 0.0}, "clip_eps"),
        ({"gamma": 1.5}, "gamma"),
        ({"gamma": -0.1}, "gamma"),
        ({"gae_lambda": 2.0}, "gae_lambda"),
        ({"num_envs": 0}, "num_envs"),
        ({"num_steps": 2.5}, "num_steps"),
        ({"total_timesteps": 100}, "total_timesteps"),
        ({"hidden_sizes": ()}, "hidden_sizes"),
        ({"activation": "sigmoidish"}, "activation"),
        ({"max_grad_norm": 0.0}, "max_grad_norm"),
        ({"vf_clip_eps": -0.2}, "vf_clip_eps"),
        ({"ent_coef": -0.01}, "ent_coef"),
        ({"policy_objective": "trust_region"}, "policy_objective"),
        ({"penalty_coef": -1.0}, "penalty_coef"),
        ({"penalty_target": 0.0}, "penalty_target"),
        ({"target_kl": 0.0}, "target_kl"),
        ({"obs_clip": -1.0}, "obs_clip"),
        ({"reward_clip": 0.0}, "reward_clip"),
        ({"num_envs": "8"}, "num_envs"),
        ({"num_envs": True}, "num_envs"),
        ({"num_steps": 128.0}, "num_steps"),
        ({"anneal_lr": "false"}, "anneal_lr"),
        ({"normalize_observations": 1}, "normalize_observations"),
        ({"learning_rate": float("inf")}, "learning_rate"),
        ({"learning_rate": "3e-4"}, "learning_rate"),
        ({"learning_rate": None}, "learning_rate"),
        ({"learning_rate": True}, "learning_rate"),
        ({"gamma": float("nan")}, "gamma"),
        ({"target_kl": [0.01]}, "target_kl"),
        ({"target_kl": float("inf")}, "target_kl"),
        ({"hidden_sizes": 64}, "hidden_sizes"),
        ({"hidden_sizes": "64,64"}, "hidden_sizes"),
        ({"hidden_sizes": (64, True)}, "hidden_sizes"),
        ({"env_id": 3}, "env_id"),
        ({"activation": None}, "activation"),
        ({"encoder": "transformer"}, "encoder"),
        ({"cnn_channels": (16, 0)}, "cnn_channels"),
        ({"cnn_kernel_size": 0}, "cnn_kernel_size"),
        ({"cnn_stride": 1.5}, "cnn_stride"),
        ({"recurrent": "rnn"}, "recurrent"),
        ({"recurrent_size": 0, "recurrent": "gru"}, "recurrent_size"),
        ({"shared_torso": "yes"}, "shared_torso"),
        ({"state_dependent_std": 1}, "state_dependent_std"),
        ({"state_dependent_std": True, "recurrent": "gru"}, "state_dependent_std"),
        ({"init_log_std": float("nan")}, "init_log_std"),
        ({"init_log_std": 11.0}, "init_log_std"),
        ({"init_log_std": np.array([0.0, 1.0])}, "init_log_std"),
        ({"action_noise_correlation": 1.0}, "action_noise_correlation"),
        ({"action_noise_correlation": -0.1}, "action_noise_correlation"),
        ({"action_noise_correlation": float("nan")}, "action_noise_correlation"),
    ],
)
def test_invalid_values_name_the_field(changes, field):
    with pytest.raises(ConfigError, match=f"PPOConfig.{field}") as error:
        ppojax.PPOConfig(**changes)
    assert error.value.field == field and isinstance(error.value, ValueError)
    assert repr(next(iter(changes.values())))[:8] in str(error.value)  # names the bad value


def test_numpy_values_become_plain_python_values():
    config = ppojax.PPOConfig(
        num_envs=np.int64(8), hidden_sizes=np.array([32, 16]), anneal_lr=np.bool_(False)
    )
    assert type(config.num_envs) is int and type(config.anneal_lr) is bool
    assert config.hidden_sizes == (32, 16) and type(config.hidden_sizes[0]) is int
    assert ppojax.PPOConfig(learning_rate=np.float32(1e-3)).learning_rate == np.float32(1e-3)


def test_arrays_of_values_are_checked_elementwise_and_traced_values_pass():
    config = ppojax.PPOConfig(learning_rate=np.array([1e-3, 3e-4]))
    np.testing.assert_allclose(config.learning_rate, [1e-3, 3e-4])
    with pytest.raises(ConfigError, match="PPOConfig.gamma"):
        ppojax.PPOConfig(gamma=np.array([0.9, 1.1]))
    with pytest.raises(ConfigError, match="PPOConfig.learning_rate"):
        ppojax.PPOConfig(learning_rate=jnp.array([1e-3, jnp.nan]))
    # Inside jit and vmap the values are tracers, checked where they were made.
    doubled = jax.jit(lambda config: config.learning_rate * 2)(ppojax.PPOConfig())
    np.testing.assert_allclose(doubled, 5e-4)


def test_unknown_keywords_name_close_matches():
    with pytest.raises(UnknownFieldError, match="Did you mean learning_rate") as error:
        ppojax.PPOConfig(lerning_rate=1e-3)
    assert isinstance(error.value, TypeError) and isinstance(error.value, ValueError)
    assert error.value.field == "lerning_rate"
    with pytest.raises(UnknownFieldError, match="Did you mean gamma"):
        ppojax.PPOConfig.preset("Pendulum-v1", gama=0.9)


def test_unknown_env_id_and_choices_list_close_matches():
    with pytest.raises(ValueError, match="PPOConfig.env_id") as error:
        ppojax.PPOConfig(env_id="Cartpole-v1")
    assert "CartPole-v1" in str(error.value)
    with pytest.raises(ValueError, match="Did you mean 'clip_penalty'"):
        ppojax.PPOConfig(policy_objective="clip-penalty")


def test_replace_validates_and_rejects_unknown_fields():
    config = ppojax.PPOConfig()
    assert config.replace(num_envs=8).num_envs == 8
    with pytest.raises(ValueError, match="num_minibatches"):
        config.replace(num_minibatches=7)
    with pytest.raises(ValueError, match="Did you mean learning_rate"):
        config.replace(learning_rat=1e-3)


def test_presets_build_and_accept_overrides():
    for env_id in PRESETS:
        assert ppojax.PPOConfig.preset(env_id).env_id == env_id
    pendulum = ppojax.PPOConfig.preset("Pendulum-v1", learning_rate=3e-4)
    assert (
        pendulum.learning_rate == 3e-4 and pendulum.num_envs == PRESETS["Pendulum-v1"]["num_envs"]
    )
    assert ppojax.PPOConfig.preset("Catch-bsuite").num_envs == 4  # no preset: the defaults


def test_hidden_sizes_list_becomes_a_tuple():
    assert ppojax.PPOConfig(hidden_sizes=[32, 32]).hidden_sizes == (32, 32)


def test_a_recurrent_config_needs_num_minibatches_to_divide_num_envs():
    ppojax.PPOConfig(num_envs=4, num_minibatches=4, recurrent="gru")  # whole sequences: fine
    ppojax.PPOConfig(num_envs=3, num_minibatches=4)  # feed-forward splits the 384 steps
    with pytest.raises(ConfigError, match="num_minibatches=4 must divide num_envs=3") as error:
        ppojax.PPOConfig(num_envs=3, num_minibatches=4, recurrent="gru")
    assert error.value.field == "num_minibatches"


@pytest.mark.parametrize(
    "settings, field, message",
    [
        ({"encoder": "cnn"}, "encoder", r"needs image observations \[H, W, C\]; CartPole-v1"),
        (
            {"env_id": "Breakout-MinAtar", "encoder": "cnn", "cnn_channels": (8,) * 5},
            "cnn_channels",
            "conv layer 5 gets no output",
        ),
    ],
)
def test_an_encoder_that_cannot_take_the_observations_names_the_field(settings, field, message):
    from ppojax.ppo.train import make_agent

    config = ppojax.PPOConfig(**settings)
    with pytest.raises(ConfigError, match=message) as error:
        make_agent(config)
    assert error.value.field == field
    with pytest.raises(ConfigError, match=message):
        ppojax.train(config, jax.random.key(0))


def test_both_configs_are_frozen_pytree_dataclasses_of_one_kind():
    """PPOConfig and RLHFConfig: frozen, static fields in the structure, the rest leaves that
    vmap sweeps; replace validates again and names an unknown field."""
    import dataclasses

    from ppojax.rlhf import RLHFConfig

    for config in (ppojax.PPOConfig(), RLHFConfig()):
        assert dataclasses.is_dataclass(config)
        with pytest.raises(dataclasses.FrozenInstanceError):
            config.learning_rate = 1.0
        rate = config.learning_rate
        stacked = jax.tree.map(lambda x: jnp.stack([x, x]), config)
        stacked = stacked.replace(learning_rate=jnp.array([rate, 2 * rate]))
        rates = jax.vmap(lambda c: c.learning_rate)(stacked)
        np.testing.assert_allclose(rates, [rate, 2 * rate])
        assert config.replace(learning_rate=0.5).learning_rate == 0.5
        with pytest.raises(ConfigError, match="learning_rate"):
            config.replace(learning_rate=-1.0)
        with pytest.raises(ConfigError, match="lerning_rate"):
            config.replace(lerning_rate=1.0)
    static = RLHFConfig(response_len=12)
    assert jax.tree.structure(static) != jax.tree.structure(RLHFConfig())


def test_an_unknown_advantage_estimator_names_the_field_and_the_known_ones():
    with pytest.raises(ConfigError, match="PPOConfig.advantage_estimator") as error:
        ppojax.PPOConfig(advantage_estimator="gea")
    assert error.value.field == "advantage_estimator"
    assert "'gae'" in str(error.value) and "'monte_carlo'" in str(error.value)
    assert ppojax.PPOConfig(advantage_estimator="monte_carlo").advantage_estimator == "monte_carlo"


def test_a_config_json_from_before_advantage_estimator_reads_as_gae():
    from ppojax.runs import folder

    saved = folder.config_to_dict(ppojax.PPOConfig(num_envs=8))
    del saved["advantage_estimator"]
    assert folder.config_from_dict(saved) == ppojax.PPOConfig(num_envs=8)
    assert folder.config_from_dict(saved).advantage_estimator == "gae"
