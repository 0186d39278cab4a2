"""4 learning rates x 8 seeds of PPO on CartPole-v1 in one compiled call.

python examples/sweep_cartpole.py
"""

import time

import jax
import numpy as np

import ppojax
from ppojax.ppo.sweeps import format_table

config = ppojax.PPOConfig(env_id="CartPole-v1", total_timesteps=500_000)
keys = jax.random.split(jax.random.key(0), 8)
start = time.perf_counter()
out = ppojax.sweep(config, keys, learning_rate=[1e-4, 2.5e-4, 1e-3, 3e-3])
jax.block_until_ready(out.metrics)
print(f"32 runs x 500k steps in {time.perf_counter() - start:.0f} s (compile included)")
print(out.metrics["episode_return"].shape)  # (4 points, 8 seeds, 976 updates)

rows = ppojax.sweep_table(out)
summary = []
for point, lr in enumerate(out.grid["learning_rate"]):
    final = [row["final_return"] for row in rows if row["point"] == point]
    auc = [row["auc"] for row in rows if row["point"] == point]
    summary.append(
        {
            "learning_rate": float(lr),
            "final_return_mean": float(np.mean(final)),
            "final_return_min": float(np.min(final)),
            "auc_mean": float(np.mean(auc)),
        }
    )
print(format_table(summary))
print("best:", ppojax.best_point(out))
