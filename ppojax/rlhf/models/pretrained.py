"""``from_pretrained`` and ``save_pretrained``: a Hugging Face folder as a policy in
``make_trainer``'s contract, and back.

    lm = from_pretrained("path/to/Qwen2.5-0.5B-Instruct")
    trainer = make_trainer(config, lm.policy_apply, rewards, kv_cache=lm.kv_cache)
    save_pretrained(lm, params, "out/")

The critic is a value head on the decoder's final hidden states, ``params["params"]
["value_head"]``, which ``init_value_head`` adds (at 0, so V starts at 0) and the policy
ignores. Saving writes the decoder's tensors only, in Hugging Face's names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from safetensors.numpy import load_file, save_file

from ppojax.rlhf.core import lora
from ppojax.rlhf.core.sampling import KVCacheHook
from ppojax.rlhf.core.sharding import shard_state
from ppojax.rlhf.models.config import DecoderConfig, read_config
from ppojax.rlhf.models.decoder import Decoder
from ppojax.rlhf.models.tokenizer import Tokenizer
from ppojax.rlhf.models.transformer import (
    VALUE_HEAD,
    contract,
    decoder_params,
    value_head,
)
from ppojax.rlhf.models.weights import SINGLE, load_params, save_params

VALUE_HEAD_FILE = "value_head.safetensors"
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


class PretrainedLM(NamedTuple):
    """A loaded checkpoint: its params, the pieces ``make_trainer`` takes, its tokenizer."""

    module: Decoder
    params: dict
    policy_apply: Any
    critic_apply: Any
    kv_cache: KVCacheHook
    tokenizer: Tokenizer
    config: DecoderConfig

    def init_value_head(self, params: dict) -> dict:
        """``params`` with a zero value head [D] -> 1 beside the decoder (V starts at 0)."""
        head = value_head(self.config.hidden_size, self.module.dtype)
        return {"params": {**params["params"], VALUE_HEAD: head}}


def resolve_dtype(dtype: Any) -> Any:
    """None (float32), a name in DTYPES or a jnp dtype; ValueError naming the choices."""
    if dtype is None:
        return jnp.float32
    if isinstance(dtype, str):
        if dtype not in DTYPES:
            raise ValueError(f"dtype={dtype!r} is not one of {sorted(DTYPES)}.")
        return DTYPES[dtype]
    return dtype


# "org/name" or "name", with an optional "@revision": what the Hub calls a repo id
REPO_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*(?:@[\w./-]+)?$")
# the files loading reads; the rest of a Hub repo (other weight formats, images) stays there
HUB_FILES = ["*.json", "*.safetensors", "*.jinja"]


def model_folder(path: str | Path) -> Path:
    """The local folder of ``path``: a folder as it is, or a Hub repo id ("Qwen/Qwen2.5-0.5B",
    "org/name@revision") fetched through huggingface_hub's cache (the ``hf`` extra)."""
    folder = Path(path)
    if folder.is_dir():
        return folder
    if not REPO_ID.match(str(path)):
        raise FileNotFoundError(
            f"{folder} is not a folder; give a local Hugging Face model folder or a Hub repo "
            "id such as Qwen/Qwen2.5-0.5B-Instruct."
        )
    try:
        import huggingface_hub
    except ImportError:
        raise ImportError(
            f"{path} is not a local folder, and downloading it as a Hub repo id needs "
            "huggingface_hub: pip install 'ppojax[hf]'."
        ) from None
    repo_id, _, revision = str(path).partition("@")
    try:
        local = huggingface_hub.snapshot_download(
            repo_id, revision=revision or None, allow_patterns=HUB_FILES
        )
    except Exception as error:
        raise FileNotFoundError(
            f"{path} is not a local folder, and the Hub download of repo {repo_id!r} failed: "
            f"{error}"
        ) from error
    return Path(local)


def from_pretrained(
    path: str | Path, *, dtype: Any = None, mesh: Mesh | None = None
) -> PretrainedLM:
    """The checkpoint in the local folder ``path`` (config.json, *.safetensors,
    tokenizer.json), or of the Hub repo id ``path`` (``model_folder``): params in ``dtype``
    (None: float32; "bfloat16" for bfloat16 params and compute), ``policy_apply``,
    ``critic_apply``, ``kv_cache``, ``tokenizer``, ``config``. With a ("data", "fsdp")
    ``mesh`` each device receives only its shards of the params
    (``ppojax.rlhf.core.sharding``)."""
    folder = model_folder(path)
    dtype = resolve_dtype(dtype)
    config = read_config(folder)
    tokenizer = Tokenizer(folder, config.eos_ids)
    check_vocab(folder, tokenizer, config.vocab_size)
    module = Decoder(config, dtype)
    tokens = jnp.zeros((1, 1), jnp.int32)
    shapes = jax.eval_shape(module.init, jax.random.key(0), tokens, jnp.ones((1, 1), bool))
    params = load_params(folder, config, shapes, dtype)
    if mesh is not None:
        params = shard_state(params, mesh)
    policy_apply, critic_apply, hook = contract(module)
    return PretrainedLM(module, params, policy_apply, critic_apply, hook, tokenizer, config)


def check_vocab(folder: Path, tokenizer: Tokenizer, vocab_size: int) -> None:
    """``ValueError`` for a tokenizer with ids at or past ``vocab_size``: they have no
    embedding row, and flax's Embed (jnp.take) reads NaN for them: a step on them makes every
    param NaN."""
    size = max(tokenizer.rust.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    if size > vocab_size:
        raise ValueError(
            f"{folder / 'tokenizer.json'} has token ids up to {size - 1}, but "
            f"{folder / 'config.json'} has vocab_size {vocab_size} (embedding rows): use the "
            f"tokenizer the model was trained with, or grow the embeddings to {size} rows "
            "(transformers' model.resize_token_embeddings) and save the folder again"
        )


def save_pretrained(
    lm: PretrainedLM,
    params: dict,
    folder: str | Path,
    adapters: dict | None = None,
    lora_scale: float = 1.0,
) -> Path:
    """Write ``params`` as a Hugging Face folder: config.json, model.safetensors and the
    tokenizer's files, and value_head.safetensors when ``params`` hold a value head (a reward
    model; ``load_value_head`` reads it back). With LoRA ``adapters``
    (``RLHFState.params["policy"]``, params being the base) they are merged first,
    W + lora_scale A @ B (lora_scale = alpha / rank)."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    if adapters is not None:
        params = lora.merge(params, adapters, lora_scale)
    save_params(decoder_params(params)["params"], lm.config, out / SINGLE)
    if VALUE_HEAD in params["params"]:
        head = params["params"][VALUE_HEAD]
        save_file({name: np.asarray(leaf) for name, leaf in head.items()}, out / VALUE_HEAD_FILE)
    raw = lm.config.to_json()
    raw["torch_dtype"] = raw["dtype"] = jnp.dtype(lm.module.dtype).name
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    lm.tokenizer.save(out)
    return out


def load_value_head(lm: PretrainedLM, folder: str | Path) -> dict:
    """``lm.params`` with the value head ``save_pretrained`` wrote to ``folder`` (a reward
    model's scalar head); ``FileNotFoundError`` naming the file when there is none."""
    path = Path(folder) / VALUE_HEAD_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} does not exist: a reward model folder holds the value head that "
            "`ppojax rm` writes beside model.safetensors."
        )
    shapes = lm.init_value_head(lm.params)["params"][VALUE_HEAD]
    head = load_file(path)
    for name, like in shapes.items():
        if name not in head or head[name].shape != like.shape:
            got = head[name].shape if name in head else "nothing"
            raise ValueError(f"{path}: {name} must have shape {like.shape}, got {got}.")
    head = {name: jnp.asarray(head[name], like.dtype) for name, like in shapes.items()}
    return {"params": {**lm.params["params"], VALUE_HEAD: head}}
