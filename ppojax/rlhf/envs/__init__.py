"""Text environments for language-model agents, re-exported: the text env API (``TextEnv``,
``Tokens``, ``register_text_env``, ``make_text_env``), the games (``NumberGuessing``, the
``Calculator``), the one-turn env of given prompts (``OneTurnEnv``), Python envs and tools
stepped on the host (``PythonTextEnv``, ``call_tool``) and envs over text through a model's
chat template (``ChatFormat``, ``ChatEnv``). The trainer that plays them is in
``ppojax.rlhf.core``, which imports this room; nothing here imports the trainer."""

from ppojax.rlhf.envs.calculator import Calculator
from ppojax.rlhf.envs.chat import ChatFormat
from ppojax.rlhf.envs.env import (
    TextEnv,
    Tokens,
    make_text_env,
    register_text_env,
    success_rule,
    text_env_ids,
)
from ppojax.rlhf.envs.guessing import NumberGuessing
from ppojax.rlhf.envs.host import (
    ChatEnv,
    HostEnvError,
    PythonTextEnv,
    ToolError,
    call_tool,
    runs_on_host,
)
from ppojax.rlhf.envs.one_turn import OneTurnEnv, RewardFn

__all__ = [
    "Calculator",
    "ChatEnv",
    "ChatFormat",
    "HostEnvError",
    "NumberGuessing",
    "OneTurnEnv",
    "PythonTextEnv",
    "RewardFn",
    "TextEnv",
    "ToolError",
    "Tokens",
    "call_tool",
    "make_text_env",
    "register_text_env",
    "runs_on_host",
    "success_rule",
    "text_env_ids",
]
