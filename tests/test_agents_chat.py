"""An episode's turns through a model's chat template (tests/fixtures/chat/: a Qwen2.5-style
ChatML template with a tool role, a Llama-3-style one without): the incremental pieces join to
the tokens of the whole conversation rendered at once, the reply role and its fallback, and
the calculator over a real tokenizer's text, by hand and through the host rollout."""

import re
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ppojax.rlhf.core.episodes import EpisodeSettings
from ppojax.rlhf.core.host_rollout import HostRollout
from ppojax.rlhf.envs import calculator as c
from ppojax.rlhf.envs.chat import ChatFormat
from ppojax.rlhf.envs.env import make_text_env, success_rule
from ppojax.rlhf.envs.host import ToolError
from ppojax.rlhf.models.tokenizer import Tokenizer

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "chat"
QWEN_REPLY = (
    "\n<|im_start|>user\n<tool_response>\n{}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
)
LLAMA_REPLY = (
    "<|start_header_id|>user<|end_header_id|>\n\n{}<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
# name: (the end-of-turn token, the reply role picked, a reply's text, the text the template
# writes after the last assistant turn of a conversation)
TEMPLATES = {
    "qwen25": ("<|im_end|>", "tool", QWEN_REPLY, "\n"),
    "llama3": ("<|eot_id|>", "user", LLAMA_REPLY, ""),
}


def chat_of(name, **kwargs):
    tokenizer = Tokenizer(FIXTURES / name)
    return tokenizer, ChatFormat(tokenizer, **kwargs)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_the_pieces_join_to_the_whole_conversation_rendered_at_once(name):
    eot, role, reply_text, closing = TEMPLATES[name]
    tokenizer, chat = chat_of(name)
    assert (chat.eot_text, chat.eot_id, chat.reply_role) == (
        eot,
        tokenizer.rust.token_to_id(eot),
        role,
    )
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "865+330, héllo 你好?"},
    ]
    turns = ["865+330=", "let me see\n\n1+1=", "1195"]
    replies = ["1195", "2 🙂\n\nok"]
    ids = chat.prompt_ids(messages)
    for turn, reply in zip(turns, [*replies, None], strict=True):
        # the model's tokens: its text and the end-of-turn it stops at
        ids = ids + chat.encode(turn) + [chat.eot_id]
        messages.append({"role": "assistant", "content": turn})
        if reply is None:
            break
        piece = chat.reply_ids(messages, reply)
        assert tokenizer.decode(piece) == reply_text.format(reply)
        ids = ids + piece
        messages.append({"role": role, "content": reply})
        whole = tokenizer.encode(tokenizer.apply_chat_template(messages, True), False)
        assert ids == whole, len(messages)
    whole = tokenizer.encode(tokenizer.apply_chat_template(messages), False)
    assert whole[: len(ids)] == ids and tokenizer.decode(whole[len(ids) :]) == closing
    text, ended = chat.turn_text(chat.encode(turns[1]) + [chat.eot_id, 7])
    assert (text, ended) == (turns[1], True)


def test_the_reply_role_option_and_a_cut_turn():
    tokenizer, chat = chat_of("qwen25")
    assert chat.role_reason == "the chat template has a 'tool' role"
    _, user = chat_of("qwen25", reply_role="user")
    history = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "1+1="}]
    assert (
        user.reply_text(history, "2") == "\n<|im_start|>user\n2<|im_end|>\n<|im_start|>assistant\n"
    )
    assert chat.reply_text(history, "2") == QWEN_REPLY.format(2)
    # a turn cut before its end-of-turn: the reply writes that token first
    assert chat.reply_ids(history, "2", ended=False) == [chat.eot_id, *chat.reply_ids(history, "2")]
    assert chat.turn_text(chat.encode("1+1")) == ("1+1", False)
    assert chat_of("llama3")[1].role_reason == "the chat template names no 'tool' role"
    with pytest.raises(ValueError, match="reply_role must be one of"):
        ChatFormat(tokenizer, reply_role="ipython")


def test_a_template_without_an_end_of_turn_token_or_refusing_tools(tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(FIXTURES / "qwen25" / name, tmp_path / name)
    template = tmp_path / "chat_template.jinja"
    template.write_text(
        "{% for m in messages %}{{ m.role + ': ' + m.content + '\\n\\n' }}{% endfor %}"
    )
    with pytest.raises(ValueError, match="no token to end the model's turn at"):
        ChatFormat(Tokenizer(tmp_path))
    template.write_text(
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools') }}"
        "{% endif %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
    )
    chat = ChatFormat(Tokenizer(tmp_path))
    assert chat.reply_role == "user" and "refuses a 'tool' message" in chat.role_reason
    assert chat.eot_text == "<|im_end|>"


def boom(expression):
    raise ZeroDivisionError("the tool broke")


def test_the_calculator_over_a_chat_template_by_hand():
    tokenizer, chat = chat_of("qwen25")
    env = make_text_env("calculator", num_digits=3, chat=chat)
    state, prompt = env.reset(jax.random.key(3))
    a, b = state.inner
    assert tokenizer.decode(prompt) == (
        "<|im_start|>system\nYou are a helpful assistant with a calculator.<|im_end|>\n"
        f"<|im_start|>user\n{a}+{b}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert len(prompt) == env.prompt_len and env.eos_id == chat.eot_id == tokenizer.eos_id
    assert success_rule(env).says == "return >= 1"  # the calculator's, through the template
    turn = chat.encode(f"{a}+{b}=") + [chat.eot_id]
    called, reply, reward, done = env.step(state, turn)
    assert tokenizer.decode(reply) == QWEN_REPLY.format(a + b) and (reward, done) == (0.0, False)
    assert called.messages[-1] == {"role": "tool", "content": str(a + b)}
    assert env.step(called, chat.encode(f"{a + b}\n") + [chat.eot_id])[1:] == ([], 1.0, True)
    assert env.step(called, chat.encode(f"{a + b + 1}") + [chat.eot_id])[1:] == ([], 0.0, True)
    question = env.step(state, chat.encode("what?") + [chat.eot_id])[1]
    assert tokenizer.decode(question) == QWEN_REPLY.format("?")
    cut = env.step(state, chat.encode("what?"))[1]  # no end-of-turn: the reply writes it
    assert cut == [chat.eot_id, *question] and len(cut) <= env.reply_len
    broken = c.Calculator(num_digits=3, tool=boom).through_chat(chat)
    line = boom.__code__.co_firstlineno
    where = re.escape(__file__)
    with pytest.raises(ToolError, match=f"tool 'add' \\(defined at {where}:{line}\\) raised "
                       f"ZeroDivisionError at {where}:{line + 1}: the tool broke "
                       f"\\(input '{a}\\+{b}'\\)"):  # fmt: skip
        broken.step(state, turn)


def scripted_apply(table, vocab):
    """A policy sure of ``table[c + 1]`` at every column c."""

    def apply(params, tokens, mask):
        del params, mask
        following = jnp.asarray(table[1 : tokens.shape[1] + 1])
        return 40.0 * jax.nn.one_hot(jnp.broadcast_to(following, tokens.shape), vocab)

    return apply


def test_the_host_rollout_plays_the_calculator_through_the_chat_template():
    """Each episode's real tokens are the whole conversation's, rendered and encoded at once;
    a mismatched end-of-turn id is refused."""
    tokenizer, chat = chat_of("qwen25")
    env = make_text_env("calculator", num_digits=1, chat=chat)
    call, answer = chat.encode("1+1=") + [chat.eot_id], chat.encode("2") + [chat.eot_id]
    history = [{"role": "user", "content": "1+1"}, {"role": "assistant", "content": "1+1="}]
    reply_width = len(chat.reply_ids(history, "2"))
    settings = EpisodeSettings(2, len(call), 1.0, tokenizer.pad_id, chat.eot_id)
    # the call fills turn 0; turn 1's first token follows the reply's last real token
    start, table = env.prompt_len, np.full(512, chat.eot_id)
    table[start : start + len(call)] = call
    second = start + len(call) + reply_width
    table[second : second + len(answer)] = answer
    apply = scripted_apply(table, tokenizer.rust.get_vocab_size())
    episodes = HostRollout(apply, env, 4, settings)(None, jax.random.key(0))
    assert np.asarray(episodes.num_turns).tolist() == [2] * 4
    for row in range(4):
        real = np.asarray(episodes.tokens[row])[np.asarray(episodes.mask[row])].tolist()
        a, b = map(int, re.search(r"user\n(\d)\+(\d)<", tokenizer.decode(real)).groups())
        conversation = [
            {"role": "user", "content": f"{a}+{b}"},
            {"role": "assistant", "content": "1+1="},
            {"role": "tool", "content": "2"},
            {"role": "assistant", "content": "2"},
        ]
        whole = tokenizer.encode(tokenizer.apply_chat_template(conversation), False)
        assert real == whole[:-1] and tokenizer.decode(whole[-1:]) == "\n", row
        assert np.asarray(episodes.rewards[row]).tolist() == [0.0, float(a + b == 2)]
    wrong = EpisodeSettings(2, len(call), 1.0, tokenizer.pad_id, chat.eot_id + 1)
    with pytest.raises(
        ValueError, match=f"ends the model's turns at token {chat.eot_id}, its chat"
    ):
        HostRollout(apply, env, 4, wrong)
