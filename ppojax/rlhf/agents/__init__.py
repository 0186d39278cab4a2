"""Deprecated: language-model agents now live in three rooms of ``ppojax.rlhf``, and this
package keeps its names for one release, each imported from its new home when asked for,
with a ``DeprecationWarning``:

- ``ppojax.rlhf.envs``: the text env API, the games, the one-turn env, Python envs and tools
  on the host, envs through a chat template;
- ``ppojax.rlhf.core``: the one LM trainer (``core.episode_trainer``: ``make_trainer``,
  ``make_episode_trainer``), its turns, rollouts (``core.episodes``, ``core.host_rollout``),
  credit and update;
- ``ppojax.rlhf.post.demos``: SFT on scripted demonstrations before RL.

The old submodules (``ppojax.rlhf.agents.env`` and the rest) import as aliases of their new
modules until the same release, with a warning naming them (``ppojax.deprecation``)."""

from ppojax.moved import MOVED_NAMES

# Each name this package exported, with the module that holds it now (from ppojax.moved).
MOVED = {name: where.rpartition(".")[0] for name, where in MOVED_NAMES[__name__].items()}

__all__ = sorted(MOVED)


def __getattr__(name: str):
    from ppojax.deprecation import moved_attribute

    return moved_attribute(__name__, name)
