"""Post-training on text: prompt data, text rewards, DPO, SFT and reward models on pairs, with
the tiny Hugging Face fixtures (tests/fixtures/hf/) and no network."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from ppojax.rlhf import RLHFConfig, from_pretrained, make_trainer
from ppojax.rlhf import data as text_data
from ppojax.rlhf import text_rewards as tr
from ppojax.rlhf.post import dpo, reward_model, sft
from ppojax.rlhf.post import pairs as pair_data

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "hf"


@pytest.fixture(scope="module")
def lm():
    return from_pretrained(FIXTURES / "qwen2")


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


ADDITION = [
    {"question": "What is 12+7?", "answer": "19", "level": 1},
    {"question": "What is 3+4?", "answer": "7", "level": 0},
    {"question": "What is 20+22? Think first.", "answer": "#### 42", "level": 2},
    {"question": "What is 1+1?", "answer": "2", "level": 0},
]


# Prompt data


def test_jsonl_prompts_are_left_padded_with_columns_kept(lm, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", ADDITION)
    data = text_data.load_prompts(path, lm.tokenizer, field="question")
    ids = [lm.tokenizer.encode(row["question"]) for row in ADDITION]
    width = max(map(len, ids))
    assert data.tokens.shape == (4, width) and data.tokens.dtype == jnp.int32
    for row, expected in enumerate(ids):
        pad = width - len(expected)
        np.testing.assert_array_equal(data.tokens[row, pad:], expected)
        assert (data.tokens[row, :pad] == lm.tokenizer.pad_id).all()
        np.testing.assert_array_equal(data.mask[row], np.arange(width) >= pad)
    assert data.prompts == tuple(row["question"] for row in ADDITION)
    assert data.columns == {"answer": ("19", "7", "#### 42", "2"), "level": (1, 0, 2, 0)}


def test_chat_prompts_go_through_the_template_without_extra_special_tokens(lm):
    data = text_data.load_prompts(["hi"], lm.tokenizer, chat=True)
    text = lm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True
    )
    plain = lm.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}])
    assert plain != text and text.startswith(plain)  # transformers' default: no model turn
    expected = lm.tokenizer.rust.encode(text, add_special_tokens=False).ids
    assert data.tokens[0].tolist() == expected
    assert lm.tokenizer.decode(data.tokens[0]) == text


def test_long_prompts_are_truncated_on_the_left_or_dropped_and_counted(lm):
    prompts = ["What is 1+1?", "A much longer question: what is 12+7, please?"]
    short = len(lm.tokenizer.encode(prompts[0]))
    with pytest.warns(UserWarning, match="1 prompts truncated and 0 dropped"):
        data = text_data.load_prompts(prompts, lm.tokenizer, max_len=short)
    assert data.tokens.shape == (2, short) and (data.truncated, data.dropped) == (1, 0)
    np.testing.assert_array_equal(data.tokens[1], lm.tokenizer.encode(prompts[1])[-short:])
    with pytest.warns(UserWarning, match="0 prompts truncated and 1 dropped"):
        data = text_data.load_prompts(prompts, lm.tokenizer, max_len=short, overflow="drop")
    assert data.prompts == (prompts[0],) and data.dropped == 1
    with pytest.raises(ValueError, match="row 2: the prompt has .* tokens, more than max_len"):
        text_data.load_prompts(prompts, lm.tokenizer, max_len=short, overflow="error")


@pytest.mark.parametrize(
    "lines, message",
    [
        (['{"prompt": "a"}', '{"question": "b"}'], r"line 2: no field 'prompt'"),
        (['{"prompt": "a"}', "", '{"prompt": 3}'], r"line 3: field 'prompt' must be a string"),
        (['{"prompt": "a"}', "{not json"], r"line 2: not valid JSON"),
        (['["prompt"]'], r"line 1: expected a JSON object"),
        (["", "  "], r"is empty"),
    ],
)
def test_bad_jsonl_names_the_line(lm, tmp_path, lines, message):
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines))
    with pytest.raises(ValueError, match=message) as error:
        text_data.load_prompts(path, lm.tokenizer)
    assert str(path) in str(error.value)


class FakeSplit:
    """What load_prompts reads of a ``datasets`` split: iteration over row dicts."""

    column_names = ["question", "answer", "level"]

    def __iter__(self):
        return iter(ADDITION)


def test_a_datasets_split_reads_like_the_file(lm, tmp_path):
    from_file = text_data.load_prompts(
        write_jsonl(tmp_path / "p.jsonl", ADDITION), lm.tokenizer, field="question"
    )
    from_split = text_data.load_prompts(FakeSplit(), lm.tokenizer, field="question")
    np.testing.assert_array_equal(from_file.tokens, from_split.tokens)
    assert from_file.columns == from_split.columns


def test_hf_split_without_datasets_says_how_to_install(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ImportError, match="pip install datasets"):
        text_data.hf_split("gsm8k", "train")


def test_held_out_split_keeps_rows_and_columns_together(lm):
    rows = [{"prompt": f"What is {i}+1?", "answer": str(i + 1)} for i in range(10)]
    data = text_data.load_prompts(rows, lm.tokenizer)
    train, held = text_data.split_held_out(data, held_out=0.3, seed=1)
    assert (len(train), len(held)) == (7, 3)
    assert sorted(train.prompts + held.prompts) == sorted(data.prompts)
    for part in (train, held):
        for row, prompt in enumerate(part.prompts):
            index = data.prompts.index(prompt)
            np.testing.assert_array_equal(part.tokens[row], data.tokens[index])
            assert part.columns["answer"][row] == rows[index]["answer"]
    with pytest.raises(ValueError, match="held_out=10 leaves 0 of 10"):
        text_data.split_held_out(data, held_out=10)


def test_held_out_split_takes_the_same_rows_of_prompts_and_of_any_array_pytree(lm):
    """One split for prompts (``PromptData``) and pairs (any pytree of [N, ...] arrays): the
    same seed holds out the same rows of both, each part in the data's order."""
    data = text_data.load_prompts([f"q{i}" for i in range(10)], lm.tokenizer)
    arrays = {"row": np.arange(10), "pair": np.arange(20).reshape(10, 2)}
    train, held = text_data.split_held_out(arrays, 3, seed=4)
    _, held_prompts = text_data.split_held_out(data, 3, seed=4)
    assert held["row"].tolist() == [int(prompt[1:]) for prompt in held_prompts.prompts]
    assert held["row"].tolist() == sorted(held["row"].tolist())
    assert sorted([*train["row"].tolist(), *held["row"].tolist()]) == list(range(10))
    np.testing.assert_array_equal(held["pair"], 2 * held["row"][:, None] + np.arange(2))
    with pytest.raises(ValueError, match="held_out=0 leaves 10 of 10 rows"):
        text_data.split_held_out(arrays, 0)


def test_draw_batch_takes_distinct_rows_inside_jit(lm):
    data = text_data.load_prompts([f"What is {i}+1?" for i in range(12)], lm.tokenizer)
    draw = jax.jit(text_data.draw_batch, static_argnums=2)
    (tokens, mask), rows = draw(data, jax.random.key(3), 5)
    assert rows.shape == (5,) and len(set(rows.tolist())) == 5
    np.testing.assert_array_equal(tokens, data.tokens[rows])
    np.testing.assert_array_equal(mask, data.mask[rows])
    (_, _), again = draw(data, jax.random.key(3), 5)
    np.testing.assert_array_equal(rows, again)
    # one program: the draw is device-side, no host callback
    text = draw.lower(data, jax.random.key(3), 5).as_text()
    assert "callback" not in text


# Text rewards


def test_columns_reach_only_functions_that_take_them():
    seen = {}

    def plain(prompts, responses):
        return [0.0] * len(responses)

    def named(prompts, responses, answer):
        seen["named"] = answer
        return [1.0] * len(responses)

    def keywords(prompts, responses, **columns):
        seen["kwargs"] = columns
        return [2.0] * len(responses)

    columns = {"answer": ["1", "2"], "level": [0, 1]}
    for fn, value in ((plain, 0.0), (named, 1.0), (keywords, 2.0)):
        out = tr.call_text_reward(fn, ["p", "q"], ["a", "b"], columns)
        np.testing.assert_array_equal(out, [value, value])
    assert seen == {"named": ["1", "2"], "kwargs": columns}


@pytest.mark.parametrize(
    "value, message",
    [
        ([1.0], r"bad_reward returned 1 rewards for 2 responses"),
        ([1.0, float("nan")], r"bad_reward returned NaN at position 1"),
        ([float("inf"), 1.0], r"bad_reward returned inf at position 0"),
        ([1.0, -np.inf], r"bad_reward returned -inf at position 1"),
        ([1.0, "1"], r"bad_reward returned '1' at position 1, not a number"),
        (1.0, r"bad_reward returned float"),
    ],
)
def test_bad_reward_output_names_the_function(value, message):
    def bad_reward(prompts, responses):
        return value

    with pytest.raises(ValueError, match=message):
        tr.call_text_reward(bad_reward, ["p", "q"], ["a", "b"])


def test_builtin_rewards():
    responses = ["so 12+7 = 19", "#### 1,234.", "I think 41, no, 42", "no idea", "#### 7"]
    answers = ["19", "1234", "#### 42", "3", "7.0"]
    assert tr.exact_match([""] * 5, responses, answers) == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert tr.extract_answer("12 then #### $5") == "5"
    fmt = tr.regex_reward(r"<think>.*</think>\s*<answer>.*</answer>")
    out = fmt(["", ""], [" <think>a\nb</think> <answer>3</answer>\n", "<answer>3</answer>"])
    assert out == [1.0, 0.0] and fmt.__name__ == "regex_format"
    assert tr.regex_reward(r"\d", full=False)([""], ["x1y"]) == [1.0]
    assert tr.length_penalty(4)(["", ""], ["abc", "abcdef"]) == [0.0, -0.5]


def answer_text(lm, text: str) -> list[int]:
    return lm.tokenizer.rust.encode(text, add_special_tokens=False).ids


def test_text_reward_inside_jit_finds_rows_by_prompt_tokens(lm):
    data = text_data.load_prompts(ADDITION, lm.tokenizer, field="question")
    reward = jax.jit(tr.text_reward(tr.exact_match, lm.tokenizer, data))
    eos = lm.tokenizer.eos_id
    texts = ["19", "8", "#### 42", "2"]
    # rows in another order than the data and repeated, as a GRPO group would have them
    order = np.array([2, 0, 0, 3, 1])
    width = 8
    responses = np.full((5, width), lm.tokenizer.pad_id, np.int32)
    mask = np.zeros((5, width), bool)
    for i, row in enumerate(order):
        ids = answer_text(lm, texts[row]) + [eos]
        responses[i, : len(ids)] = ids
        mask[i, : len(ids)] = True
    # tokens after EOS are not read even when they would change the answer
    responses[1, mask[1].sum()] = answer_text(lm, "5")[0]
    out = reward(data.tokens[order], data.mask[order], responses, mask)
    np.testing.assert_array_equal(out, [1.0, 1.0, 1.0, 1.0, 0.0])
    assert reward.__name__ == "exact_match"
    # under vmap (a beta sweep) every copy is scored
    batched = jax.vmap(lambda r: reward(data.tokens[order], data.mask[order], r, mask))
    np.testing.assert_array_equal(batched(jnp.stack([responses, responses])), [out, out])


@pytest.mark.parametrize(
    "value, message",
    [
        (None, "returned NoneType; return a list"),
        (["1", "2"], "returned '1' at position 0, not a number"),
        ([1.0], "returned 1 rewards for 2 responses"),
        ([1.0, float("inf")], "returned inf at position 1"),
        ([float("nan"), 1.0], "returned NaN at position 0"),
        (ZeroDivisionError("division by zero"), "division by zero"),
    ],
)
def test_a_text_rewards_error_in_training_is_kept_and_its_rewards_are_nan(lm, value, message):
    """With a ``failures`` list (what ``ppojax rlhf`` trains with) a reward's error on its
    second call is kept with its FILE:LINE, not raised inside XLA; the rewards are NaN from
    then on, and the function is not called again."""
    data = text_data.load_prompts(["What is 1+1?", "What is 2+2?"], lm.tokenizer)
    calls = []

    def flaky(prompts, responses):
        calls.append(len(responses))
        if len(calls) > 1 and isinstance(value, Exception):
            raise value
        return [0.5, 0.25] if len(calls) == 1 else value

    failures = []
    reward = jax.jit(tr.text_reward(flaky, lm.tokenizer, data, failures))
    responses = jnp.ones((2, 3), jnp.int32)
    np.testing.assert_array_equal(
        reward(data.tokens, data.mask, responses, responses > 0), [0.5, 0.25]
    )
    assert failures == []
    for _ in range(2):
        out = reward(data.tokens, data.mask, responses, responses > 0)
        assert np.isnan(np.asarray(out)).all()
    assert len(calls) == 2
    ((fn, error, where),) = failures
    assert fn is flaky and message in str(error)
    line = flaky.__code__.co_firstlineno + (3 if isinstance(value, Exception) else 0)
    assert where == f"{__file__}:{line}"
    with pytest.raises(Exception, match=message):  # without the list it raises, as before
        bare = tr.text_reward(flaky, lm.tokenizer, data)
        jax.block_until_ready(bare(data.tokens, data.mask, responses, responses > 0))


def test_text_reward_rejects_unknown_prompts_and_ambiguous_rows(lm):
    data = text_data.load_prompts(["What is 1+1?"], lm.tokenizer)
    other = text_data.load_prompts(["What is 2+2?"], lm.tokenizer)
    reward = tr.text_reward(tr.length_penalty(3), lm.tokenizer, data)
    responses = jnp.zeros((1, 2), jnp.int32)
    with pytest.raises(Exception, match="is not in the data given to text_reward"):
        jax.block_until_ready(reward(other.tokens, other.mask, responses, responses > 0))
    twice = text_data.load_prompts(
        [{"prompt": "x", "answer": "1"}, {"prompt": "x", "answer": "2"}], lm.tokenizer
    )
    with pytest.raises(ValueError, match="same tokens but different columns"):
        tr.text_reward(tr.exact_match, lm.tokenizer, twice)


def test_text_rewards_train_with_weights_in_make_trainer(lm):
    data = text_data.load_prompts(ADDITION[:2], lm.tokenizer, field="question")
    tok = lm.tokenizer
    rewards = [
        tr.text_reward(tr.exact_match, tok, data),
        tr.text_reward(tr.length_penalty(2), tok, data),
    ]
    config = RLHFConfig(
        algorithm="grpo",
        group_size=2,
        response_len=3,
        num_minibatches=1,
        update_epochs=1,
        pad_id=tok.pad_id,
        eos_id=tok.eos_id,
        reward_weights=(1.0, 0.5),
    )
    trainer = make_trainer(config, lm.policy_apply, rewards, kv_cache=lm.kv_cache)
    state = trainer.init(lm.params, jax.random.key(0))
    _, metrics = jax.jit(trainer.step)(state, data.tokens, data.mask, jax.random.key(1))
    assert trainer.reward_names == ("exact_match", "length_penalty")
    match, penalty = metrics["rewards/exact_match/mean"], metrics["rewards/length_penalty/mean"]
    assert penalty <= 0.0
    np.testing.assert_allclose(metrics["objective/scores"], match + 0.5 * penalty, atol=1e-6)


# Preference pairs: DPO and reward models

PAIRS = [
    {"prompt": "What is 12+7?", "chosen": "19", "rejected": "18"},
    {"prompt": "What is 3+4?", "chosen": "7", "rejected": "I do not know"},
    {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"},
    {"prompt": "What is 5+1?", "chosen": "6", "rejected": "61"},
]


@pytest.fixture(scope="module")
def pairs(lm):
    return pair_data.load_pairs(PAIRS, lm.tokenizer)


def test_pairs_encode_prompt_left_and_responses_right_with_eos(lm, pairs):
    tok = lm.tokenizer
    assert pairs.prompts.shape[0] == 4 and pairs.chosen.shape == pairs.rejected.shape
    ids = answer_text(lm, "I do not know") + [tok.eos_id]
    np.testing.assert_array_equal(pairs.rejected[1, : len(ids)], ids)
    assert pairs.rejected_mask[1].sum() == len(ids) and pairs.rejected_mask[1, 0]
    assert (pairs.rejected[1, len(ids) :] == tok.pad_id).all()
    np.testing.assert_array_equal(
        pairs.prompts[0][pairs.prompt_mask[0]], tok.encode(PAIRS[0]["prompt"])
    )


def test_identical_chosen_and_rejected_names_the_line(lm, tmp_path):
    path = write_jsonl(tmp_path / "pairs.jsonl", [PAIRS[0], "", {**PAIRS[1], "rejected": "7"}])
    with pytest.raises(ValueError, match=r"pairs.jsonl, line 3: 'chosen' and 'rejected' are"):
        pair_data.load_pairs(path, lm.tokenizer)


def numpy_dpo(chosen, rejected, ref_chosen, ref_rejected, beta, loss_type):
    h = (chosen - ref_chosen) - (rejected - ref_rejected)
    if loss_type == "sigmoid":
        return np.mean(np.log1p(np.exp(-beta * h)))
    return np.mean((h - 1 / (2 * beta)) ** 2)


LOGPS = (
    np.array([-3.0, -5.5, -1.25]),
    np.array([-4.0, -5.0, -2.5]),
    np.array([-3.5, -5.25, -2.0]),
    np.array([-3.75, -5.75, -2.0]),
)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_dpo_loss_matches_numpy_and_reports_margins(loss_type):
    loss, metrics = dpo.dpo_loss(*map(jnp.asarray, LOGPS), 0.5, loss_type)
    # float32 against float64 on losses of order 1: relative 1e-6
    np.testing.assert_allclose(loss, numpy_dpo(*LOGPS, 0.5, loss_type), rtol=1e-6)
    chosen = 0.5 * (LOGPS[0] - LOGPS[2])
    rejected = 0.5 * (LOGPS[1] - LOGPS[3])
    np.testing.assert_allclose(metrics["rewards/margins"], (chosen - rejected).mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["rewards/chosen"], chosen.mean(), rtol=1e-6)
    assert metrics["rewards/accuracies"] == pytest.approx(2 / 3)


def test_ipo_differs_and_vmap_over_beta_equals_separate_calls():
    arrays = tuple(map(jnp.asarray, LOGPS))
    sigmoid = dpo.dpo_loss(*arrays, 0.5)[0]
    assert abs(float(sigmoid - dpo.dpo_loss(*arrays, 0.5, "ipo")[0])) > 0.1
    betas = jnp.array([0.1, 0.5, 2.0])
    swept = jax.vmap(lambda b: dpo.dpo_loss(*arrays, b, "ipo"))(betas)
    for i, beta in enumerate([0.1, 0.5, 2.0]):
        alone = dpo.dpo_loss(*arrays, beta, "ipo")
        np.testing.assert_allclose(swept[0][i], alone[0], rtol=1e-6)
        np.testing.assert_allclose(
            swept[1]["rewards/margins"][i], alone[1]["rewards/margins"], rtol=1e-6
        )


def test_one_dpo_step_on_a_checkpoint_lowers_the_loss(lm, pairs):
    optimizer = optax.adam(1e-3)
    step = jax.jit(dpo.make_dpo_step(lm.policy_apply, optimizer))
    params, opt_state = lm.params, optimizer.init(lm.params)
    new_params, _, before = step(params, opt_state, pairs, lm.params, 0.5)
    # at the reference every implicit reward is 0: the loss is log 2
    np.testing.assert_allclose(before["loss"], np.log(2.0), rtol=1e-5)
    _, _, after = step(new_params, opt_state, pairs, lm.params, 0.5)
    assert after["loss"] < before["loss"] - 1e-3
    assert after["rewards/margins"] > 0.0


def test_dpo_step_vmaps_over_beta(lm, pairs):
    optimizer = optax.sgd(1e-2)
    step = dpo.make_dpo_step(lm.policy_apply, optimizer, loss_type="ipo")
    opt_state = optimizer.init(lm.params)
    betas = jnp.array([0.1, 1.0])
    swept = jax.jit(jax.vmap(lambda b: step(lm.params, opt_state, pairs, lm.params, b)))(betas)
    for i, beta in enumerate([0.1, 1.0]):
        params, _, metrics = jax.jit(step)(lm.params, opt_state, pairs, lm.params, beta)
        # the same float32 program under vmap and alone; the loss is of order 1 to 25
        np.testing.assert_allclose(swept[2]["loss"][i], metrics["loss"], rtol=1e-5)
        leaf = jax.tree.leaves(swept[0])[0][i]
        np.testing.assert_allclose(leaf, jax.tree.leaves(params)[0], rtol=1e-5, atol=1e-6)


def test_reward_model_steps_lower_the_loss_and_accuracy_reads_the_scores(lm, pairs):
    optimizer = optax.adam(3e-3)
    step = jax.jit(reward_model.make_reward_model_step(lm.critic_apply, optimizer))
    params = lm.init_value_head(lm.params)
    opt_state = optimizer.init(params)
    params, opt_state, first = step(params, opt_state, pairs)
    np.testing.assert_allclose(first["loss"], np.log(2.0), rtol=1e-6)  # the head starts at 0
    for _ in range(4):
        params, opt_state, metrics = step(params, opt_state, pairs)
    assert metrics["loss"] < first["loss"]
    chosen, rejected = reward_model.pair_scores(lm.critic_apply, params, pairs)
    accuracy = reward_model.pair_accuracy(lm.critic_apply, params, pairs)
    assert accuracy == np.mean(np.asarray(chosen) > np.asarray(rejected))


def test_draw_batch_takes_the_same_rows_of_every_pair_array(pairs):
    batch, rows = jax.jit(text_data.draw_batch, static_argnums=2)(pairs, jax.random.key(0), 2)
    for got, full in zip(batch, pairs, strict=True):
        np.testing.assert_array_equal(got, full[rows])


# SFT on prompt/completion pairs

COMPLETIONS = [
    {"prompt": "What is 12+7?", "completion": "19"},
    {"prompt": "What is 3+4?", "completion": "7"},
    {"prompt": "What is 20+22?", "completion": "42, since 20+22=42"},
]


def log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_sft_loss_is_on_completion_tokens_only(lm):
    data = sft.load_completions(COMPLETIONS, lm.tokenizer)
    prompt_len = data.prompts.shape[1]
    tokens = jnp.concatenate([data.prompts, data.targets], axis=1)
    mask = jnp.concatenate([data.prompt_mask, data.target_mask], axis=1)
    logp = log_softmax(np.asarray(lm.policy_apply(lm.params, tokens, mask), np.float64))
    picked = []
    for row in range(3):
        for t in np.flatnonzero(data.target_mask[row]):
            picked.append(logp[row, prompt_len - 1 + t, int(data.targets[row, t])])
    eos = lm.tokenizer.eos_id
    assert [int(data.targets[r][data.target_mask[r]][-1]) for r in range(3)] == [eos] * 3
    optimizer = optax.adam(3e-3)
    step = jax.jit(sft.make_sft_step(lm.policy_apply, optimizer))
    params, opt_state, first = step(lm.params, optimizer.init(lm.params), data)
    # float32 log-softmax over 288 logits against float64: the mean of ~5.7 nats within 1e-5
    np.testing.assert_allclose(first["loss"], -np.mean(picked), rtol=1e-5)
    for _ in range(3):
        params, opt_state, metrics = step(params, opt_state, data)
    assert metrics["loss"] < first["loss"] - 0.1


def test_example_length_limits_cut_drop_or_name_the_row(lm):
    long_answer = len(answer_text(lm, COMPLETIONS[2]["completion"])) + 1
    with pytest.warns(UserWarning, match="1 examples truncated and 0 dropped"):
        data = sft.load_completions(COMPLETIONS, lm.tokenizer, max_response_len=4)
    assert data.targets.shape[1] == 4 and long_answer > 4
    np.testing.assert_array_equal(
        data.targets[2], answer_text(lm, COMPLETIONS[2]["completion"])[:4]
    )
    with pytest.warns(UserWarning, match="0 examples truncated and 1 dropped"):
        data = sft.load_completions(COMPLETIONS, lm.tokenizer, max_response_len=4, overflow="drop")
    assert data.targets.shape == (2, 4)
    with pytest.raises(ValueError, match="row 3: .* over max_len=None / max_response_len=4"):
        sft.load_completions(COMPLETIONS, lm.tokenizer, max_response_len=4, overflow="error")


def test_a_row_without_a_column_names_the_line(lm, tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [ADDITION[0], {"question": "What is 1+1?"}])
    with pytest.raises(ValueError, match=r"p.jsonl, line 2: no field 'answer'"):
        text_data.load_prompts(path, lm.tokenizer, field="question")
