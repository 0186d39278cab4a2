"""Env PPO's fast forms, kept apart from its math: the Pallas kernel of PPO-Clip's loss and
gradient (``pallas_loss``, each block's arithmetic in ``pallas_block``), and where it swaps in
for the plain loss of ``ppojax.ppo.loss``. What each computes is the plain form's value
(tests/test_kernels.py); ``ppojax.runtime.kernels`` switches them on and off."""

from __future__ import annotations

import functools

from ppojax.engine.epochs import LossFn
from ppojax.ppo.config import PPOConfig
from ppojax.ppo.kernels import pallas_loss
from ppojax.ppo.types import Agent
from ppojax.runtime import kernels


def loss_or_kernel(agent: Agent, config: PPOConfig, plain: LossFn) -> LossFn:
    """``plain`` (env PPO's loss as a function of (params, minibatch)); where the kernels
    candidate "pallas_ppo_loss" fits the config, the same loss and gradient from one Pallas
    kernel (``pallas_loss``) when it is chosen, and by default in programs lowered for CUDA
    (``kernels.by_platform``)."""
    if not pallas_loss.fits(agent, config):
        return plain
    fused = functools.partial(pallas_loss.env_ppo_loss, agent, config)
    return kernels.by_platform("pallas_ppo_loss", plain, fused)
