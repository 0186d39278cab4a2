"""Language-model agents: text environments (``TextEnv``, ``register_text_env``,
``make_text_env``), the number-guessing game, multi-turn episodes rolled out in one compiled
program (``rollout_episodes``), Python envs and tools stepped on the host between compiled
turns (``PythonTextEnv``, ``HostRollout``, the ``Calculator``), Python envs over text through a
model's chat template (``ChatFormat``, ``ChatEnv``), SFT on scripted demonstrations
(``play_demos``, ``train_on_demos``), and GRPO / RLOO / PPO on them with episode- or
turn-level credit (``make_episode_trainer``), and on one-turn episodes of given prompts
(``make_trainer``, ``OneTurnEnv``): the one LM trainer."""

from ppojax.rlhf.agents.calculator import Calculator
from ppojax.rlhf.agents.chat import ChatFormat
from ppojax.rlhf.agents.demos import (
    consistent_guesser,
    demo_loss,
    env_script,
    play_demos,
    tool_then_answer,
    train_on_demos,
)
from ppojax.rlhf.agents.env import (
    TextEnv,
    Tokens,
    make_text_env,
    register_text_env,
    success_rule,
    text_env_ids,
)
from ppojax.rlhf.agents.episodes import (
    EnvOutputError,
    EnvTraceError,
    EpisodeLayout,
    Episodes,
    EpisodeSettings,
    check_env_faults,
    episode_stats,
    rollout_episodes,
)
from ppojax.rlhf.agents.guessing import NumberGuessing
from ppojax.rlhf.agents.host import (
    ChatEnv,
    HostEnvError,
    HostRollout,
    PythonTextEnv,
    ToolError,
    call_tool,
    rollout_host_episodes,
)
from ppojax.rlhf.agents.one_turn import OneTurnEnv, play_prompts
from ppojax.rlhf.agents.trainer import EpisodeTrainer, make_episode_trainer, make_trainer
from ppojax.rlhf.agents.turns import model_context
from ppojax.rlhf.agents.update import EpisodeBatch

__all__ = [
    "Calculator",
    "ChatEnv",
    "ChatFormat",
    "EnvOutputError",
    "EnvTraceError",
    "HostEnvError",
    "HostRollout",
    "PythonTextEnv",
    "ToolError",
    "call_tool",
    "check_env_faults",
    "consistent_guesser",
    "demo_loss",
    "env_script",
    "rollout_host_episodes",
    "EpisodeBatch",
    "EpisodeLayout",
    "EpisodeSettings",
    "EpisodeTrainer",
    "Episodes",
    "NumberGuessing",
    "OneTurnEnv",
    "TextEnv",
    "Tokens",
    "episode_stats",
    "make_episode_trainer",
    "make_trainer",
    "make_text_env",
    "model_context",
    "play_prompts",
    "play_demos",
    "register_text_env",
    "rollout_episodes",
    "success_rule",
    "text_env_ids",
    "tool_then_answer",
    "train_on_demos",
]
