"""The RLHF algorithm on token arrays: ``RLHFConfig``, sampling, LoRA, KL and advantages, the
loss, the trainer's state and update, and the state sharded over devices; and the one LM
trainer over turns (``episode_trainer``: ``make_trainer``, ``make_episode_trainer``) with
what it plays and learns from: the turns and their layout, the rollouts of a JAX env in one
program (``episodes``) and of a Python env on the host (``host_rollout``), given prompts as
one-turn episodes (``prompts``), turn-level credit and the update on episodes. It plays the
text envs of ``ppojax.rlhf.envs``, below it; it knows no model family and no task."""
