"""Hugging Face safetensors <-> the decoder's Flax params.

A folder holds model.safetensors, or shards named by model.safetensors.index.json's
``weight_map``. Each Flax leaf has one Hugging Face tensor: ``layers_0/self_attn/q_proj/kernel``
is ``model.layers.0.self_attn.q_proj.weight`` transposed (torch's Linear stores [out, in]);
GPT-2's Conv1D already stores [in, out], so its kernels are not transposed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import ml_dtypes  # noqa: F401  (registers bfloat16 with numpy, which safetensors' loader needs)
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from ppojax.rlhf.models.config import DecoderConfig

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
LEAF_NAMES = {"kernel": "weight", "scale": "weight", "embedding": "weight", "bias": "bias"}


def hf_name(config: DecoderConfig, path: tuple[str, ...]) -> tuple[str, bool]:
    """The Hugging Face tensor of the Flax leaf at ``path`` (below "params"), and whether the
    Flax leaf is its transpose."""
    *modules, leaf = path
    gpt2 = config.model_type == "gpt2"
    head, *rest = modules
    if head.startswith("layers_"):
        block = f"h.{head[len('layers_') :]}" if gpt2 else f"layers.{head[len('layers_') :]}"
        modules = [block, *rest]
    elif head == "embed":
        modules = ["embed_tokens"]
    name = ".".join([*modules, LEAF_NAMES[leaf]])
    if head != "lm_head":
        name = f"transformer.{name}" if gpt2 else f"model.{name}"
    return name, leaf == "kernel" and not gpt2


def leaf_path(key_path: tuple) -> tuple[str, ...]:
    """A pytree key path as plain strings, without the leading "params"."""
    parts = tuple(str(getattr(part, "key", part)) for part in key_path)
    return parts[1:] if parts[0] == "params" else parts


def tensor_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it; FileNotFoundError naming what is
    missing (no weights at all, or a shard the index names)."""
    index = folder / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index} has no 'weight_map' of tensor names to shard files.")
        for shard in sorted(set(weight_map.values())):
            if not (folder / shard).is_file():
                raise FileNotFoundError(
                    f"{index} names the shard {shard}, which is not in {folder}; download "
                    "every shard the index lists."
                )
        return {name: folder / shard for name, shard in weight_map.items()}
    single = folder / SINGLE
    if not single.is_file():
        raise FileNotFoundError(
            f"{folder} has neither {SINGLE} nor {INDEX}: ppojax reads the weights as "
            "safetensors (convert a pytorch_model.bin with transformers' save_pretrained)."
        )
    with open_weights(single) as handle:
        return dict.fromkeys(handle.keys(), single)


class MissingTensorError(KeyError, ValueError):
    """A tensor the config needs that the weights lack (a ``ValueError`` too, so that the
    command line shows it as one line)."""

    def __str__(self) -> str:
        return str(self.args[0])  # KeyError's would quote the message


def open_weights(path: Path) -> Any:
    """``safe_open`` of ``path``; ``ValueError`` naming it when it is not a whole safetensors
    file (a download or copy cut short)."""
    try:
        return safe_open(path, "numpy")
    except SafetensorError as error:
        raise ValueError(
            f"{path} is not a readable safetensors file ({error}); it may be cut short: "
            "download or save it again."
        ) from None


def read_tensor(files: dict[str, Path], name: str, shape: tuple[int, ...]) -> np.ndarray:
    """The tensor ``name`` of the expected ``shape`` (Hugging Face's layout); errors naming
    the tensor, its file and both shapes."""
    if name not in files:
        where = ", ".join(sorted({path.name for path in files.values()})) or "the weights"
        raise MissingTensorError(
            f"tensor {name!r} is missing from {where}; the checkpoint does not match its "
            "config.json (model_type, number of layers, tie_word_embeddings)."
        )
    with open_weights(files[name]) as handle:
        found = tuple(handle.get_slice(name).get_shape())
        if found != shape:
            raise ValueError(
                f"tensor {name!r} in {files[name].name} has shape {found}, but config.json "
                f"gives {shape}; the weights and config.json come from different models."
            )
        return handle.get_tensor(name)


def load_params(folder: Path, config: DecoderConfig, shapes: Any, dtype: Any) -> Any:
    """The Flax params of the tree of shapes ``shapes`` (from ``jax.eval_shape`` of init),
    read from ``folder``'s safetensors and cast to ``dtype``."""
    files = tensor_files(folder)

    def load(key_path: tuple, like: jax.ShapeDtypeStruct) -> np.ndarray:
        name, transposed = hf_name(config, leaf_path(key_path))
        shape = tuple(reversed(like.shape)) if transposed else tuple(like.shape)
        tensor = read_tensor(files, name, shape)
        return np.asarray(tensor.T if transposed else tensor).astype(dtype)

    return jax.tree_util.tree_map_with_path(load, shapes)


def save_params(params: Any, config: DecoderConfig, path: Path) -> None:
    """``params`` (without a value head) as one safetensors file in Hugging Face's names."""
    tensors = {}
    for key_path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        name, transposed = hf_name(config, leaf_path(key_path))
        array = np.asarray(leaf)
        tensors[name] = np.ascontiguousarray(array.T if transposed else array)
    save_file(tensors, str(path), metadata={"format": "pt"})
