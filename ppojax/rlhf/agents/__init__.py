"""Language-model agents: text environments (``TextEnv``, ``register_text_env``,
``make_text_env``), the number-guessing game, multi-turn episodes rolled out in one compiled
program (``rollout_episodes``), and GRPO / RLOO on them (``make_episode_trainer``)."""

from ppojax.rlhf.agents.env import (
    TextEnv,
    Tokens,
    make_text_env,
    register_text_env,
    text_env_ids,
)
from ppojax.rlhf.agents.episodes import (
    EpisodeLayout,
    Episodes,
    EpisodeSettings,
    episode_stats,
    rollout_episodes,
)
from ppojax.rlhf.agents.guessing import NumberGuessing
from ppojax.rlhf.agents.trainer import EpisodeTrainer, make_episode_trainer

__all__ = [
    "EpisodeLayout",
    "EpisodeSettings",
    "EpisodeTrainer",
    "Episodes",
    "NumberGuessing",
    "TextEnv",
    "Tokens",
    "episode_stats",
    "make_episode_trainer",
    "make_text_env",
    "register_text_env",
    "rollout_episodes",
    "text_env_ids",
]
