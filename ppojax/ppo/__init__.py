"""The algorithm, pure and jittable: config, rollout, GAE, losses, update, train, sweeps."""
