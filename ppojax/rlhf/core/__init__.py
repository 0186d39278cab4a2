"""The RLHF algorithm on token arrays: ``RLHFConfig``, sampling, LoRA, KL and advantages, the
loss, the trainers' state and update, and the state sharded over devices. It knows no model
family, no text and no task."""
