"""A checkpoint's tokenizer and chat template, on ``tokenizers`` and ``jinja2`` (no torch).

``encode`` gives transformers' ``tokenizer.encode(text)``: tokenizer.json's post-processor adds
the special tokens, and tokenizer_config.json's ``add_bos_token`` / ``add_eos_token`` add them
where the post-processor does not. The chat template (tokenizer_config.json's
``chat_template`` or chat_template.jinja) renders in a sandboxed jinja2 environment set up as
transformers sets it up: trim_blocks, lstrip_blocks, loop controls, ``raise_exception``, a
``tojson`` that keeps unicode, and the special tokens as variables.
"""

from __future__ import annotations

import functools
import json
import shutil
import warnings
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as RustTokenizer

FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)
SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token")


def raise_exception(message: str) -> None:
    """What a template calls to reject a conversation."""
    raise jinja2.exceptions.TemplateError(message)


def tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, **kwargs: Any) -> str:
    """JSON without HTML escaping, unicode kept (transformers' filter)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, **kwargs)


def token_text(value: Any) -> str | None:
    """A special token's text from tokenizer_config.json (a string or an AddedToken dict)."""
    if isinstance(value, dict):
        return value.get("content")
    return value


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The chat template in transformers' sandboxed environment (compiled once a source: an
    agent's env renders the conversation again after every turn)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(source)


class Tokenizer:
    """``encode``, ``decode``, ``apply_chat_template``, ``eos_id`` and ``pad_id`` of a folder."""

    def __init__(self, folder: str | Path, eos_ids: tuple[int, ...] = ()) -> None:
        self.folder = Path(folder)
        path = self.folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} does not exist: ppojax reads a fast tokenizer's tokenizer.json "
                "(transformers' tokenizer.save_pretrained writes it)."
            )
        self.rust = RustTokenizer.from_file(str(path))
        config_path = self.folder / "tokenizer_config.json"
        self.settings = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.special = {name: token_text(self.settings.get(name)) for name in SPECIAL}
        self.template_source = self.read_template()
        self.eos_id = self.special_id("eos_token", eos_ids[0] if eos_ids else None)
        self.pad_id = self.special_id("pad_token", None)
        if self.pad_id is None:
            warnings.warn(
                f"{config_path} names no pad_token; padding with the eos token "
                f"({self.special['eos_token']!r}, id {self.eos_id}).",
                stacklevel=2,
            )
            self.pad_id = self.eos_id

    def special_id(self, name: str, fallback: int | None) -> int | None:
        """The id of tokenizer_config.json's special token ``name``, else ``fallback``."""
        text = self.special[name]
        found = self.rust.token_to_id(text) if text is not None else None
        return fallback if found is None else found

    def read_template(self) -> str | None:
        """chat_template.jinja's text, else tokenizer_config.json's ``chat_template``."""
        path = self.folder / "chat_template.jinja"
        self.template_file = path if path.is_file() else self.folder / "tokenizer_config.json"
        if path.is_file():
            return path.read_text()
        template = self.settings.get("chat_template")
        if isinstance(template, list):
            named = {entry["name"]: entry["template"] for entry in template}
            template = named.get("default")
        return template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` with the checkpoint's special tokens, as transformers'
        ``tokenizer.encode(text)``; without them (a rendered chat, a completion) when
        ``add_special_tokens`` is False."""
        ids = self.rust.encode(text, add_special_tokens=add_special_tokens).ids
        if not add_special_tokens:
            return list(ids)
        bos = self.special_id("bos_token", None)
        if self.settings.get("add_bos_token") and bos is not None and ids[:1] != [bos]:
            ids = [bos, *ids]
        if self.settings.get("add_eos_token") and self.eos_id is not None:
            if ids[-1:] != [self.eos_id]:
                ids = [*ids, self.eos_id]
        return ids

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """The text of token ids (a list or a 1-D array)."""
        return self.rust.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = False, **kwargs: Any
    ) -> str:
        """The conversation rendered by the checkpoint's own chat template, as transformers'
        ``apply_chat_template(messages, tokenize=False)`` (its default too: no generation
        prompt; pass ``add_generation_prompt=True`` to prompt the model's turn); extra keyword
        arguments reach the template as variables."""
        if self.template_source is None:
            raise ValueError(
                f"{self.folder} has no chat template: neither chat_template.jinja nor a "
                "'chat_template' in tokenizer_config.json; write the prompt's text yourself."
            )
        special = {name: text for name, text in self.special.items() if text is not None}
        try:
            template = compile_template(self.template_source)
        except jinja2.TemplateSyntaxError as error:
            raise ValueError(
                f"{self.template_file}: the chat template does not parse (its line "
                f"{error.lineno}: {error.message}); fix the template."
            ) from None
        try:
            return template.render(
                messages=messages, add_generation_prompt=add_generation_prompt, **special, **kwargs
            )
        except Exception as error:  # raise_exception, a division by zero, an unknown name...
            raise ValueError(
                f"{self.template_file}: the chat template failed on a conversation of "
                f"{len(messages)} messages ({type(error).__name__}: {error}); fix the template."
            ) from None

    def save(self, folder: str | Path) -> None:
        """Copy the tokenizer's files into ``folder``."""
        for name in FILES:
            source = self.folder / name
            if source.is_file() and source.resolve() != (Path(folder) / name).resolve():
                shutil.copyfile(source, Path(folder) / name)
