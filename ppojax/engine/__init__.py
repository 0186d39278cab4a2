"""What env PPO and RLHF share: GAE, the masked loss terms, the epochs-of-minibatches engine
with its optimizer step and divergence guard, and the optimizer factory."""
