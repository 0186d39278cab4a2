"""LoRA: a frozen base plus low-rank adapters on chosen dense kernels, for any params pytree.

A kernel W [in, out] whose parameter path contains one of ``targets`` (``"q_proj"``,
``"c_attn"``, ``"lm_head"``) gets adapters A [in, r] and B [r, out]; the policy uses
W + (alpha / r) A @ B. B starts at 0, so the adapted model starts exactly equal to its base,
and the base itself serves as the reference: there is no second copy of the weights. The
leaves whose path has a part in ``full`` (``lora_full``: a value head the critic reads from
the policy's params, which would otherwise stay at its initial values) are trained in full
instead, each as its own copy.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def path_name(path: tuple) -> str:
    """A parameter path as 'params-layers_0-attn-c_attn-kernel' (one string key per adapted
    kernel)."""
    return "-".join(str(getattr(part, "key", getattr(part, "idx", part))) for part in path)


def adapted_kernels(params: Any, targets: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    """The 2-D leaves named 'kernel' whose path has a part in ``targets``: name -> shape."""
    found = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        parts = [str(getattr(part, "key", part)) for part in path]
        if parts[-1] == "kernel" and leaf.ndim == 2 and any(t in parts for t in targets):
            found[path_name(path)] = tuple(leaf.shape)
    return found


def full_leaves(params: Any, full: tuple[str, ...]) -> dict[str, jax.Array]:
    """The leaves whose path has a part in ``full``: name -> leaf."""
    found = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if any(str(getattr(part, "key", part)) in full for part in path):
            found[path_name(path)] = leaf
    return found


def init_adapters(
    params: Any, targets: tuple[str, ...], rank: int, key: jax.Array, full: tuple[str, ...] = ()
) -> dict[str, dict[str, jax.Array]]:
    """{name: {"a": [in, r] ~ N(0, 1 / in), "b": zeros [r, out]}} for each adapted kernel,
    and {name: {"full": a copy of the leaf}} for each leaf trained in full (``full``), which
    then gets no adapter.

    Raises ValueError naming ``lora_targets`` (or ``lora_full``) when nothing matches."""
    shapes = adapted_kernels(params, targets)
    if not shapes:
        raise ValueError(
            f"RLHFConfig.lora_targets={targets!r} matches no 2-D 'kernel' in the policy's "
            "params; name a part of a dense layer's path (print the params' tree to see them)."
        )
    trained = full_leaves(params, full)
    if full and not trained:
        raise ValueError(
            f"RLHFConfig.lora_full={full!r} matches no leaf of the policy's params; name a "
            "part of the path of the layer to train in full, such as its module's name."
        )
    adapted = sorted(name for name in shapes if name not in trained)
    keys = jax.random.split(key, len(adapted)) if adapted else []
    adapters: dict[str, dict[str, jax.Array]] = {
        name: {"full": jnp.array(leaf)} for name, leaf in trained.items()
    }
    for layer_key, name in zip(keys, adapted, strict=True):
        fan_in, fan_out = shapes[name]
        a = jax.random.normal(layer_key, (fan_in, rank), jnp.float32) / jnp.sqrt(fan_in)
        adapters[name] = {"a": a, "b": jnp.zeros((rank, fan_out), jnp.float32)}
    return adapters


def merge(base: Any, adapters: dict[str, dict[str, jax.Array]], scale: Any) -> Any:
    """``base`` with W + scale * A @ B at every adapted kernel, the trained copy at every leaf
    trained in full, the rest untouched."""

    def adapt(path: tuple, leaf: jax.Array) -> jax.Array:
        adapter = adapters.get(path_name(path))
        if adapter is None:
            return leaf
        if "full" in adapter:
            return adapter["full"]
        return leaf + scale * (adapter["a"] @ adapter["b"]).astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(adapt, base)


def tree_bytes(tree: Any) -> int:
    """Bytes of every array leaf of ``tree``."""
    return int(sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree)))
