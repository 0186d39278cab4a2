"""A ``Job`` (``ppojax.runs.lm.jobs``) trained into a run folder, from a Hugging Face folder to a
Hugging Face folder. A run folder has the layout of every RLHF run folder
(``ppojax.runs.lm.run``) with ``final/`` and ``samples.jsonl`` added::

    config.json        the command's settings (what --resume reads back)
    metrics.csv        one row per step
    curves.png         the job's curves (loss and pair accuracy; score, rewards and KL)
    checkpoints/<n>/   the train state after every chunk (params, optimizer state)
    samples.jsonl      rlhf: a few prompts and sampled responses every --sample-every steps
    final/             the trained model as a Hugging Face folder (``from_pretrained`` reads it)
    summary.json       final metrics (mean of the last 10% of steps), held-out numbers, wall
                       time, versions
    lock               the PID and host of the process training there

The steps run through ``ppojax.runs.loop.train_loop``: a resumed run continues bit for bit.
``final/`` is written into a temporary folder and renamed into place when it is whole.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ppojax.rlhf.core.sampling import response_mask
from ppojax.rlhf.data import PromptData
from ppojax.rlhf.models.generate import generate
from ppojax.rlhf.models.pretrained import PretrainedLM, save_pretrained
from ppojax.rlhf.text_rewards import decode_responses
from ppojax.runs.lm.jobs import Job
from ppojax.runs.lm.run import PLOT_FILE, write_loop_summary
from ppojax.runs.loop import LoopResult, RunDiverged, never_recovered, train_loop
from ppojax.runs.options import RunOptions
from ppojax.runs.plots import plot_metrics

SAMPLES_FILE = "samples.jsonl"
FINAL_DIR = "final"


def save_final(lm: PretrainedLM, params: dict, run_dir: Path) -> Path:
    """``run_dir/final`` as a Hugging Face folder, replaced whole or not at all."""
    final, temporary = Path(run_dir) / FINAL_DIR, Path(run_dir) / f".{FINAL_DIR}-writing"
    shutil.rmtree(temporary, ignore_errors=True)
    save_pretrained(lm, params, temporary)
    if final.exists():
        shutil.rmtree(final)
    os.replace(temporary, final)
    return final


def unshared(state: Any, frozen: Any) -> Any:
    """``state`` with a copy of each leaf that is also a leaf of ``frozen`` or an earlier leaf
    of ``state`` (a float32 policy is its reference's arrays at step 0, a DPO policy its
    frozen reference's): a donated buffer must be donated once and read by nothing else."""
    seen = {id(leaf) for leaf in jax.tree.leaves(frozen)}

    def own(leaf: Any) -> Any:
        if id(leaf) in seen:
            return jnp.copy(leaf)
        seen.add(id(leaf))
        return leaf

    return jax.tree.map(own, state)


def train_job(
    run_dir: Path, lm: PretrainedLM, job: Job, key: jax.Array, options: RunOptions, **loop: Any
) -> tuple[LoopResult, dict[str, Any]]:
    """Train ``job`` through ``train_loop``, ``loop`` its keywords (``num_steps``, and
    ``resume``, ``seed``, ``hooks``, ``checks`` as there), then write curves.png, ``final/``
    and summary.json; the loop's result and the summary. ``RunDiverged`` (after curves.png,
    before ``final/``) when its last step skipped all its updates for a NaN or inf: an
    untrained model is not saved as trained."""
    run_dir = Path(run_dir)
    state = unshared(job.state, job.frozen)
    result = train_loop(
        run_dir,
        job.step,
        state,
        job.frozen,
        key,
        options,
        bar_metrics=job.curves[:2],
        # the step's peak is the loop's, the one ppojax plan judges (job.state is consumed;
        # the result's state is the one to read)
        donate=True,
        **loop,
    )
    plot_metrics(run_dir / PLOT_FILE, result.metrics, job.curves)
    diverged = never_recovered(result.metrics)
    if diverged is not None:
        raise RunDiverged(diverged)
    save_final(lm, job.model_params(result.state, job.frozen), run_dir)
    held_out = {} if job.evaluate is None else {"held_out": job.evaluate(result.state, job.frozen)}
    summary = write_loop_summary(run_dir, result, **held_out)
    return result, summary


class SampleWriter:
    """A chunk hook: after each chunk that reaches a multiple of ``every`` steps (and after
    the last), the responses of the model (``job.model_params``) to the first ``count``
    prompts of ``prompts``, sampled at ``temperature`` (step n on ``fold_in(key, n)``),
    appended to samples.jsonl as {"step", "prompt", "response"} and handed to ``log``
    (W&B). On its first call it drops the lines a resumed run is about to write again."""

    def __init__(
        self,
        run_dir: Path,
        lm: PretrainedLM,
        job: Job,
        prompts: PromptData,
        *,
        count: int,
        every: int,
        num_steps: int,
        response_len: int,
        temperature: float,
        key: jax.Array,
        log: Callable[[int, list[dict[str, Any]]], None] | None = None,
    ) -> None:
        self.path = Path(run_dir) / SAMPLES_FILE
        self.lm, self.job, self.key, self.log = lm, job, key, log
        self.every, self.num_steps = every, num_steps
        rows = np.arange(min(count, len(prompts)))
        self.texts = [prompts.prompts[row] for row in rows]
        self.tokens, self.mask = prompts.tokens[rows], prompts.mask[rows]
        self.sample = jax.jit(
            lambda params, key: generate(
                lm, params, self.tokens, self.mask, key, response_len, temperature
            )
        )
        self.started = False

    def __call__(self, first: int, state: Any, metrics: dict[str, np.ndarray]) -> None:
        if not self.started:
            self.started = True
            drop_lines_after(self.path, first)
        end = first + next(iter(metrics.values())).shape[1]
        if end // self.every == first // self.every and end != self.num_steps:
            return
        params = self.job.model_params(state, self.job.frozen)
        tokens = np.asarray(self.sample(params, jax.random.fold_in(self.key, end)))
        mask = np.asarray(response_mask(tokens, self.lm.tokenizer.eos_id))
        responses = decode_responses(self.lm.tokenizer, tokens, mask)
        rows = [
            {"step": end, "prompt": prompt, "response": response}
            for prompt, response in zip(self.texts, responses, strict=True)
        ]
        with open(self.path, "a") as file:
            file.writelines(json.dumps(row) + "\n" for row in rows)
        if self.log is not None:
            self.log(end, rows)


def drop_lines_after(path: Path, step: int) -> None:
    """Keep the samples.jsonl lines of steps up to ``step`` (atomically)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines(keepends=True):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a kill
            continue
        if row.get("step", 0) <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
    temporary = path.with_name(f".{path.name}.writing")
    temporary.write_text("".join(kept))
    os.replace(temporary, path)
