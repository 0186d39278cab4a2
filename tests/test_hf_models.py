"""Hugging Face checkpoints in ppojax against what transformers computes on them.

The fixtures under tests/fixtures/hf/ are tiny random checkpoints written by
tests/fixtures/make_hf_fixtures.py with torch + transformers, beside transformers' float32
logits on a left-padded batch, greedy continuations, encodings and chat text; no test here
needs torch or the network.

Logits tolerance: the logits are O(1)-O(10) (weights at N(0, 0.1) over a width of 64), built
from float32 sums of 64-128 terms through two layers; float32 rounding of differently ordered
sums gives ~1e-6 relative, so 2e-4 absolute leaves a wide margin while a wrong position, norm
or RoPE frequency moves logits by 1e-2 or more.
"""

import dataclasses
import functools
import json
import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from ppojax.rlhf import from_pretrained, generate, save_pretrained
from ppojax.rlhf.models import parse_config, read_config
from ppojax.rlhf.models.decoder import Decoder

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hf"
NAMES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "gpt2")
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "héllo, 2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 你好?"},
]


def expected(name: str) -> dict:
    return json.loads((FIXTURES / name / "expected.json").read_text())


@pytest.fixture(scope="module", params=NAMES)
def loaded(request):
    with pytest.warns(UserWarning) if request.param == "gpt2" else _no_warning():
        lm = from_pretrained(FIXTURES / request.param)
    return request.param, lm


class _no_warning:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_logits_match_transformers_at_real_tokens(loaded):
    name, lm = loaded
    data = expected(name)
    tokens, mask = jnp.array(data["tokens"]), jnp.array(data["mask"], bool)
    logits = np.asarray(jax.jit(lm.policy_apply)(lm.params, tokens, mask))
    reference = np.load(FIXTURES / name / "logits.npz")["logits"]
    real = np.asarray(mask)
    np.testing.assert_allclose(logits[real], reference[real], atol=2e-4, rtol=0)


def test_greedy_generation_matches_transformers(loaded):
    name, lm = loaded
    data = expected(name)
    tokens, mask = jnp.array(data["tokens"]), jnp.array(data["mask"], bool)
    new = jax.jit(functools.partial(generate, lm), static_argnums=(4, 5))(
        lm.params, tokens, mask, jax.random.key(0), 8, 0.0
    )
    assert np.asarray(new).tolist() == data["greedy"]
    # With the token row 0 greedily picks third as EOS, row 0 stops there and pads after.
    stop_config = dataclasses.replace(lm.config, eos_ids=(data["stop_id"],))
    stopped = generate(
        lm._replace(config=stop_config), lm.params, tokens, mask, jax.random.key(0), 8, 0.0
    )
    assert np.asarray(stopped).tolist() == data["greedy_stopped"]


def test_cached_prefill_equals_the_full_pass(loaded):
    _, lm = loaded
    tokens = jnp.array([[5, 6, 7, 8], [0, 0, 9, 10]])
    mask = jnp.array([[1, 1, 1, 1], [0, 0, 1, 1]], bool)
    last, _ = lm.kv_cache.prefill(lm.params, tokens, mask, 6)
    full = lm.policy_apply(lm.params, tokens, mask)[:, -1]
    np.testing.assert_allclose(last, full, atol=1e-5)


def test_encodings_and_chat_text_match_transformers(loaded):
    name, lm = loaded
    data = expected(name)
    for text, ids in data["encodings"].items():
        assert lm.tokenizer.encode(text) == ids, text
        assert lm.tokenizer.decode(ids, skip_special_tokens=True).strip() in text
    if data["chat"] is None:
        with pytest.raises(ValueError, match="no chat template"):
            lm.tokenizer.apply_chat_template(MESSAGES)
    else:
        assert (
            lm.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True) == data["chat"]
        )
        # transformers' default: no generation prompt
        plain = lm.tokenizer.apply_chat_template(MESSAGES)
        assert plain == lm.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=False)
        assert data["chat"].startswith(plain)
    assert lm.tokenizer.pad_id == data["pad_id"]


def test_encoding_without_special_tokens_drops_only_them(loaded):
    """A rendered chat or a completion is encoded without a second BOS or an added EOS: the
    plain ids are the full ids less the special tokens the tokenizer adds around them."""
    _, lm = loaded
    tokenizer = lm.tokenizer
    special = {tokenizer.special_id("bos_token", None), tokenizer.eos_id}
    for text in ("What is 12+7?", "héllo wörld"):
        full, plain = tokenizer.encode(text), tokenizer.encode(text, add_special_tokens=False)
        stripped = list(full)
        while stripped[:1] and stripped[0] in special:
            stripped = stripped[1:]
        while stripped[-1:] and stripped[-1] in special:
            stripped = stripped[:-1]
        assert plain == stripped, text


def test_gpt2_pads_with_eos_and_says_so():
    with pytest.warns(UserWarning, match="no pad_token; padding with the eos token"):
        lm = from_pretrained(FIXTURES / "gpt2")
    assert lm.tokenizer.pad_id == lm.tokenizer.eos_id == 0


def test_template_can_raise():
    lm = from_pretrained(FIXTURES / "llama")
    with pytest.raises(Exception, match="unknown role tool"):
        lm.tokenizer.apply_chat_template([{"role": "tool", "content": "x"}])


def test_both_config_layouts_read_the_same_rope():
    new = json.loads((FIXTURES / "qwen3" / "config.json").read_text())
    old = {key: value for key, value in new.items() if key != "rope_parameters"}
    old["rope_theta"] = new["rope_parameters"]["rope_theta"]
    assert parse_config(new).rope_parameters == parse_config(old).rope_parameters
    llama = read_config(FIXTURES / "llama").rope_parameters
    assert llama["rope_type"] == "llama3" and llama["original_max_position_embeddings"] == 64


def test_save_then_load_gives_the_same_logits_and_files(tmp_path):
    lm = from_pretrained(FIXTURES / "llama")
    params = jax.tree.map(lambda leaf: leaf * 1.5, lm.params)
    save_pretrained(lm, lm.init_value_head(params), tmp_path / "out")
    for file in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "out" / file).is_file()
    back = from_pretrained(tmp_path / "out")
    tokens, mask = jnp.array([[3, 4, 5]]), jnp.ones((1, 3), bool)
    np.testing.assert_array_equal(
        lm.policy_apply(params, tokens, mask), back.policy_apply(back.params, tokens, mask)
    )
    original = load_file(FIXTURES / "llama" / "model.safetensors")
    assert set(load_file(tmp_path / "out" / "model.safetensors")) == set(original)


def test_save_merges_lora_adapters(tmp_path):
    lm = from_pretrained(FIXTURES / "qwen2")
    name = "params-layers_0-self_attn-q_proj-kernel"
    a, b = jnp.ones((64, 2)), jnp.full((2, 64), 0.5)
    save_pretrained(lm, lm.params, tmp_path, adapters={name: {"a": a, "b": b}}, lora_scale=2.0)
    saved = load_file(tmp_path / "model.safetensors")["model.layers.0.self_attn.q_proj.weight"]
    base = lm.params["params"]["layers_0"]["self_attn"]["q_proj"]["kernel"]
    np.testing.assert_allclose(saved, np.asarray(base + 2.0 * a @ b).T, atol=1e-6)


def test_value_head_starts_at_zero_and_the_policy_ignores_it():
    lm = from_pretrained(FIXTURES / "qwen3")
    params = lm.init_value_head(lm.params)
    tokens, mask = jnp.array([[3, 4, 5]]), jnp.ones((1, 3), bool)
    assert lm.critic_apply(params, tokens, mask).shape == (1, 3)
    assert not lm.critic_apply(params, tokens, mask).any()
    np.testing.assert_array_equal(
        lm.policy_apply(params, tokens, mask), lm.policy_apply(lm.params, tokens, mask)
    )


def test_bfloat16_params_and_compute():
    lm = from_pretrained(FIXTURES / "qwen2", dtype="bfloat16")
    assert {leaf.dtype for leaf in jax.tree.leaves(lm.params)} == {jnp.dtype(jnp.bfloat16)}
    logits = lm.policy_apply(lm.params, jnp.array([[3, 4, 5]]), jnp.ones((1, 3), bool))
    assert logits.dtype == jnp.bfloat16 and bool(jnp.isfinite(logits).all())


def test_sampling_respects_top_k():
    lm = from_pretrained(FIXTURES / "qwen3")
    tokens, mask = jnp.array([[3, 4, 5]] * 4), jnp.ones((4, 3), bool)
    greedy = generate(lm, lm.params, tokens, mask, jax.random.key(0), 4, 0.0)
    top1 = generate(lm, lm.params, tokens, mask, jax.random.key(1), 4, 1.0, top_k=1)
    nucleus = generate(lm, lm.params, tokens, mask, jax.random.key(2), 4, 1.0, top_p=1e-6)
    np.testing.assert_array_equal(greedy, top1)
    np.testing.assert_array_equal(greedy, nucleus)


def copy_fixture(name: str, tmp_path: Path) -> Path:
    folder = tmp_path / name
    shutil.copytree(FIXTURES / name, folder)
    return folder


def test_sharded_checkpoint_loads_like_the_single_file(tmp_path):
    folder = copy_fixture("llama", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    names = sorted(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[:5],
        "model-00002-of-00002.safetensors": names[5:],
    }
    for shard, members in shards.items():
        save_file({name: tensors[name] for name in members}, folder / shard)
    weight_map = {name: shard for shard, members in shards.items() for name in members}
    index = {"metadata": {}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    (folder / "model.safetensors").unlink()
    sharded = from_pretrained(folder)
    single = from_pretrained(FIXTURES / "llama")
    jax.tree.map(np.testing.assert_array_equal, sharded.params, single.params)
    (folder / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match="names the shard model-00002-of-00002"):
        from_pretrained(folder)


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors", "tokenizer.json"])
def test_a_folder_without_a_file_says_which(tmp_path, missing):
    folder = copy_fixture("qwen2", tmp_path)
    (folder / missing).unlink()
    with pytest.raises(FileNotFoundError, match=missing.replace(".", r"\.")):
        from_pretrained(folder)


def test_unsupported_model_type_and_missing_field(tmp_path):
    folder = copy_fixture("qwen2", tmp_path)
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "model_type": "bert"}))
    with pytest.raises(ValueError, match="model_type 'bert' is not supported"):
        from_pretrained(folder)
    del raw["hidden_size"]
    (folder / "config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match="has no 'hidden_size'"):
        from_pretrained(folder)


def test_missing_or_misshaped_tensor_is_named(tmp_path):
    folder = copy_fixture("llama", tmp_path)
    tensors = load_file(folder / "model.safetensors")
    name = "model.layers.1.mlp.up_proj.weight"
    save_file({**tensors, name: tensors[name][:, :10]}, folder / "model.safetensors")
    with pytest.raises(
        ValueError, match=r"up_proj.weight' in model.safetensors has shape \(96, 10\)"
    ):
        from_pretrained(folder)
    del tensors["lm_head.weight"]
    save_file(tensors, folder / "model.safetensors")
    with pytest.raises(KeyError, match="'lm_head.weight' is missing from model.safetensors"):
        from_pretrained(folder)


def test_wrong_dtype_string():
    with pytest.raises(ValueError, match="dtype='bf16' is not one of"):
        from_pretrained(FIXTURES / "qwen2", dtype="bf16")


def test_mistral_window_is_applied_and_qwen_windows_are_refused(tmp_path):
    # The mistral fixture's window (6) is shorter than its test batch: the logits above
    # match transformers only because the window is applied. Without it they differ.
    lm = from_pretrained(FIXTURES / "mistral")
    tokens = jnp.arange(3, 13)[None]
    mask = jnp.ones_like(tokens, bool)
    windowed = lm.module.apply(lm.params, tokens, mask)[0]
    unwindowed = Decoder(dataclasses.replace(lm.config, sliding_window=None), lm.module.dtype)
    full = unwindowed.apply(lm.params, tokens, mask)[0]
    # Two compiled programs: inside the window the masked keys weigh exactly 0, so the logits
    # (scale ~4) agree to float32 rounding; 2e-4 as for the fixtures. Beyond it they differ
    # by ~2 (measured), far past either bound.
    np.testing.assert_allclose(windowed[:, :6], full[:, :6], atol=2e-4)
    assert np.abs(np.asarray(windowed[:, 6:] - full[:, 6:])).max() > 1e-3
    folder = copy_fixture("qwen2", tmp_path)
    raw = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**raw, "use_sliding_window": True}))
    with pytest.raises(ValueError, match="use_sliding_window"):
        from_pretrained(folder)


def test_a_hub_repo_id_downloads_through_huggingface_hub(tmp_path, monkeypatch):
    calls = []

    def snapshot_download(repo_id, revision=None, allow_patterns=None):
        calls.append((repo_id, revision, allow_patterns))
        return str(copy_fixture("llama", tmp_path))

    fake = type(sys)("huggingface_hub")
    fake.snapshot_download = snapshot_download
    monkeypatch.setitem(sys.modules, "huggingface_hub", fake)
    lm = from_pretrained("tiny-org/tiny-llama@main")
    assert calls == [("tiny-org/tiny-llama", "main", ["*.json", "*.safetensors", "*.jinja"])]
    assert lm.config.model_type == "llama"


def test_a_hub_repo_id_without_huggingface_hub_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(ImportError, match=r"ppojax\[hf\]"):
        from_pretrained("tiny-org/tiny-llama")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        from_pretrained("no/such/local/folder")


def test_gemma3_configs_of_both_transformers_layouts_read_the_same():
    # transformers 4.x wrote rope_theta (full layers), rope_local_base_freq (sliding layers)
    # and sliding_window_pattern; transformers 5 writes layer_types and RoPE per layer type.
    new = json.loads((FIXTURES / "gemma3" / "config.json").read_text())
    old = {k: v for k, v in new.items() if k not in ("rope_parameters", "layer_types")}
    old.update(rope_theta=1e6, rope_local_base_freq=1e4, sliding_window_pattern=2)
    a, b = parse_config(new), parse_config(old)
    fields = ("rope", "local_rope", "sliding_layers", "sliding_window", "query_scale")
    assert [getattr(a, f) for f in fields] == [getattr(b, f) for f in fields]
    assert a.sliding_layers == (True, False) and a.layer_window(1) is None
    assert a.layer_rope(0)["rope_theta"] == 1e4 and a.layer_rope(1)["rope_theta"] == 1e6
    gemma2 = json.loads((FIXTURES / "gemma2" / "config.json").read_text())
    del gemma2["layer_types"]  # Gemma 2's rule: sliding, full, sliding, ...
    assert parse_config(gemma2).sliding_layers == (True, False)
