"""An episode's turns through a model's own chat template: the prompt, the model's turns and
the env's (or a tool's) replies, as the template renders the whole conversation, cut into the
token ids each side appends.

``ChatFormat(tokenizer)`` reads a checkpoint's tokenizer (ppojax's ``Tokenizer``, e.g.
``from_pretrained(...).tokenizer``: ``apply_chat_template(messages, add_generation_prompt)``
returning text, ``encode(text, add_special_tokens)``, ``decode(ids)``):

    chat.prompt_ids(messages)   # the conversation's start, up to the first assistant header
    chat.eot_id                 # the token the model's turn stops at (EpisodeSettings.eos_id)
    chat.turn_text(response)    # the turn's text before its end-of-turn, and whether it has one
    chat.reply_ids(history, reply)  # after the model's end-of-turn: the template's text up to
                                    # the next assistant header, the reply inside it

The end of a turn is the first token the template writes after an assistant message's content
(``<|im_end|>`` in ChatML, ``<|eot_id|>`` in Llama 3, ``<end_of_turn>`` in Gemma); a template
that writes nothing there, or no single token, is a ``ValueError``.

The reply goes in the role ``reply_role``: ``"tool"`` when the template's source names that
role (a quoted ``'tool'``) and renders a message in it; otherwise ``"user"``, the role every
chat template has (``role_reason`` says which and why). Pass ``reply_role`` to choose. A
template places a ``tool`` message as its model was trained to read tool results (Qwen2.5: a
``user`` turn with ``<tool_response>`` tags; Llama 3.1: an ``ipython`` header).

``reply_ids`` renders the conversation so far with the model's last turn replaced by a marker
and keeps the text after the marker's end-of-turn, so the template's context rules (a first
message, consecutive tool messages, a default system prompt) apply as in the whole
conversation. The pieces, joined with the model's tokens, are the tokens of the whole
conversation rendered and encoded at once wherever the tokenizer splits its pre-tokens at the
template's seams (after a special token; at the assistant header's newlines, which Qwen2's and
Llama 3's split patterns keep together). A template that rewrites earlier turns (Llama 3
trims their whitespace, Qwen3 drops their reasoning) renders the whole conversation otherwise
than the model saw it; the pieces keep what the model wrote. Each call renders the whole
conversation so far: one template render per episode and turn, on the host.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

Message = Mapping[str, Any]

# An assistant's content no template rewrites and no conversation holds: Unicode
# private-use characters around a name.
MARK = "\ue000ppojax-turn\ue000"
TOOL_ROLE = re.compile(r"""(['"])tool\1""")
ROLES = ("tool", "user")


class ChatFormat:
    """The token ids of an episode's turns through ``tokenizer``'s chat template (see the
    module); the reply in ``reply_role`` ("tool" or "user"; None: "tool" where the template
    has that role, else "user")."""

    def __init__(self, tokenizer: Any, reply_role: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.eot_text, self.eot_id = self.end_of_turn()
        if reply_role is None:
            self.reply_role, self.role_reason = self.pick_role()
        elif reply_role in ROLES:
            self.reply_role, self.role_reason = reply_role, "asked for"
        else:
            raise ValueError(
                f"ChatFormat.reply_role must be one of {ROLES} or None, got {reply_role!r}"
            )

    def render(self, messages: Sequence[Message], add_generation_prompt: bool) -> str:
        """The template's text of ``messages``."""
        return self.tokenizer.apply_chat_template(
            [dict(message) for message in messages], add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of rendered text (the template writes the special tokens)."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def end_of_turn(self) -> tuple[str, int]:
        """The text and id of the first token the template writes after an assistant turn."""
        text = self.render([{"role": "user", "content": "1+1"}, assistant(MARK)], False)
        after = text[text.index(MARK) + len(MARK) :] if MARK in text else ""
        ids = self.encode(after)
        eot_text = self.tokenizer.decode(ids[:1])
        if not ids or not eot_text.strip() or not after.startswith(eot_text):
            raise ValueError(
                f"the chat template writes {after!r:.60} after an assistant's turn: no token "
                "to end the model's turn at (a template that ends each turn with a special "
                "token, as <|im_end|> or <|eot_id|>, is needed)"
            )
        if self.encode(eot_text) != ids[:1]:
            raise ValueError(
                f"the chat template ends an assistant's turn with {eot_text!r}, which is no "
                f"single token by itself ({self.encode(eot_text)}): the model cannot stop at it"
            )
        return eot_text, ids[0]

    def pick_role(self) -> tuple[str, str]:
        """The role "tool" and why, where the template has that role; else "user" and why not."""
        source = getattr(self.tokenizer, "template_source", None) or ""
        if not TOOL_ROLE.search(source):
            return "user", "the chat template names no 'tool' role"
        try:
            self.reply_text([{"role": "user", "content": "1+1"}, assistant("1+1=")], "2", "tool")
        except ValueError as error:
            return "user", f"the chat template refuses a 'tool' message ({error})"
        return "tool", "the chat template has a 'tool' role"

    def prompt_ids(self, messages: str | Sequence[Message]) -> list[int]:
        """The conversation's start (a str: one user message) up to and with the header of
        the model's first turn."""
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        return self.encode(self.render(messages, True))

    def turn_text(self, response: Sequence[int]) -> tuple[str, bool]:
        """The text of a model's turn (its token ids) before its first end-of-turn token, and
        whether it has one."""
        ids = [int(i) for i in response]
        ended = self.eot_id in ids
        if ended:
            ids = ids[: ids.index(self.eot_id)]
        return self.tokenizer.decode(ids), ended

    def reply_text(
        self, history: Sequence[Message], reply: str, reply_role: str | None = None
    ) -> str:
        """The template's text after the model's end-of-turn up to and with the next
        assistant header, ``reply`` inside it; ``history`` is the conversation so far, its last
        message the model's turn."""
        if not history or history[-1].get("role") != "assistant":
            raise ValueError(
                "reply_text: the history must end with the model's turn (role 'assistant')"
            )
        role = reply_role or self.reply_role
        marked = [*history[:-1], assistant(MARK), {"role": role, "content": reply}]
        text = self.render(marked, True)
        if text.count(MARK) != 1:
            raise ValueError(
                f"the chat template does not write the model's turn once as given (with "
                f"{len(history)} messages and a reply in role {role!r})"
            )
        after = text[text.index(MARK) + len(MARK) :]
        if not after.startswith(self.eot_text):
            raise ValueError(
                f"the chat template ends the model's turn here with {after!r:.60}, not with "
                f"its end-of-turn {self.eot_text!r}"
            )
        return after[len(self.eot_text) :]

    def reply_ids(self, history: Sequence[Message], reply: str, ended: bool = True) -> list[int]:
        """The ids to append after the model's turn (``reply_text``'s); a turn cut before its
        end-of-turn (``ended`` False) gets that token first, as the template writes it."""
        ids = self.encode(self.reply_text(history, reply))
        return ids if ended else [self.eot_id, *ids]

    def widths(self, prompt_bytes: int, reply_bytes: int) -> tuple[int, int]:
        """(prompt_len, reply_len) that hold a one-user-message prompt of at most
        ``prompt_bytes`` UTF-8 bytes and a reply of at most ``reply_bytes``, for a byte-level
        tokenizer (at most one token per byte), a cut turn's end-of-turn included."""
        prompt = len(self.prompt_ids("")) + prompt_bytes
        history = [{"role": "user", "content": ""}, assistant("")]
        return prompt, len(self.reply_ids(history, "", ended=False)) + reply_bytes


def assistant(content: str) -> dict[str, str]:
    """The model's turn as a message."""
    return {"role": "assistant", "content": content}
