"""Deprecated: language-model agents now live in three rooms of ``ppojax.rlhf``, and this
package keeps its names for one release, each imported from its new home when asked for,
with a ``DeprecationWarning``:

- ``ppojax.rlhf.envs``: the text env API, the games, the one-turn env, Python envs and tools
  on the host, envs through a chat template;
- ``ppojax.rlhf.core``: the one LM trainer (``core.episode_trainer``: ``make_trainer``,
  ``make_episode_trainer``), its turns, rollouts (``core.episodes``, ``core.host_rollout``),
  credit and update;
- ``ppojax.rlhf.post.demos``: SFT on scripted demonstrations before RL.

The old submodules (``ppojax.rlhf.agents.env`` and the rest) are gone: import from the new
modules."""

# Each name this package exported, with the module that holds it now.
MOVED = {
    "Calculator": "ppojax.rlhf.envs.calculator",
    "ChatEnv": "ppojax.rlhf.envs.host",
    "ChatFormat": "ppojax.rlhf.envs.chat",
    "EnvOutputError": "ppojax.rlhf.core.episodes",
    "EnvTraceError": "ppojax.rlhf.core.episodes",
    "EpisodeBatch": "ppojax.rlhf.core.update",
    "EpisodeLayout": "ppojax.rlhf.core.turns",
    "EpisodeSettings": "ppojax.rlhf.core.turns",
    "EpisodeTrainer": "ppojax.rlhf.core.episode_trainer",
    "Episodes": "ppojax.rlhf.core.turns",
    "HostEnvError": "ppojax.rlhf.envs.host",
    "HostRollout": "ppojax.rlhf.core.host_rollout",
    "NumberGuessing": "ppojax.rlhf.envs.guessing",
    "OneTurnEnv": "ppojax.rlhf.envs.one_turn",
    "PythonTextEnv": "ppojax.rlhf.envs.host",
    "TextEnv": "ppojax.rlhf.envs.env",
    "ToolError": "ppojax.rlhf.envs.host",
    "Tokens": "ppojax.rlhf.envs.env",
    "call_tool": "ppojax.rlhf.envs.host",
    "check_env_faults": "ppojax.rlhf.core.episodes",
    "consistent_guesser": "ppojax.rlhf.post.demos",
    "demo_loss": "ppojax.rlhf.post.demos",
    "env_script": "ppojax.rlhf.post.demos",
    "episode_stats": "ppojax.rlhf.core.episodes",
    "make_episode_trainer": "ppojax.rlhf.core.episode_trainer",
    "make_text_env": "ppojax.rlhf.envs.env",
    "make_trainer": "ppojax.rlhf.core.episode_trainer",
    "model_context": "ppojax.rlhf.core.turns",
    "play_demos": "ppojax.rlhf.post.demos",
    "play_prompts": "ppojax.rlhf.core.prompts",
    "register_text_env": "ppojax.rlhf.envs.env",
    "rollout_episodes": "ppojax.rlhf.core.episodes",
    "rollout_host_episodes": "ppojax.rlhf.core.host_rollout",
    "success_rule": "ppojax.rlhf.envs.env",
    "text_env_ids": "ppojax.rlhf.envs.env",
    "tool_then_answer": "ppojax.rlhf.post.demos",
    "train_on_demos": "ppojax.rlhf.post.demos",
}

__all__ = sorted(MOVED)


def __getattr__(name: str):
    from ppojax.rlhf import moved_alias

    return moved_alias(__name__, name, f"{MOVED[name]}.{name}" if name in MOVED else None)
