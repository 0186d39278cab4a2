"""The policy network (flax.linen): encoder -> optional recurrent core -> actor and critic heads.

Every network is applied to a batch: observations [B, ...] (one leading batch axis) and, for a
recurrent core, its state [B, S]. The rollout and the update only ever call
``network.apply(params, obs, hidden) -> (head, log_std, value, hidden)``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from ppojax.envs import EnvSpec
from ppojax.networks.fused import fused_actor_critic
from ppojax.runtime import kernels

ACTIVATION_FNS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "tanh": jnp.tanh,
    "relu": nn.relu,
    "gelu": nn.gelu,
    "silu": nn.silu,
    "elu": nn.elu,
}


class NetworkSettings(NamedTuple):
    """The static fields that shape the network, by name; their defaults and checks live with
    the fields themselves in ``PPOConfig``, so ``from_fields`` reads them off any object that
    has them. Hashable, so a flax attribute."""

    encoder: str
    hidden_sizes: tuple[int, ...]
    activation: str
    cnn_channels: tuple[int, ...]
    cnn_kernel_size: int
    cnn_stride: int
    recurrent: str | None
    recurrent_size: int
    shared_torso: bool
    state_dependent_std: bool
    init_log_std: float
    compute_dtype: str

    @classmethod
    def from_fields(cls, source: Any) -> NetworkSettings:
        """The settings named by this class's fields, read from ``source``'s attributes."""
        values = {name: getattr(source, name) for name in cls._fields}
        for name in ("hidden_sizes", "cnn_channels"):
            values[name] = tuple(values[name])
        return cls(**values)


def core_state_size(settings: NetworkSettings) -> int:
    """Width of one core's state: H for a GRU, 2H (cell and output) for an LSTM, 0 without."""
    if settings.recurrent is None:
        return 0
    return settings.recurrent_size * (2 if settings.recurrent == "lstm" else 1)


def hidden_size(settings: NetworkSettings) -> int:
    """Width S of the hidden state [B, S]: one core state per torso (two unless shared)."""
    return core_state_size(settings) * (1 if settings.shared_torso else 2)


def flatten_observation(obs: Any) -> jax.Array:
    """Every leaf [B, ...] of an observation pytree flattened and concatenated: [B, D]."""
    leaves = [jnp.asarray(leaf, jnp.float32) for leaf in jax.tree.leaves(obs)]
    return jnp.concatenate([leaf.reshape((leaf.shape[0], -1)) for leaf in leaves], axis=-1)


class MLP(nn.Module):
    """Dense layers of ``hidden_sizes`` with ``activation`` on features [B, D], computed in
    ``dtype`` (float32 parameters, cast for the products)."""

    hidden_sizes: tuple[int, ...]
    activation: str
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATION_FNS[self.activation]
        for size in self.hidden_sizes:
            x = act(nn.Dense(size, dtype=self.dtype)(x))
        return x


class PatchConv(nn.Module):
    """A VALID convolution, ``nn.Conv``'s math and parameters (``kernel`` [k, k, C, F], ``bias``
    [F]), as one matrix product: the k x k patches of the input side by side, [B, H', W',
    k * k * C], times the kernel as [k * k * C, F].

    Why: with XLA's CPU convolution (its backward pass above all) the MinAtar CNN preset trained
    8.4x slower on a 2-core CPU; tests/test_networks.py checks
    outputs and gradients against ``nn.Conv``."""

    features: int
    kernel_size: int
    stride: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        k, stride = self.kernel_size, self.stride
        height, width, channels = x.shape[-3:]
        out_h, out_w = (height - k) // stride + 1, (width - k) // stride + 1
        kernel = self.param(
            "kernel", nn.initializers.lecun_normal(), (k, k, channels, self.features)
        )
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        patches = jnp.concatenate(
            [
                x[
                    ...,
                    i : i + stride * (out_h - 1) + 1 : stride,
                    j : j + stride * (out_w - 1) + 1 : stride,
                    :,
                ]
                for i in range(k)
                for j in range(k)
            ],
            axis=-1,
        )
        kernel = kernel.reshape(k * k * channels, self.features).astype(self.dtype)
        return patches @ kernel + bias.astype(self.dtype)


class CNN(MLP):
    """VALID convolutions of ``channels`` (square kernels, one stride) on [B, H, W, C], then
    flattened and the MLP of ``hidden_sizes`` (the fields it shares with ``MLP``): with the
    defaults MinAtar's network (one 3x3 conv of 16 channels, as in Young & Tian 2019). Each
    convolution is a ``PatchConv``."""

    channels: tuple[int, ...] = (16,)
    kernel_size: int = 3
    stride: int = 1

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        act = ACTIVATION_FNS[self.activation]
        x = jnp.asarray(x, jnp.float32)
        for index, channels in enumerate(self.channels):
            conv = PatchConv(
                channels, self.kernel_size, self.stride, self.dtype, name=f"Conv_{index}"
            )
            x = act(conv(x))
        x = x.reshape((x.shape[0], -1))
        # a submodule, not super().__call__: its parameters stay under "MLP_0" as saved
        return MLP(self.hidden_sizes, self.activation, self.dtype)(x)


class GRUCore(nn.Module):
    """A GRU cell [B, D] x [B, H] -> [B, H], its gates from two matmuls (input, hidden):
    r = s(x Wr + h Ur), z = s(x Wz + h Uz), n = tanh(x Wn + r (h Un + bn)),
    h' = (1 - z) n + z h."""

    size: int

    @nn.compact
    def __call__(self, x: jax.Array, h: jax.Array) -> tuple[jax.Array, jax.Array]:
        from_x = nn.Dense(3 * self.size, name="input")(x)
        from_h = nn.Dense(3 * self.size, name="hidden")(h)
        xr, xz, xn = jnp.split(from_x, 3, axis=-1)
        hr, hz, hn = jnp.split(from_h, 3, axis=-1)
        r = nn.sigmoid(xr + hr)
        z = nn.sigmoid(xz + hz)
        n = jnp.tanh(xn + r * hn)
        h = (1.0 - z) * n + z * h
        return h, h


class LSTMCore(nn.Module):
    """An LSTM cell on the state [B, 2H] = (c, h): i, f, g, o from x W + h U + b,
    c' = s(f) c + s(i) tanh(g), h' = s(o) tanh(c'); the output is h'."""

    size: int

    @nn.compact
    def __call__(self, x: jax.Array, state: jax.Array) -> tuple[jax.Array, jax.Array]:
        c, h = jnp.split(state, 2, axis=-1)
        gates = nn.Dense(4 * self.size, name="input")(x)
        gates = gates + nn.Dense(4 * self.size, use_bias=False, name="hidden")(h)
        i, f, g, o = jnp.split(gates, 4, axis=-1)
        c = nn.sigmoid(f) * c + nn.sigmoid(i) * jnp.tanh(g)
        h = nn.sigmoid(o) * jnp.tanh(c)
        return h, jnp.concatenate([c, h], axis=-1)


CORES = {"gru": GRUCore, "lstm": LSTMCore}


class Torso(nn.Module):
    """Encoder, then the recurrent core when there is one: (obs [B, ...], state [B, S_core]
    or None) -> (features [B, F], new state or None)."""

    settings: NetworkSettings

    @nn.compact
    def __call__(self, obs: Any, state: jax.Array | None) -> tuple[jax.Array, jax.Array | None]:
        s = self.settings
        dtype = jnp.dtype(s.compute_dtype)
        if s.encoder == "cnn":
            cnn = CNN(
                s.hidden_sizes, s.activation, dtype, s.cnn_channels, s.cnn_kernel_size, s.cnn_stride
            )
            x = cnn(obs)
        else:
            x = MLP(s.hidden_sizes, s.activation, dtype)(flatten_observation(obs))
        # the core and the heads compute in float32, whatever the encoder's dtype
        x = x.astype(jnp.float32)
        if s.recurrent is None:
            return x, None
        return CORES[s.recurrent](s.recurrent_size, name="core")(x, state)


class ActorCritic(nn.Module):
    """Actor and critic on one torso (``shared_torso``) or on one torso each.

    ``__call__(obs [B, ...], hidden [B, S] or None)`` -> policy head [B, A] (logits, or the
    Gaussian mean), log_std (None when discrete; a parameter [A], or with
    ``state_dependent_std`` a dense head on the actor's features, [B, A]), value [B] and the
    new hidden state. With two recurrent torsos the hidden state holds the actor's core state,
    then the critic's.
    """

    spec: EnvSpec
    settings: NetworkSettings

    def setup(self) -> None:
        if self.settings.shared_torso:
            self.torso = Torso(self.settings)
        else:
            self.actor_torso = Torso(self.settings)
            self.critic_torso = Torso(self.settings)
        self.actor_head = nn.Dense(self.spec.action_dim)
        self.critic_head = nn.Dense(1)
        if self.spec.discrete:
            return
        if self.settings.state_dependent_std:
            self.log_std_head = nn.Dense(self.spec.action_dim)
        else:
            self.log_std = self.param("log_std", nn.initializers.zeros, (self.spec.action_dim,))

    def __call__(
        self, obs: Any, hidden: jax.Array | None
    ) -> tuple[jax.Array, jax.Array | None, jax.Array, jax.Array | None]:
        if self.fusable() and not self.is_initializing():
            s = self.settings
            head, log_std, value = fused_actor_critic(
                self.variables["params"],
                flatten_observation(obs),
                len(s.hidden_sizes),
                ACTIVATION_FNS[s.activation],
                self.spec.action_dim,
                s.state_dependent_std and not self.spec.discrete,
                jnp.dtype(s.compute_dtype),
            )
            if log_std is None and not self.spec.discrete:
                log_std = self.log_std
            return head, log_std, value, None
        if self.settings.shared_torso:
            features, hidden = self.torso(obs, hidden)
            actor_features, critic_features = features, features
        else:
            actor_state, critic_state = split_hidden(hidden)
            actor_features, actor_state = self.actor_torso(obs, actor_state)
            critic_features, critic_state = self.critic_torso(obs, critic_state)
            hidden = join_hidden(actor_state, critic_state)
        head = self.actor_head(actor_features)
        value = self.critic_head(critic_features)[..., 0]
        return head, self.policy_log_std(actor_features), value, hidden

    def fusable(self) -> bool:
        """Whether the kernels candidate "fused_actor_critic" is chosen and applies: two
        MLP torsos and no recurrent core."""
        s = self.settings
        return (
            kernels.stand_in("fused_actor_critic")
            and not s.shared_torso
            and s.encoder == "mlp"
            and s.recurrent is None
        )

    def policy_log_std(self, actor_features: jax.Array) -> jax.Array | None:
        if self.spec.discrete:
            return None
        if self.settings.state_dependent_std:
            return self.log_std_head(actor_features)
        return self.log_std

    def value(self, obs: Any, hidden: jax.Array | None) -> jax.Array:
        """V(obs) [B] from the state ``hidden``; without the actor when the torsos are apart."""
        if self.settings.shared_torso:
            features, _ = self.torso(obs, hidden)
        else:
            features, _ = self.critic_torso(obs, split_hidden(hidden)[1])
        return self.critic_head(features)[..., 0]


def split_hidden(hidden: jax.Array | None) -> tuple[jax.Array | None, jax.Array | None]:
    """The actor's and the critic's halves of a two-torso hidden state [B, 2 S_core]."""
    if hidden is None:
        return None, None
    actor, critic = jnp.split(hidden, 2, axis=-1)
    return actor, critic


def join_hidden(actor: jax.Array | None, critic: jax.Array | None) -> jax.Array | None:
    if actor is None:
        return None
    return jnp.concatenate([actor, critic], axis=-1)
