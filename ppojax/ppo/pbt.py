"""Population-based training inside one compiled program.

``pbt(config, key, population, interval, search)`` trains ``population`` members side by side
(``vmap`` of ``run_updates``). After every ``interval`` updates, still inside the compiled
``lax.scan``, the members are ranked by their mean episode return over that interval; the
bottom ``fraction`` copy the whole training state (params, optimizer state, normalizer
statistics, env state; each keeps its own PRNG key) of a member drawn from the top
``fraction`` (exploit), then perturb the copied hyperparameters by x0.8 or x1.25, or draw
them afresh within their bounds (explore). The hyperparameters become schedules, and every
member's values and the lineage (whom each member copied, at every interval) come back as
arrays.

Only traced ``PPOConfig`` fields can be searched: they are pytree leaves, so one program
trains every value. Typical searches: learning_rate, ent_coef, clip_eps, gae_lambda, gamma,
vf_coef, max_grad_norm.

With a ``mesh`` the population is split over its devices: each member trains on one device,
and only the exploit step's copies (a gather over members) cross between devices.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from ppojax.ppo.config import PPOConfig
from ppojax.ppo.sweeps import check_traced_field
from ppojax.ppo.train import init_state, run_updates
from ppojax.ppo.types import Metrics, TrainState
from ppojax.runtime.sharding import axis_sharding, check_divisible

EXPLORE = ("perturb", "resample")
PERTURB_FACTORS = (0.8, 1.25)


class Bound(NamedTuple):
    """A searched field's range [low, high], drawn uniformly in log space when ``log``."""

    low: float
    high: float
    log: bool


class PBTOutput(NamedTuple):
    """``state`` [P] and ``metrics`` [P, num_updates] as ``train`` gives them per member;
    ``hyperparams`` {field: [P, G]}, each member's values during each of the G intervals;
    ``lineage`` [P, G], the member whose state each member holds after interval g (itself
    when it was not replaced); ``scores`` [P, G], the mean episode return each member was
    ranked by."""

    state: TrainState
    metrics: Metrics
    hyperparams: dict[str, jax.Array]
    lineage: jax.Array
    scores: jax.Array


@dataclasses.dataclass(frozen=True)
class PBTSettings:
    """How ``pbt`` runs a population besides its ``PPOConfig``: ``population`` members, ranked
    every ``interval`` updates; the bottom ``fraction`` copy the top's states and explore
    (``explore_mode``) the ``search`` fields. ``search`` is kept as its (field, spec) items in
    their order (which sets the key each field is drawn with), so the settings hash."""

    population: int
    interval: int
    search: Mapping[str, Any] | tuple[tuple[str, Any], ...]
    fraction: float = 0.25
    explore_mode: str = "perturb"

    def __post_init__(self) -> None:
        object.__setattr__(self, "search", tuple(dict(self.search or {}).items()))


def parse_search(config: PPOConfig, search: Mapping[str, Any]) -> dict[str, Bound]:
    """``{field: (low, high[, "log" | "linear"])}`` checked: a ``ValueError`` naming the field
    for an unknown or static field, a range that is empty, or log bounds that are not > 0."""
    if not search:
        raise ValueError("pbt needs a search: {field: (low, high, 'log' or 'linear')}")
    bounds = {}
    for name, spec in search.items():
        check_traced_field(name, "varied over a population (pbt search)")
        low, high, *scale = tuple(spec)
        scale = scale[0] if scale else "linear"
        if scale not in ("log", "linear"):
            raise ValueError(f"pbt search {name}: scale must be 'log' or 'linear', got {scale!r}")
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ValueError(f"pbt search {name}: need finite low < high, got ({low}, {high})")
        if scale == "log" and low <= 0:
            raise ValueError(f"pbt search {name}: log bounds must be > 0, got low={low}")
        config.replace(**{name: float(low)}).replace(**{name: float(high)})  # valid values
        bounds[name] = Bound(float(low), float(high), scale == "log")
    return bounds


def draw(key: jax.Array, bound: Bound, shape: tuple[int, ...]) -> jax.Array:
    """Values [shape] uniform in [low, high], or log-uniform for a log bound."""
    if bound.log:
        low, high = math.log(bound.low), math.log(bound.high)
        return jnp.exp(jax.random.uniform(key, shape, minval=low, maxval=high))
    return jax.random.uniform(key, shape, minval=bound.low, maxval=bound.high)


def num_replaced(population: int, fraction: float) -> int:
    """How many members the exploit step replaces: ``fraction`` of the population, at least
    one, at most half (the bottom and top groups must not overlap)."""
    return min(max(1, int(population * fraction)), population // 2)


def exploit_sources(key: jax.Array, scores: jax.Array, replaced: int) -> jax.Array:
    """Truncation selection: [P] the member each member copies, itself unless it is among
    the ``replaced`` lowest ``scores`` [P], then a member drawn from the ``replaced`` highest.
    A NaN score (no episode ended in the interval) ranks lowest."""
    population = scores.shape[0]
    order = jnp.argsort(jnp.where(jnp.isnan(scores), -jnp.inf, scores))
    bottom, top = order[:replaced], order[population - replaced :]
    chosen = top[jax.random.randint(key, (replaced,), 0, replaced)]
    return jnp.arange(population).at[bottom].set(chosen)


def explore(
    key: jax.Array,
    values: jax.Array,
    replaced: jax.Array,
    bound: Bound,
    mode: str,
) -> jax.Array:
    """New values [P] of one field: the replaced members' copied values [P] perturbed by x0.8
    or x1.25 (``mode="perturb"``) and clipped to the bound, or drawn afresh ("resample");
    the other members keep theirs."""
    if mode == "resample":
        new = draw(key, bound, values.shape)
    else:
        factors = jnp.asarray(PERTURB_FACTORS, values.dtype)
        new = values * factors[jax.random.randint(key, values.shape, 0, len(factors))]
    return jnp.where(replaced, jnp.clip(new, bound.low, bound.high), values)


def exploit_and_explore(
    key: jax.Array,
    scores: jax.Array,
    states: TrainState,
    hyperparams: dict[str, jax.Array],
    bounds: dict[str, Bound],
    fraction: float,
    mode: str,
) -> tuple[TrainState, dict[str, jax.Array], jax.Array]:
    """One PBT step over the population [P]: the states and hyperparameters after it, and
    the member each member copied [P]."""
    select_key, *explore_keys = jax.random.split(key, 1 + len(bounds))
    sources = exploit_sources(select_key, scores, num_replaced(scores.shape[0], fraction))
    copied = jax.tree.map(lambda leaf: leaf[sources], states)
    copied = copied.replace(key=states.key)  # each member keeps its own randomness
    replaced = sources != jnp.arange(scores.shape[0])
    new = {
        name: explore(k, hyperparams[name][sources], replaced, bounds[name], mode)
        for k, name in zip(explore_keys, bounds, strict=True)
    }
    return copied, new, sources


def population_configs(config: PPOConfig, hyperparams: dict[str, jax.Array]) -> PPOConfig:
    """``config`` with every traced leaf an array [P]: the searched fields' member values,
    the others repeated."""
    population = next(iter(hyperparams.values())).shape[0]
    base = jax.tree.map(lambda leaf: jnp.full((population,), leaf, jnp.float32), config)
    return base.replace(**hyperparams)


def interval_scores(metrics: Metrics) -> jax.Array:
    """Each member's mean episode return over the interval's updates [P, interval] -> [P]
    (NaN updates, where no episode ended, left out; NaN if none ended)."""
    returns = metrics["episode_return"]
    finite = jnp.isfinite(returns)
    total = jnp.sum(jnp.where(finite, returns, 0.0), axis=-1)
    count = jnp.sum(finite, axis=-1)
    return jnp.where(count > 0, total / jnp.maximum(count, 1), jnp.nan)


def check_settings(config: PPOConfig, settings: PBTSettings, mesh: Mesh | None = None) -> None:
    """A ``ValueError`` naming the argument that ``pbt`` cannot run with."""
    population, interval = settings.population, settings.interval
    fraction, explore_mode = settings.fraction, settings.explore_mode
    if explore_mode not in EXPLORE:
        raise ValueError(f"pbt explore_mode must be one of {EXPLORE}, got {explore_mode!r}")
    if population < 2 or interval < 1:
        raise ValueError(
            f"pbt needs population >= 2 and interval >= 1, got {population}, {interval}"
        )
    if not 0.0 < fraction <= 0.5:
        raise ValueError(f"pbt fraction must be in (0, 0.5], got {fraction}")
    if config.num_updates % interval:
        raise ValueError(
            f"pbt interval={interval} must divide the run's {config.num_updates} updates "
            "(total_timesteps // (num_envs * num_steps))"
        )
    if mesh is not None:
        check_divisible(population, mesh, "pbt population")


class PBTRecords(NamedTuple):
    """What every interval leaves, one row per interval g of G (NaN/0 until it has run):
    ``metrics`` [G, P, interval], ``hyperparams`` {field: [G, P]}, ``lineage`` [G, P] and
    ``scores`` [G, P], as ``PBTOutput`` describes them."""

    metrics: Metrics
    hyperparams: dict[str, jax.Array]
    lineage: jax.Array
    scores: jax.Array


class PBTCarry(NamedTuple):
    """A population between intervals: its states and hyperparameters [P], the intervals done
    (``generation``), the key each interval's exploit and explore draw from, and the records
    so far. A plain pytree: it checkpoints, and ``pbt_intervals`` continues it exactly."""

    states: TrainState
    hyperparams: dict[str, jax.Array]
    generation: jax.Array
    key: jax.Array
    records: PBTRecords


def spread(carry: PBTCarry, mesh: Mesh | None) -> PBTCarry:
    """Inside jit: ``carry`` laid out as ``carry_shardings`` says; as it is without a mesh."""
    if mesh is None:
        return carry
    return jax.lax.with_sharding_constraint(carry, carry_shardings(carry, mesh))


def carry_shardings(carry: PBTCarry, mesh: Mesh) -> PBTCarry:
    """The members' axis of ``carry`` split over ``mesh`` (states and hyperparameters
    [P, ...], records [G, P, ...]), the interval count and key replicated: where a carry
    read back from a checkpoint goes (``jax.device_put``) before it trains on."""

    def along(tree: Any, axis: int) -> Any:
        return jax.tree.map(lambda _: axis_sharding(mesh, axis), tree)

    return PBTCarry(
        states=along(carry.states, 0),
        hyperparams=along(carry.hyperparams, 0),
        generation=axis_sharding(mesh, None),
        key=axis_sharding(mesh, None),
        records=along(carry.records, 1),
    )


def pbt_start(
    config: PPOConfig, key: jax.Array, settings: PBTSettings, mesh: Mesh | None = None
) -> PBTCarry:
    """The population before its first interval: hyperparameters drawn within the search's
    bounds, one fresh training state per member, empty records; split over ``mesh``."""
    bounds = parse_search(config, dict(settings.search))
    population, interval = settings.population, settings.interval
    init_key, draw_key, loop_key = jax.random.split(key, 3)
    draw_keys = jax.random.split(draw_key, len(bounds))
    hyperparams = {
        name: draw(k, bound, (population,))
        for k, (name, bound) in zip(draw_keys, bounds.items(), strict=True)
    }
    states = jax.vmap(init_state)(
        population_configs(config, hyperparams), jax.random.split(init_key, population)
    )
    generations = config.num_updates // interval
    shapes = jax.eval_shape(
        lambda c, s: jax.vmap(lambda c, s: run_updates(c, s, interval))(c, s)[1],
        population_configs(config, hyperparams),
        states,
    )
    records = PBTRecords(
        metrics=jax.tree.map(
            lambda leaf: (
                jnp.full((generations, *leaf.shape), jnp.nan, leaf.dtype)
                if jnp.issubdtype(leaf.dtype, jnp.floating)
                else jnp.zeros((generations, *leaf.shape), leaf.dtype)
            ),
            shapes,
        ),
        hyperparams={
            name: jnp.full((generations, population), jnp.nan, jnp.float32) for name in bounds
        },
        lineage=jnp.zeros((generations, population), jnp.int32),
        scores=jnp.full((generations, population), jnp.nan, jnp.float32),
    )
    return spread(PBTCarry(states, hyperparams, jnp.int32(0), loop_key, records), mesh)


def pbt_intervals(
    config: PPOConfig,
    carry: PBTCarry,
    count: int,
    settings: PBTSettings,
    mesh: Mesh | None = None,
) -> PBTCarry:
    """``count`` more intervals of training, each followed by exploit and explore (except the
    run's last), the population split over ``mesh``. Running the intervals in pieces gives
    what one call gives."""
    bounds = parse_search(config, dict(settings.search))
    population, interval = settings.population, settings.interval
    fraction, explore_mode = settings.fraction, settings.explore_mode
    generations = config.num_updates // interval
    train_interval = jax.vmap(lambda c, s: run_updates(c, s, interval))

    def generation(carry: PBTCarry, _: None) -> tuple[PBTCarry, None]:
        index = carry.generation
        step_key = jax.random.split(carry.key, generations)[index]
        states, metrics = train_interval(
            population_configs(config, carry.hyperparams), carry.states
        )
        scores = interval_scores(metrics)
        new_states, new_hyperparams, sources = exploit_and_explore(
            step_key, scores, states, carry.hyperparams, bounds, fraction, explore_mode
        )
        # After the last interval nobody is replaced: the run ends with each member's own state.
        last = index == generations - 1
        new_states = jax.tree.map(lambda a, b: jnp.where(last, a, b), states, new_states)
        new_hyperparams = jax.tree.map(
            lambda a, b: jnp.where(last, a, b), carry.hyperparams, new_hyperparams
        )
        sources = jnp.where(last, jnp.arange(population), sources)
        records = carry.records
        records = PBTRecords(
            metrics=jax.tree.map(lambda r, m: r.at[index].set(m), records.metrics, metrics),
            hyperparams={
                name: records.hyperparams[name].at[index].set(values)
                for name, values in carry.hyperparams.items()
            },
            lineage=records.lineage.at[index].set(sources),
            scores=records.scores.at[index].set(scores),
        )
        new_carry = PBTCarry(new_states, new_hyperparams, index + 1, carry.key, records)
        return spread(new_carry, mesh), None

    carry, _ = jax.lax.scan(generation, spread(carry, mesh), None, length=count)
    return carry


def pbt_output(carry: PBTCarry) -> PBTOutput:
    """The records of a finished population as ``PBTOutput`` (member-major)."""
    records = carry.records
    generations, population = records.lineage.shape
    metrics = jax.tree.map(
        lambda leaf: jnp.moveaxis(leaf, 0, 1).reshape((population, -1, *leaf.shape[3:])),
        records.metrics,
    )
    return PBTOutput(
        state=carry.states,
        metrics=metrics,
        hyperparams={name: values.T for name, values in records.hyperparams.items()},
        lineage=records.lineage.T,
        scores=records.scores.T,
    )


def pbt(
    config: PPOConfig,
    key: jax.Array,
    population: int,
    interval: int,
    search: Mapping[str, Any],
    fraction: float = 0.25,
    explore_mode: str = "perturb",
    mesh: Mesh | None = None,
) -> PBTOutput:
    """Train a population with population-based training; see the module docstring. Pure:
    jit it with the integers and the search fixed, e.g.
    ``jax.jit(functools.partial(pbt, population=8, interval=10, search=search))(config, key)``.
    ``config.num_updates`` must be a multiple of ``interval``. ``pbt_start``,
    ``pbt_intervals`` and ``pbt_output`` are the same run in pieces (the run folder's
    checkpoints). With ``mesh`` the members are split over its devices (``population`` a
    multiple of its device count)."""
    settings = PBTSettings(population, interval, search, fraction, explore_mode)
    check_settings(config, settings, mesh)
    carry = pbt_start(config, key, settings, mesh)
    carry = pbt_intervals(config, carry, config.num_updates // interval, settings, mesh)
    return pbt_output(carry)
