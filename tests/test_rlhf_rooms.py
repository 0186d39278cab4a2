"""ppojax.rlhf's agents live in rooms a newcomer can name: ``envs`` (the text env API, the
games, the one-turn env, Python and chat envs on the host), ``core`` (the one trainer over
turns and its machinery) and ``post`` (SFT on demonstrations beside SFT, reward models and
DPO). ``ppojax.rlhf.agents``, their old home, keeps every name it exported for a release, each
imported from its new home when asked for, with a DeprecationWarning naming it."""

import importlib

import pytest

import ppojax.rlhf.agents as agents

# What ppojax.rlhf.agents exported before the rooms: every name must still import.
OLD_NAMES = {
    "Calculator", "ChatEnv", "ChatFormat", "EnvOutputError", "EnvTraceError", "HostEnvError",
    "HostRollout", "PythonTextEnv", "ToolError", "call_tool", "check_env_faults",
    "consistent_guesser", "demo_loss", "env_script", "rollout_host_episodes", "EpisodeBatch",
    "EpisodeLayout", "EpisodeSettings", "EpisodeTrainer", "Episodes", "NumberGuessing",
    "OneTurnEnv", "TextEnv", "Tokens", "episode_stats", "make_episode_trainer", "make_trainer",
    "make_text_env", "model_context", "play_prompts", "play_demos", "register_text_env",
    "rollout_episodes", "success_rule", "text_env_ids", "tool_then_answer", "train_on_demos",
}  # fmt: skip


def test_every_old_name_of_the_agents_package_imports_from_its_new_home_with_a_warning():
    assert set(agents.__all__) == OLD_NAMES
    for name in sorted(OLD_NAMES):
        module = agents.MOVED[name]
        assert module.startswith(("ppojax.rlhf.envs.", "ppojax.rlhf.core.", "ppojax.rlhf.post."))
        with pytest.warns(DeprecationWarning, match=f"use {module}.{name}"):
            old = getattr(agents, name)
        assert old is getattr(importlib.import_module(module), name)
    with pytest.warns(DeprecationWarning, match="ppojax.rlhf.core.episode_trainer.make_trainer"):
        from ppojax.rlhf.agents import make_trainer
    from ppojax.rlhf import make_trainer as current

    assert make_trainer is current
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        agents.no_such_name  # noqa: B018  (its old submodules: tests/test_moved_names.py)


def test_the_text_envs_of_the_old_package_are_re_exported_by_their_room():
    import ppojax.rlhf.envs as envs

    in_envs = {name for name in OLD_NAMES if agents.MOVED[name].startswith("ppojax.rlhf.envs.")}
    assert in_envs <= set(envs.__all__)
    for name in envs.__all__:
        assert hasattr(envs, name)
