"""Tuned settings per env id, as PPOConfig field values: ``PPOConfig.preset(env_id)`` and
``ppojax train ENV`` start from them. Each says where its values come from."""

from __future__ import annotations

from typing import Any

# The MinAtar games: 64 envs x 128 steps, 4 epochs of 8 minibatches, lr 5e-4, ReLU 256-256 MLPs
# on the flattened 10x10xC frame, 10M steps: gymnax-blines' PPO (agents/<game>-MinAtar/ppo.yaml)
# but for gamma 0.99 and the lr annealed, which Breakout alone changes (below), and Asterix's
# lr (below).
# eval_every here and below: about ten in-loop evaluations per run at the preset's budget
# (the last after the final update), so the final policy's evaluation return, what
# gymnax-blines publishes, is in the metrics. For MinAtar that evaluation samples its actions,
# as gymnax-blines' does (utils/ppo.py: batch_evaluate acts through select_action, which
# samples pi), over 64 episodes: the anchor measures the sampling policy, and its mode can
# differ (a greedy policy can repeat a loop that sampling escapes). An evaluation plays
# whole episodes of its envs (at most the env's time limit of sequential steps, against an
# update's rollout and minibatch steps: a small part of these runs), and it leaves training
# bit for bit as it is (the Pendulum preset's metrics and parameters checked equal).
MINATAR_PRESET: dict[str, Any] = {
    "num_envs": 64,
    "num_steps": 128,
    "total_timesteps": 10_000_000,
    "update_epochs": 4,
    "num_minibatches": 8,
    "learning_rate": 5e-4,
    "activation": "relu",
    "hidden_sizes": (256, 256),
    "eval_every": 125,  # of 1220 updates
    "eval_episodes": 64,
    "eval_deterministic": False,
}

# gymnax-blines' PPO for classic control (github.com/RobertTLange/gymnax-blines,
# agents/<env>/ppo.yaml), translated: num_train_envs -> num_envs, n_steps -> num_steps,
# epoch_ppo -> update_epochs, n_minibatch -> num_minibatches, entropy_coeff -> ent_coef,
# critic_coeff -> vf_coef, lr_begin == lr_end -> a constant learning_rate (anneal_lr=False);
# separate actor and critic MLPs of 64-64 ReLU (utils/models.py), the value loss clipped at
# clip_eps = 0.2 (vf_clip_eps), advantages normalized per minibatch, gamma 0.99, GAE 0.95,
# max_grad_norm 1.0. Not translatable: their Gaussian policy's state-dependent std
# (softplus, here a state-independent log_std), their dense layers' default (LeCun) init,
# which makes the untrained policy state-dependent (here the policy head starts near
# uniform), and their time limit taken as termination (here truncation bootstraps).
BLINES_CLASSIC_CONTROL: dict[str, Any] = {
    "update_epochs": 4,
    "num_minibatches": 4,
    "learning_rate": 5e-4,
    "anneal_lr": False,
    "max_grad_norm": 1.0,
    "hidden_sizes": (64, 64),
    "activation": "relu",
}

SUITE_PRESET: dict[str, Any] = {
    "num_envs": 16,
    "num_steps": 64,
    "update_epochs": 4,
    "num_minibatches": 4,
    "learning_rate": 5e-4,
}

PRESETS: dict[str, dict[str, Any]] = {
    # gymnax-blines' budget and rollout (150k steps, 8 envs x 32 steps, 4 epochs of 4
    # minibatches) with PureJaxRL's tanh 64-64 networks and lr 1e-3 annealed: over 16 seeds
    # (4 keys x 4), the mean training return of the last 5% of updates is 500 on every seed,
    # and 64 sampled evaluation episodes give 500 on 15 and 470 on one. At 150k, gymnax-blines'
    # own settings (ReLU, lr 5e-4 constant) left one seed in four near 380-470, PureJaxRL's
    # classic config (PPOConfig's defaults: 4 envs x 128 steps, lr 2.5e-4) trains to ~300,
    # and 16 envs x 32 steps at lr 1e-3 left a seed at 154. No eval_every: CartPole is the
    # default env of the CLI, and evaluations would add to every such compile and run.
    "CartPole-v1": {
        "num_envs": 8,
        "num_steps": 32,
        "total_timesteps": 150_000,
        "learning_rate": 1e-3,
    },
    # gymnax-blines: 16 envs x 32 steps, 4 x 4, lr 5e-4, 500k steps (2 seeds at 100k:
    # evaluation -73 and -80, training -100 and -130)
    "Acrobot-v1": {
        **BLINES_CLASSIC_CONTROL,
        "num_envs": 16,
        "num_steps": 32,
        "total_timesteps": 500_000,
        "eval_every": 100,  # of 976 updates
    },
    # rl-baselines3-zoo's PPO for MountainCar-v0 (hyperparams/ppo.yml: 16 envs x 16 steps,
    # GAE 0.98, no entropy bonus, observations and rewards normalized, 4 epochs of 4
    # minibatches, tanh 64-64, max_grad_norm 0.5; 1M steps there), with lr 2e-3 annealed and 8
    # epochs to finish within gymnax-blines' 250k. The reward is -1 a step until the flag, so
    # learning starts only once some episode reaches it: the normalized observations (the
    # velocity is ~0.01 raw) and no entropy bonus let the policy turn deterministic in the
    # velocity early, which swings the car up (the evaluations' mean is -136 at 12k steps).
    # gymnax-blines' own settings (16 x 32, 64 epochs, entropy 0.003, lr 5e-3 -> 5e-4) never
    # reached it here by 250k, also with normalized observations, lr 2e-3 and no entropy bonus.
    # Final evaluation at 250k, 4 seeds: lr 1e-3 constant -120, 1e-3 annealed -118, 2e-3
    # annealed -117 (4 epochs) and -110 (8 epochs), 3e-3 annealed -121.
    "MountainCar-v0": {
        "num_envs": 16,
        "num_steps": 16,
        "total_timesteps": 250_000,
        "update_epochs": 8,
        "num_minibatches": 4,
        "learning_rate": 2e-3,
        "gae_lambda": 0.98,
        "ent_coef": 0.0,
        "normalize_observations": True,
        "normalize_rewards": True,
        "eval_every": 100,  # of 976 updates
    },
    # gymnax-blines: 32 envs x 16 steps, 4 x 4, lr 5e-4, entropy 0.01, 1M steps, and here the
    # sampling noise correlated from step to step (action_noise_correlation 0.95, an AR(1)
    # process whose every step is still N(0, 1), so the log-probabilities are the policy's
    # own). The action cost (-0.1 a^2 a step, the action clipped to [-1, 1]) pulls the policy
    # to doing nothing (return 0) unless exploration finds the flag (+100) first, and white
    # noise rarely does: simulated, N(0, sigma) actions reach it in 2% of 999-step episodes at
    # sigma 1, 6% at 2, none at 0.5, while the cost shrinks the std within the first episodes.
    # With white noise this preset stays at the do-nothing policy (-0.0 on every seed, and
    # -0.04 with a state-dependent std starting at log-std 0.5: benchmarks/results/
    # exploration.json, benchmarks/README.md's "One-off studies"), and no variant tried with
    # white noise in tuning runs brought all seeds to the flag:
    # normalized observations with entropy 0.1 and normalized rewards, no advantage
    # normalization with entropy 0.1 or 0.2, 256-step rollouts, lr 1e-4, 128 envs, gamma
    # 0.999, entropy 0.05, initial log-stds of 0.5 and 1 (init_log_std), a state-dependent
    # std (state_dependent_std, as gymnax-blines' Gaussian has). Correlated noise pushes the
    # car one way for ~1 / (1 - 0.95) = 20 steps, a quarter of the valley's ~70-step swing,
    # and so pumps energy into it as white noise cannot (colored-noise exploration: Eberhard
    # et al. 2023, "Pink Noise Is All You Need"): every seed evaluates above 93 from 410k steps.
    "MountainCarContinuous-v0": {
        **BLINES_CLASSIC_CONTROL,
        "num_envs": 32,
        "num_steps": 16,
        "total_timesteps": 1_000_000,
        "action_noise_correlation": 0.95,
        "eval_every": 200,  # of 1953 updates
    },
    # 16 envs x 256 steps, 10 epochs x 16 minibatches, lr 1e-3 annealed, gamma 0.97, clip 0.1,
    # entropy bonus 0.02, normalized observations and rewards. gymnax-blines' -130 is out of
    # reach: the best policy of Pendulum's own dynamics scores about -138 on average from
    # uniform starts (benchmarks/results/pendulum_optimum.json, value iteration on a grid;
    # benchmarks/README.md, "One-off studies"). A return varies by ~75 (std) with the start
    # angle, so 64 evaluation episodes (10 gave a standard error of ~30 per seed, -150 on a
    # GPU with one seed at -116); the standard error of a mean over 4 x 64 episodes is ~5.
    # Tried at 1M steps, 4 seeds, final evaluation (benchmarks/results/exploration.json, "One-
    # off studies"): gamma 0.95 with clip 0.2, the preset before, -259.9 (one seed stuck at
    # -561, the others -156 to -166; -164.6 in learning.json at 181ebc8, whose arithmetic
    # differed), a state-dependent std -216.2 (one stuck at -397), correlated action noise at
    # 0.5 -160.2. Earlier, gamma 0.98 -159.4 and 0.99 -160.5 with clip 0.2; and, worse or
    # within the noise in tuning runs, gamma 0.9, GAE 0.9, initial log-std -0.5, 128-128
    # layers, 32 envs x 128 steps.
    # Why the entropy bonus: without it 3 of 32 fresh seeds never balanced (benchmarks/
    # seeds.py; keys from 5602 and 5603, none of 5601's 16) and ended at -1177, -546 and -949.
    # Each had balanced or nearly (an evaluation of -144, -204 or -157 early), then its std
    # collapsed (the lowest final entropies of their 16; 5602's two end at log-std -1.9 and
    # -3.0 against -0.7 to -1.2) while its policy spun the pendulum round (5602's two: the
    # observations' mean cos(theta) over the run 0.37 against 0.70-0.74, mean angular
    # velocity -0.9 and -1.8 against ~0); with no bonus nothing explores out of it. A bonus
    # of 0.005 rescued 5602's two but stuck two of 5603's (-746 and -568, again the two
    # lowest entropies). 0.02 left none stuck on either set (5603's keys: worst -163.4, mean
    # -151.4, results/seeds.json; 5602's: worst -172.9, mean -150.0) and evaluates -153.0 on
    # learning.json's 4 seeds (-155.7 without).
    # Correlated action noise (0.5) made 4 seeds of 5601's 16 collapse late into spinning.
    "Pendulum-v1": {
        "num_envs": 16,
        "num_steps": 256,
        "total_timesteps": 1_000_000,
        "update_epochs": 10,
        "num_minibatches": 16,
        "learning_rate": 1e-3,
        "gamma": 0.97,
        "clip_eps": 0.1,
        "ent_coef": 0.02,
        "normalize_observations": True,
        "normalize_rewards": True,
        "eval_every": 25,  # of 244 updates
        "eval_episodes": 64,
    },
    **{f"{game}-MinAtar": MINATAR_PRESET for game in ("Freeway", "SpaceInvaders")},
    # Asterix learns slowly at lr 5e-4: its MLP evaluated 14.5 (12.5, 15.5, 14.8, 15.1), the
    # curve still rising at 10M steps. With lr 1e-3 (still annealed) 22.4 (23.2, 21.1, 16.9,
    # 28.4), every seed above gymnax-blines' 15 (ppojax train Asterix-MinAtar --seeds 4
    # --learning-rate 1e-3, 2 CPU cores). Worse at lr 5e-4: gymnax-blines' gamma 0.999 and
    # constant lr, 12.4 (12.2, 11.8, 15.8, 9.9); half the entropy bonus, 12.3 (10.7, 13.6,
    # 15.2, 9.5).
    "Asterix-MinAtar": {**MINATAR_PRESET, "learning_rate": 1e-3},
    # Breakout takes gymnax-blines' gamma 0.999 and constant lr: with gamma 0.99 and the lr
    # annealed its MLP reached 15.8 over 4 seeds, one stuck at 7.0 from 4M steps (its policy
    # replaying one 7-point episode); with these 33.3 (27.2, 56.1, 23.6, 26.1), every seed
    # rising to the end (benchmarks/results/learning.json).
    "Breakout-MinAtar": {**MINATAR_PRESET, "gamma": 0.999, "anneal_lr": False},
    # The adapter suites' settings that benchmarks/envs.py at 54d94c6 trains (Snake there on a 6x6
    # board, env_kwargs={"num_rows": 6, "num_cols": 6, "time_limit": 100}, NAVIX's room with a
    # 20-step limit, {"max_steps": 20}); the envs stay as they are.
    "jumanji/Snake-v1": {**SUITE_PRESET, "total_timesteps": 600_000},
    "xminigrid/MiniGrid-Empty-5x5": {**SUITE_PRESET, "total_timesteps": 200_000},
    "navix/Navix-Empty-5x5-v0": {**SUITE_PRESET, "total_timesteps": 200_000},
    # Craftax Classic's symbolic world: generating a world (a reset) costs about 70 steps on a
    # CPU, so each env draws one start per rollout (reset_pool=1; ~6x the env steps/s);
    # 64 envs and 256-256 MLPs for its 1345-long observation; 1M steps, the budget of the
    # Craftax paper's sample-efficiency benchmark (Craftax-1M)
    "craftax/Craftax-Classic-Symbolic-v1": {
        **SUITE_PRESET,
        "num_envs": 64,
        "hidden_sizes": (256, 256),
        "reset_pool": 1,
        "total_timesteps": 1_000_000,
    },
    # brax's default (generalized) backend: continuous actions, so no entropy bonus and
    # observations normalized, as for Pendulum; lr 3e-4, the usual for Box actions
    "brax/inverted_pendulum": {
        **SUITE_PRESET,
        "total_timesteps": 500_000,
        "learning_rate": 3e-4,
        "ent_coef": 0.0,
        "normalize_observations": True,
    },
    # Locomotion on a CPU's budget: brax's hopper on its positional backend (~14k env steps/s
    # on 2 cores against ~3k for halfcheetah). The MuJoCo PPO settings of Schulman et al. 2017
    # and CleanRL's ppo_continuous_action (2048 steps per update, 10 epochs of 64-sample
    # minibatches, lr 3e-4 annealed, no entropy bonus, normalized observations and rewards),
    # over 16 envs x 128 steps; 1M steps, the MuJoCo benchmark's budget.
    "brax/hopper": {
        "num_envs": 16,
        "num_steps": 128,
        "total_timesteps": 1_000_000,
        "update_epochs": 10,
        "num_minibatches": 32,
        "learning_rate": 3e-4,
        "ent_coef": 0.0,
        "normalize_observations": True,
        "normalize_rewards": True,
        "env_kwargs": {"backend": "positional"},
        "eval_every": 61,  # of 488 updates
        "eval_episodes": 16,
    },
    # DeepMind Control's cartpole on MJX: 1000-step episodes, rewards in [0, 1] every step;
    # Playground's own settings scaled down (a long horizon, gamma 0.995, normalized rewards,
    # an entropy bonus of 0.01). lr 5e-4: at 1e-3 the two seeds of a sweep rose to 998 and
    # 876, then fell to ~230; without the entropy bonus a seed can stall near 450
    # (benchmarks/README.md at 54d94c6, "One env per adapter suite").
    "playground/CartpoleBalance": {
        "num_envs": 64,
        "num_steps": 32,
        "total_timesteps": 3_000_000,
        "update_epochs": 8,
        "num_minibatches": 8,
        "learning_rate": 5e-4,
        "gamma": 0.995,
        "normalize_observations": True,
        "normalize_rewards": True,
    },
}
