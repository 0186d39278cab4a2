"""The RLHF algorithm on token arrays: ``RLHFConfig``, sampling, LoRA, KL and advantages, the
loss, the rollout, ``make_trainer``'s pure init and step, and the trainer's state sharded over
devices. It knows no model family, no text and no task."""
