"""The one place where ppojax swaps a faster stand-in for a plain JAX call of its core.

The core calls ``scan_drawing`` by what it computes: a rollout's ``lax.scan`` whose steps each
get their randomness. The plain form draws each step's own inside the step; the stand-in
("noise") draws the randomness of all steps at once, one batched PRNG call per kind of
randomness instead of a handful of small PRNG kernels per step, which on CPU at small batch
sizes costs more than the env dynamics. Another draw of the same distribution.

A stand-in stays only while a paired benchmark shows it worth about 10% or more
(benchmarks/stand_ins.py, benchmarks/results/stand_ins.json). This one measured 12% and 8% at
1 seed of the classic CartPole config in two runs, 3% and 5% at 8 seeds: at the line. Others
measured below it (a single-operand sort permutation, flat PRNG draws, optimizer moments and
metrics packed one array per dtype: -4% to +8%) were removed for the plain calls.

``plain()`` (or the environment variable PPOJAX_PLAIN_KERNELS=1, or a comma-separated list of
names) turns the stand-ins off, all or by name (``STAND_INS``), and CUDA's defaults with them
(``CUDA_DEFAULTS``, below). The switch is read when a program is traced: a program compiled
under one setting keeps it.

``CANDIDATES`` are the other way round: off unless chosen, with ``use(*names)`` or the
environment variable PPOJAX_KERNELS (1 for all, or a comma-separated list). They aim at GPUs,
where the update is most of a step's time and a small network's kernels are launch- and
memory-bound; ``benchmarks/gpu.py --parts inside`` measures each one on and off, paired, and
one that earns 10% there becomes a stand-in for that backend, while the others go. Each
computes what its plain form computes (tests/test_kernels.py):

- "gather_once": the minibatches of all epochs of an update gathered in one batched gather
  per leaf, before the epochs, instead of one gather per leaf and epoch (same permutations,
  same samples, same steps);
- "fused_actor_critic": the actor's and the critic's MLP torsos and heads as one MLP of
  block-diagonal layers (``ppojax.networks.fused``): one matrix product per layer for both
  instead of two, in the forward and the backward pass (the same parameters and outputs);
- "pallas_ppo_loss": PPO-Clip's loss and its gradient for two MLP torsos and a Categorical
  or a Gaussian head in one Pallas kernel per block of rows
  (``ppojax.ppo.kernels.pallas_loss``), activations kept on chip, instead of XLA's kernels
  per layer and loss term (the same loss and gradient);
- "associative_gae": GAE's recurrence A_t = delta_t + decay_t * A_{t+1} in log2(T) levels of
  ``jax.lax.associative_scan`` instead of a loop of T trips (``ppojax.engine.gae``; the same
  sum, added in another order);
- "packed_steps": a rollout's steps (``scan_drawing``) STEPS_PER_TRIP a trip of their loop,
  each step's outputs stored as one vector of words (``packed_scan``): one store a trip
  instead of one per output and step (the same bits);
- "flat_params": PPO's epochs carry the parameters as the flat optimizer's one vector
  (``ppojax.ppo.update``): one kernel adds a step's update instead of one per leaf (the same
  values and optimizer state);
- "elementwise_argmax": a discrete action's argmax over at most 8 choices as elementwise
  compares (``ppojax.networks.distributions``), which fuse into the env step, instead of a
  reduction kernel (the same index);
- "pallas_decode_attention": a decoded token's attention over the LM's KV cache in one
  Pallas kernel a row and KV head (``ppojax.rlhf.models.decode_attention``): scores, softmax
  and weighted values on chip, the cache read up to the token's position, instead of XLA's
  kernels for the scores' product, softmax's max, sum and division and the weighted values
  (the same attention, its products accumulated in float32).

``CUDA_DEFAULTS`` are the candidates that programs lowered for CUDA use without being chosen,
and only those programs: ``by_platform`` traces both forms and ``jax.lax.platform_dependent``
keeps the candidate where the program is lowered for CUDA and the plain form everywhere else,
so a CPU (or ROCm) program is the one it was without it and every CPU result stays
bit for bit. No GPU timing has chosen them yet: the count of what an H200 would run did
(``benchmarks/gpu_program.py``, its ``--candidates`` section and its ppojax rows in
benchmarks/results/gpu_program.json). At 1 agent x 8192 envs, one update: "pallas_ppo_loss"
4,077 launches and 40.6 GB -> 3,693 and 5.7 GB (the epochs' activations stay on chip); then
"associative_gae" and "packed_steps" (8 steps a trip) -> 1,909 (GAE's loop of 512 launches
gone, the update's rest 81 -> 73 launches, the rollout 2,176 -> 912); "flat_params" and the
loss's one reduction of all its outputs over the kernel's programs (``pallas_loss``)
55 -> 37 launches per minibatch step; "elementwise_argmax" and 16 steps a trip the rollout
-> 704: 1,426 launches and 6.9 GB per update. "pallas_decode_attention" (the cache write in
it) cut a decoded token of Qwen2.5-0.5B (64 rows, 1,536 cache positions, bfloat16) from 397
launches and 3.19 GB to 253 and 2.73 GB, and of Qwen2.5-7B from 518 to 350 launches
(``benchmarks/decode_program.py``).
The others cut neither by 10%. They stay CUDA's alone because their count is a GPU's (a TPU's
defaults are its own, below); on the CPU the plain program stays the one every CPU result and
test was made with. ``plain(name)`` (or PPOJAX_PLAIN_KERNELS) turns one off for CUDA too.

On the device itself (JAX's default backend a CUDA GPU or a TPU; never in a deviceless
compile nor on a CPU) a default proves itself before a program keeps it: ``by_platform`` asks
``kernel_check.kernel_works``, which checks it against its plain form once per device and
versions and stores the verdict; a kernel that fails leaves the plain form alone in the
program, with one warning line (docs/reliability.md, ``ppojax doctor``).

``TPU_DEFAULTS`` are the same for programs lowered for a TPU (``lowering_for_tpu``: a
deviceless compile for one, ``ppojax.runtime.deviceless_tpu``; or JAX's default backend a
TPU), chosen by the count of what one v5e chip would run (``benchmarks/tpu_program.py
--candidates``, its ``candidates`` section in benchmarks/results/tpu_program.json): a candidate
that cuts ops or bytes per update by 10% or more there. CPU programs stay bit for bit. At 1
agent x 8192 envs, one update (6,561 ops, 32.0 GB plain): "pallas_ppo_loss" (Mosaic's kernel
there) 5,791 ops and 3.7 GB, "associative_gae" 5,669 ops and 32.1 GB, the two 4,982 ops and
3.9 GB. "fused_actor_critic" alone cut bytes to 27.5 GB, but with the two took 5,115 ops and
4.2 GB; "packed_steps" took 7,253 ops and 33.9 GB; the others cut neither by 10%.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp

from ppojax.runtime import kernel_check

STAND_INS = ("noise",)
CUDA_DEFAULTS = (
    "pallas_ppo_loss",
    "associative_gae",
    "packed_steps",
    "flat_params",
    "elementwise_argmax",
    "pallas_decode_attention",
)
# every CUDA default is a candidate; these two cut neither launches nor bytes by 10% there
CANDIDATES = ("gather_once", "fused_actor_critic", *CUDA_DEFAULTS)
TPU_DEFAULTS = ("pallas_ppo_loss", "associative_gae")
PLATFORM_DEFAULTS = tuple(dict.fromkeys(CUDA_DEFAULTS + TPU_DEFAULTS))


def _names_from_environment(variable: str, allowed: tuple[str, ...]) -> frozenset[str]:
    """The names ``variable`` lists: empty or 0 none, 1 all of ``allowed``, else a
    comma-separated list of them."""
    value = os.environ.get(variable, "").strip()
    if value in ("", "0"):
        return frozenset()
    if value == "1":
        return frozenset(allowed)
    names = frozenset(name.strip() for name in value.split(","))
    unknown = names - set(allowed)
    if unknown:
        raise ValueError(f"{variable} names {sorted(unknown)}: use 1 (all), or some of {allowed}")
    return names


# The two switches, read when a program is traced: "plain" holds the STAND_INS turned off,
# "chosen" the CANDIDATES turned on.
_switches = {
    "plain": _names_from_environment("PPOJAX_PLAIN_KERNELS", STAND_INS + PLATFORM_DEFAULTS),
    "chosen": _names_from_environment("PPOJAX_KERNELS", CANDIDATES),
}


def stand_in(name: str) -> bool:
    """Whether programs traced now use the stand-in ``name``: one of STAND_INS (on unless
    ``plain``) or of CANDIDATES (off unless chosen by ``use``)."""
    if name in CANDIDATES:
        return name in _switches["chosen"]
    if name not in STAND_INS:
        raise ValueError(f"no stand-in named {name!r}; they are {STAND_INS + CANDIDATES}")
    return name not in _switches["plain"]


def switches() -> tuple[frozenset[str], frozenset[str]]:
    """The names turned off (``plain``) and chosen (``use``) now: what a cache of programs
    traced under them keys on."""
    return _switches["plain"], _switches["chosen"]


def stand_ins_on() -> bool:
    """Whether programs traced now use every stand-in and CUDA default (the default)."""
    return not _switches["plain"]


@contextlib.contextmanager
def _adding(switch: str, names: tuple[str, ...], allowed: tuple[str, ...]) -> Iterator[None]:
    """``names`` (default: all ``allowed``) added to the switch ``switch`` inside the block."""
    unknown = set(names) - set(allowed)
    if unknown:
        kind = "stand-in" if switch == "plain" else "candidate"
        raise ValueError(f"no {kind} named {sorted(unknown)}; they are {allowed}")
    before = _switches[switch]
    _switches[switch] = before | frozenset(names or allowed)
    try:
        yield
    finally:
        _switches[switch] = before


def plain(*names: str) -> contextlib.AbstractContextManager[None]:
    """Trace programs with the plain forms of ``names`` (default: all STAND_INS, CUDA_DEFAULTS
    and TPU_DEFAULTS) inside this block."""
    return _adding("plain", names, STAND_INS + PLATFORM_DEFAULTS)


def use(*names: str) -> contextlib.AbstractContextManager[None]:
    """Trace programs with the CANDIDATES ``names`` (default: all of them) inside this block."""
    return _adding("chosen", names, CANDIDATES)


_lowering_for = {"cuda": False, "tpu": False}


@contextlib.contextmanager
def _lowering(platform: str) -> Iterator[None]:
    before = _lowering_for[platform]
    _lowering_for[platform] = True
    try:
        yield
    finally:
        _lowering_for[platform] = before


def lowering_for_cuda() -> contextlib.AbstractContextManager[None]:
    """Programs traced inside are meant for CUDA though no GPU is attached (a deviceless
    compile, an export): CUDA's defaults go into them, as on a GPU machine."""
    return _lowering("cuda")


def lowering_for_tpu() -> contextlib.AbstractContextManager[None]:
    """Programs traced inside are meant for a TPU though none is attached: TPU_DEFAULTS go in."""
    return _lowering("tpu")


def may_lower_for_cuda() -> bool:
    """Whether a program traced now may be lowered for CUDA: JAX's default backend is a GPU,
    or inside ``lowering_for_cuda`` (or ``kernel_check.fake_accelerator`` for CUDA).
    Elsewhere ``by_platform`` traces the plain form alone: tracing both forms made
    ``jax.jit(ppojax.train).lower`` of the classic CartPole config take 2.5-3.6 s against
    1.3-1.8 s (a busy 2-core CPU) for the same optimized program."""
    return (
        _lowering_for["cuda"]
        or jax.default_backend() == "gpu"
        or kernel_check.faked_platform() == "cuda"
    )


def may_lower_for_tpu() -> bool:
    """As ``may_lower_for_cuda``, for a TPU: its backend, or inside ``lowering_for_tpu``."""
    return (
        _lowering_for["tpu"]
        or jax.default_backend() == "tpu"
        or kernel_check.faked_platform() == "tpu"
    )


def by_platform(name: str, plain_fn: Callable, candidate_fn: Callable) -> Callable:
    """``plain_fn``, or the candidate ``name``'s ``candidate_fn`` (computing the same, in the
    same structure) where chosen; for one of CUDA_DEFAULTS or TPU_DEFAULTS not turned off,
    where the program may be lowered for that platform (``may_lower_for_cuda``,
    ``may_lower_for_tpu``), a function that traces both and runs ``candidate_fn`` in programs
    lowered for it, ``plain_fn`` in all others; on the device of such a platform, only
    where the candidate passed its check there (``kernel_check``)."""
    if stand_in(name):
        return candidate_fn
    if name in _switches["plain"]:
        return plain_fn
    platforms = {
        platform: candidate_fn
        for platform, defaults, may_lower in (
            ("cuda", CUDA_DEFAULTS, may_lower_for_cuda),
            ("tpu", TPU_DEFAULTS, may_lower_for_tpu),
        )
        if name in defaults and may_lower()
    }
    if not platforms:
        return plain_fn
    # the device the program runs on checks its own platform's kernel first (kernel_check);
    # a deviceless compile is for another machine's device and checks nothing
    device = None if any(_lowering_for.values()) else kernel_check.accelerator()
    checked = None if device is None or device.platform not in platforms else device.platform

    def lowered_by_platform(*args: Any) -> Any:
        chosen = platforms
        if checked is not None and not kernel_check.kernel_works(name, args):
            chosen = {platform: fn for platform, fn in platforms.items() if platform != checked}
        if not chosen:
            return plain_fn(*args)
        return jax.lax.platform_dependent(*args, default=plain_fn, **chosen)

    return lowered_by_platform


def _check_forms(name: str) -> tuple[Callable, Callable]:
    """The contexts a kernel check traces ``name``'s two forms in (``kernel_check``): every
    platform default off, and the same with ``name`` chosen."""

    def plain_form() -> contextlib.AbstractContextManager[None]:
        return plain(*PLATFORM_DEFAULTS)

    @contextlib.contextmanager
    def kernel_form() -> Iterator[None]:
        with plain(*PLATFORM_DEFAULTS), use(name):
            yield

    return plain_form, kernel_form


kernel_check.set_forms(_check_forms)


def scan_drawing(
    step: Callable[[Any, Any], tuple[Any, Any]],
    carry: Any,
    key: jax.Array,
    draw: Callable[[jax.Array, int], Any],
    length: int,
) -> tuple[Any, Any]:
    """``length`` scan steps, each given its randomness: ``draw(key, n)`` is the randomness of
    ``n`` steps ([n, ...] leaves). The plain form draws each step's own inside the step; the
    stand-in draws all ``length`` at once before the scan, one batched PRNG call per kind of
    randomness instead of a handful of small PRNG kernels per step."""
    if not stand_in("noise"):

        def drawing_step(carry: Any, step_key: jax.Array):
            return step(carry, jax.tree.map(lambda x: x[0], draw(step_key, 1)))

        return steps_scan(drawing_step, carry, jax.random.split(key, length))
    return steps_scan(step, carry, draw(key, length))


# Env steps a trip of the rollout's loop runs with "packed_steps" (``packed_scan``): at
# 1 agent x 8192 envs on the H200 8 took the rollout from 9 launches per step to 7.1, 16 to
# 6.4, and 16 with "elementwise_argmax" to 5.5 (benchmarks/gpu_program.py); each doubling
# doubles the rollout's code to compile.
STEPS_PER_TRIP = 16


def steps_scan(step: Callable[[Any, Any], tuple[Any, Any]], carry: Any, xs: Any) -> tuple[Any, Any]:
    """``jax.lax.scan(step, carry, xs)``; with "packed_steps" (a CUDA default), ``packed_scan``."""

    def plain_scan(carry: Any, xs: Any) -> tuple[Any, Any]:
        return jax.lax.scan(step, carry, xs)

    def packed(carry: Any, xs: Any) -> tuple[Any, Any]:
        return packed_scan(step, carry, xs, STEPS_PER_TRIP)

    return by_platform("packed_steps", plain_scan, packed)(carry, xs)


def _packable(leaf: Any) -> bool:
    return leaf.dtype == jnp.bool_ or (leaf.dtype.itemsize == 4 and leaf.dtype.kind in "fiu")


def _to_words(leaf: jax.Array) -> jax.Array:
    if leaf.dtype == jnp.bool_:
        return leaf.astype(jnp.int32).reshape(-1)
    return jax.lax.bitcast_convert_type(leaf, jnp.int32).reshape(-1)


def _from_words(words: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    words = words.reshape(shape)
    if dtype == jnp.bool_:
        return words != 0
    return jax.lax.bitcast_convert_type(words, dtype)


def packed_scan(
    step: Callable[[Any, Any], tuple[Any, Any]], carry: Any, xs: Any, unroll: int
) -> tuple[Any, Any]:
    """``jax.lax.scan(step, carry, xs)``, with each step's 32-bit and boolean outputs stored
    as one vector of words (bit for bit: bitcasts, booleans as 0 and 1) and ``unroll`` steps a
    trip of the loop: one store of [unroll, words] per trip instead of one store per output
    and step, and the loop's own counter and test once per ``unroll`` steps."""
    layout: dict[str, Any] = {}

    def packed_step(carry: Any, x: Any) -> tuple[Any, Any]:
        carry, y = step(carry, x)
        leaves, layout["tree"] = jax.tree.flatten(y)
        layout["packed"] = [_packable(leaf) for leaf in leaves]
        layout["shapes"] = [(leaf.shape, leaf.dtype) for leaf in leaves]
        words = [_to_words(leaf) for leaf in leaves if _packable(leaf)]
        kept = [leaf for leaf in leaves if not _packable(leaf)]
        return carry, (jnp.concatenate(words) if words else jnp.zeros(0, jnp.int32), kept)

    carry, (words, kept) = jax.lax.scan(packed_step, carry, xs, unroll=unroll)
    length = words.shape[0]
    kept = iter(kept)
    leaves, start = [], 0
    for packed, (shape, dtype) in zip(layout["packed"], layout["shapes"], strict=True):
        if not packed:
            leaves.append(next(kept))
            continue
        size = math.prod(shape)
        leaves.append(_from_words(words[:, start : start + size], (length, *shape), dtype))
        start += size
    return carry, jax.tree.unflatten(layout["tree"], leaves)


def scan_epochs(
    epoch: Callable[[Any, Any], Any],
    carry: Any,
    keys: jax.Array,
    shuffle: Callable[[jax.Array], Any],
) -> Any:
    """The carry after one ``epoch(carry, minibatches)`` per key of ``keys`` [E], each epoch's
    minibatches ``shuffle(key)``. The plain form shuffles (gathers) at the start of each
    epoch; "gather_once" shuffles for all E keys at once, before the first: one gather per
    leaf of [E, ...] indices instead of E, and E times the memory of one shuffled batch."""
    if stand_in("gather_once"):
        return jax.lax.scan(lambda c, x: (epoch(c, x), None), carry, jax.vmap(shuffle)(keys))[0]
    return jax.lax.scan(lambda c, key: (epoch(c, shuffle(key)), None), carry, keys)[0]
