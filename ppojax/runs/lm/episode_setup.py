"""A run of the episode form from its settings (config.json's): the text env, checked
(``episode_checks``), the model (the built-in transformer from random weights, or the
``--model`` folder's weights in its dtype), the trainer and its state at step 0. Anything that
does not fit is a ``ValueError`` before training starts."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import jax

from ppojax.checks import ConfigError
from ppojax.rlhf.core.episode_trainer import EpisodeTrainer, make_episode_trainer
from ppojax.rlhf.core.trainer import RLHFState
from ppojax.rlhf.core.turns import EpisodeLayout, EpisodeSettings, model_context
from ppojax.rlhf.envs.chat import ChatFormat
from ppojax.rlhf.envs.env import success_rule
from ppojax.rlhf.models.transformer import transformer, zero_value_head
from ppojax.runs.lm import episode_checks as checks
from ppojax.runs.lm.settings import rlhf_config


def load_model(settings: dict[str, Any]) -> Any:
    """The run's ``--model`` (``from_pretrained``) in its dtype; a ``ValueError`` naming
    config.json's ``model.folder`` when the folder is gone (a ``--resume``)."""
    from ppojax.rlhf.models.pretrained import from_pretrained

    path = Path(settings["model"]["folder"])
    if not path.is_dir():
        raise ValueError(
            f"the run's --model folder {path} (config.json's model.folder) is gone: put the "
            "model back there to go on"
        )
    return from_pretrained(path, dtype=settings["model"]["dtype"])


class Prepared(NamedTuple):
    """A run's env, model (the built-in ``LanguageModel`` or a ``PretrainedLM``), trainer and
    state at step 0."""

    env: Any
    lm: Any
    trainer: EpisodeTrainer
    state: RLHFState


def prepare(settings: dict[str, Any]) -> Prepared:
    """The env (checked: ``episode_checks``), the model (from random weights, or the
    ``--model`` folder's), the trainer and its state at step 0 of a run's settings; a
    ``ValueError`` for anything that does not fit."""
    env_id, episodes, run = settings["env"]["id"], settings["episodes"], settings["run"]
    pretrained = "folder" in settings["model"]
    config = rlhf_config(settings["rlhf"])
    if pretrained:
        lm = load_model(settings)
        chat = ChatFormat(lm.tokenizer)
        env = checks.build_env(env_id, settings["env"]["args"], episodes["turns"], chat=chat)
        vocab = checks.chat_vocabulary(chat, lm.config.vocab_size)
    else:
        env = checks.build_env(env_id, settings["env"]["args"], episodes["turns"])
        vocab = checks.vocabulary(env_id, env)
    if config.missing_eos_penalty:
        raise ConfigError(
            "missing_eos_penalty",
            "--missing-eos-penalty: episodes do not read it (a turn without EOS goes to the "
            "env as it is); leave it 0",
        )
    turn = EpisodeSettings(episodes["turns"], config.response_len, config.temperature,
                           config.pad_id, config.eos_id, episodes["token_budget"])  # fmt: skip
    if not pretrained:
        layout = EpisodeLayout(env.prompt_len, config.response_len, env.reply_len, turn.max_turns)
        lm = transformer(vocab.vocab_size, layout.length, **settings["model"])
    checks.check_env(env_id, env, lm.kv_cache, turn, vocab)
    success_rule(env)  # a success_return that is not a number fails here
    critic = lm.critic_apply if config.needs_critic else None
    trainer = make_episode_trainer(
        config, lm.policy_apply, env, run["batch_size"] * config.group_size, turn.max_turns,
        turn.token_budget, kv_cache=lm.kv_cache, critic_apply=critic,
        context_len=model_context(lm),
    )  # fmt: skip
    init_key = jax.random.fold_in(jax.random.key(run["seed"]), 1)
    if pretrained:
        params = lm.params
        critic_params = lm.init_value_head(params) if config.needs_critic else None
    else:
        params = lm.init(init_key)
        critic_params = zero_value_head(params) if config.needs_critic else None
    return Prepared(env, lm, trainer, trainer.init(params, init_key, critic_params))
