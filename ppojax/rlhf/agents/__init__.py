"""Language-model agents: text environments (``TextEnv``, ``register_text_env``,
``make_text_env``), the number-guessing game, and multi-turn episodes rolled out in one
compiled program (``rollout_episodes``)."""
