"""Which units a profiling run's timers identify, and which runs to make.

Every PP rank's ``forward-compute`` (and ``backward-compute``) timer is the sum, over the
micro-batches it ran, of the units its stage holds; per micro-batch that is one row of a linear
system (:func:`design_rows`).  A timer spreads in proportion to its rank's time (each op's
jitter is relative), so a unit is measured well only where it is a good share of some rank's
time: the profile design picks a few layouts, fitting in memory and running fast, under which
the fit (weighted by the same spread) pins every unit down to a small relative error.

What one layout keeps together cannot be told apart: with MTP always beside the loss only the
sum m + L is identified (and that is all a planner that keeps them together needs); the split
then follows FLOPs, and an MTP-standalone run is needed to measure them apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ray_layout.errors import ConfigError
from ray_layout.model.costs import UnitCosts
from ray_layout.model.fields import ModelSpec
from ray_layout.model.layout import Layout
from ray_layout.model.memory_settings import PLAIN, MemorySettings
from ray_layout.model.sizing import GIB, LOSS, MTP, unit_sizes
from ray_layout.model.spec import ParallelConfig
from search.cost_model import build_cost_model
from search.evaluate import score
from search.pipeline_ops import ScheduleShape
from search.schedule import compile_schedule
from search.space import LayoutSpace

PAIR = "m+L"  # the MTP layers and the loss, fitted as one unit when never measured apart
# Megatron prints its timers to 0.01 ms: a rank's time (or a unit's cost) below it is taken as it
TIMER_RESOLUTION_MS = 0.01


def unit_columns(model: ModelSpec, mtp_apart: bool) -> tuple[str, ...]:
    """The units to solve for: m and L separately only if some run held MTP without the loss
    (``mtp_apart``), else their sum."""
    decoders = tuple(u for u in unit_sizes(model) if u.startswith("t"))
    if not model.mtp_num_layers:
        return ("E", *decoders, LOSS)
    return ("E", *decoders, *((MTP, LOSS) if mtp_apart else (PAIR,)))


def design_rows(model: ModelSpec, layout: Layout, columns: Sequence[str]) -> np.ndarray:
    """(PP, U): how many of each unit every PP rank holds, over all its chunks."""
    space, cuts = LayoutSpace.holding(layout)
    units = [u for u in columns if u != PAIR] + ([MTP, LOSS] if PAIR in columns else [])
    counts = space.unit_counts(cuts[None], units, model.moe_layer_pattern)[0]
    per_rank = counts.reshape(layout.vpp, layout.pp, len(units)).sum(axis=0)
    if PAIR not in columns:
        return per_rank
    m, loss = units.index(MTP), units.index(LOSS)
    pair = np.maximum(per_rank[:, m] / max(model.mtp_num_layers, 1), per_rank[:, loss])
    return np.column_stack([per_rank[:, : len(columns) - 1], pair])


def timer_spread(stage_ms: np.ndarray) -> np.ndarray:
    """Each rank's timer spread up to one common factor (its jitter's cv): proportional to its
    time, as relative jitter spreads (clocks and contention on GPUs, the emulator's lognormal);
    never below the timers' resolution, so that a rank of next to nothing is not trusted without
    bound."""
    return np.maximum(stage_ms, TIMER_RESOLUTION_MS)


def relative_errors(designs: np.ndarray, unit_ms: np.ndarray) -> np.ndarray:
    """(n, U): each unit's standard error relative to its cost ``unit_ms`` (U,), in units of the
    timers' cv with one sample per row, for stacked designs (n, rows, U) fitted by least squares
    weighted by ``timer_spread``; infinite where the design cannot tell the units apart.

    Weighted, a row is each unit's share of its rank's time, so this is the diagonal of
    (S^T S)^-1 for the shares S: a unit beside heavier ones on every rank it shares is lost in
    their noise however well conditioned the counts are (1 ms E beside 40 ms of layers)."""
    return share_errors(unit_shares(designs, unit_ms))


def unit_shares(designs: np.ndarray, unit_ms: np.ndarray) -> np.ndarray:
    """(..., rows, U): each unit's share of its rank's time, the rows the weighted fit sees."""
    cost = np.maximum(unit_ms, TIMER_RESOLUTION_MS)
    return designs * cost / timer_spread(designs @ cost)[..., None]


def share_errors(shares: np.ndarray) -> np.ndarray:
    """:func:`relative_errors` of stacked share rows (n, rows, U)."""
    _, values, vt = np.linalg.svd(shares, full_matrices=False)
    usable = values[:, -1:] > 1e-9 * values[:, :1]
    variance = ((vt / np.where(usable, values, 1.0)[..., None]) ** 2).sum(axis=1)
    full = usable[:, 0] & (values.shape[1] == shares.shape[2])
    return np.where(full[:, None], np.sqrt(variance), np.inf)


# A Gram matrix whose eigenvalues are within this ratio is well posed: its inverse is exact to
# about 1e-8, and adding a candidate's rows (positive semi-definite) keeps it so.
WELL_POSED = 1e-8


def _errors_with(chosen: np.ndarray, roots: np.ndarray, grams: np.ndarray) -> np.ndarray:
    """(n,) the worst relative error of the ``chosen`` share rows (rows, U) with each candidate's
    added (their ``_square_root`` (n, r, U) and Gram matrices (n, U, U)): from the inverse of the
    summed Gram matrices where the chosen rows alone are well posed (the usual case once a run
    or two are chosen, and several times faster), else by SVD, which finds the candidates that
    still leave units apart."""
    gram = chosen.T @ chosen
    low, high = np.linalg.eigvalsh(gram)[[0, -1]]
    if low > WELL_POSED * (high + np.trace(grams, axis1=1, axis2=2).max()):
        variance = np.diagonal(np.linalg.inv(gram + grams), axis1=1, axis2=2)
        return np.sqrt(variance).max(axis=1)
    root = _square_root(chosen)
    fixed = np.broadcast_to(root, (len(roots), *root.shape))
    return share_errors(np.concatenate([fixed, roots], axis=1)).max(axis=1)


def _square_root(rows: np.ndarray) -> np.ndarray:
    """At most U rows with the same Gram matrix as ``rows`` (..., rows, U) (R of their QR):
    stacked with other rows they give the same singular values and right singular vectors as
    all the rows would, so a greedy step costs the same however many runs are chosen and
    however many PP ranks each has."""
    return np.linalg.qr(rows, mode="r") if rows.shape[-2] > rows.shape[-1] else rows


PROFILE_FLAGS = (
    "--timing-log-level",
    "2",
    "--timing-log-option",
    "all",
    "--log-interval",
    "1",
    "--eval-iters",
    "0",
)


@dataclass(frozen=True)
class ProfilePlan:
    """The runs to make, and how well they pin down each unit's cost."""

    layouts: tuple[Layout, ...]
    columns: tuple[str, ...]
    rank: int
    condition: float  # of the stacked design, columns scaled to unit length
    # the worst unit's standard error relative to its guessed cost, forward or backward, in
    # units of the timers' cv with one interval of one micro-batch (``relative_errors``)
    worst_relative_error: float
    predicted_ms: tuple[float, ...]  # step time of each run under the guessed costs
    peak_memory_gib: tuple[float, ...]

    @property
    def unidentified(self) -> tuple[str, ...]:
        """What these runs leave to FLOPs rather than measure."""
        if PAIR not in self.columns:
            return ()
        why = "no run holds MTP without the loss, so only their sum is measured"
        return (f"m and L apart: {why}; their split follows FLOPs (allow standalone MTP)",)

    def megatron_flags(self, layout: Layout, train_iters: int = 20) -> list[str]:
        """What to add to a run's ``pretrain_gpt.py`` command line to profile this layout."""
        return [
            "--pipeline-model-parallel-size",
            str(layout.pp),
            "--pipeline-model-parallel-layout",
            str(layout),
            "--train-iters",
            str(train_iters),
            *PROFILE_FLAGS,
        ]


def _condition(designs: np.ndarray) -> np.ndarray:
    """(n,) condition numbers of stacked designs (n, rows, U), columns scaled to unit length;
    rank-deficient ones are infinite."""
    norms = np.linalg.norm(designs, axis=1, keepdims=True)
    scaled = designs / np.where(norms > 0, norms, 1.0)
    values = np.linalg.svd(scaled, compute_uv=False)
    smallest = values[:, -1]
    return np.where(smallest > 1e-9, values[:, 0] / np.maximum(smallest, 1e-300), np.inf)


_SAMPLE_ROWS = 4_096


def _candidate_cuts(space: LayoutSpace, limit: int, seed: int) -> np.ndarray:
    """Every layout of a small space, or a seeded sample of a large one."""
    if space.count().total <= limit:
        return np.concatenate(list(space.cut_blocks()))
    rng = np.random.default_rng(seed)
    items = space.num_layers + 2 + bool(space.mtp_num_layers)
    blocks = []  # drawn a block of rows at a time: the same numbers, without a (4·limit, items)
    for start in range(0, limit * 4, _SAMPLE_ROWS):  # matrix of gigabytes for 1,024 layers
        order = rng.random((min(_SAMPLE_ROWS, limit * 4 - start), items - 1)).argsort(axis=1)
        blocks.append(np.sort(order[:, : space.num_stages - 1] + 1, axis=1))
    raw = np.concatenate(blocks)
    valid = [row for row in raw if _valid_cut_set(space, row)]
    return np.unique(np.array(valid[:limit], dtype=np.int64), axis=0)


def _valid_cut_set(space: LayoutSpace, cuts: np.ndarray) -> bool:
    if space.mtp_num_layers:
        mtp_stage = int((cuts <= space.num_layers + 1).sum())
        if not space.allow_standalone_mtp and mtp_stage != space.num_stages - 1:
            return False
    return True


def profile_design(
    model: ModelSpec,
    parallel: ParallelConfig,
    num_microbatches: int,
    guess: UnitCosts,
    *,
    hbm_gib: float | None = None,
    standalone_mtp: bool = False,
    runs: int = 2,
    candidate_limit: int = 20_000,
    seed: int = 0,
    settings: MemorySettings = PLAIN,
) -> ProfilePlan:
    """The fewest runs (``runs``, at least enough for full rank) whose per-rank timers identify
    every unit: the fastest layout that fits first, then each next run the one that makes the
    worst relative error of any unit, forward or backward, under the guessed costs smallest
    (``relative_errors``; ties within 5% to the faster run).  The runs' memory and step are
    those of the job's memory ``settings`` (its recomputation), which the runs carry."""
    run = replace(parallel, vpp=1)
    space = LayoutSpace.of(model, run, allow_standalone_mtp=standalone_mtp)
    cuts = _candidate_cuts(space, candidate_limit, seed)
    program = compile_schedule(ScheduleShape(run.pp, 1, num_microbatches))
    cost_model = build_cost_model(model, run, guess, num_microbatches, settings=settings)
    scores = score(
        program, cost_model, space.unit_counts(cuts, cost_model.units, model.moe_layer_pattern)
    )
    fits = np.ones(len(cuts), dtype=bool)
    if hbm_gib is not None:
        fits = scores.peak_memory_bytes <= hbm_gib * GIB
        if not fits.any():
            raise ConfigError(f"no layout on PP={run.pp} fits in {hbm_gib} GiB for profiling")
    layouts = [Layout(space.stages_from_cuts(tuple(int(c) for c in row)), run.pp) for row in cuts]
    columns = unit_columns(model, standalone_mtp)
    designs = np.array([design_rows(model, layout, columns) for layout in layouts], dtype=float)
    guessed = [_column_costs(table, columns) for table in (guess.forward_ms, guess.backward_ms)]

    shares = [unit_shares(designs, ms) for ms in guessed]  # (n, PP, U) for each cost table
    roots = [_square_root(table) for table in shares]  # (n, min(PP, U), U)

    def worst(stacked: np.ndarray) -> np.ndarray:
        return np.max([relative_errors(stacked, ms).max(axis=1) for ms in guessed], axis=0)

    grams = [np.einsum("nru,nrv->nuv", table, table) for table in shares]

    def worst_with(chosen: list[int]) -> np.ndarray:
        """(n,) ``worst`` of the chosen runs with each candidate added."""
        return np.max(
            [
                _errors_with(table[chosen].reshape(-1, len(columns)), root, gram)
                for table, root, gram in zip(shares, roots, grams, strict=True)
            ],
            axis=0,
        )

    steps = np.where(fits, scores.noise_free_ms, np.inf)
    chosen = [int(np.argmin(steps))]

    def so_far() -> np.ndarray:
        """(1, rows, U): the chosen runs' rows stacked."""
        return designs[chosen].reshape(1, -1, len(columns))

    while len(chosen) < runs or not np.isfinite(worst(so_far())[0]):
        if len(chosen) >= runs + len(columns):
            raise ConfigError(
                f"no set of layouts on PP={run.pp} identifies all of {', '.join(columns)}"
            )
        error = np.where(fits, worst_with(chosen), np.inf)
        error[chosen] = np.inf
        best = error.min()
        if np.isfinite(best):
            near = np.flatnonzero(error <= best * 1.05)  # as good: take the fastest
        else:  # no one run completes the rank (PP 2 with a dense first layer needs three)
            near = _raising_rank(designs, chosen, fits)
            if not len(near):
                raise ConfigError(
                    f"no set of layouts on PP={run.pp} identifies all of {', '.join(columns)}"
                )
        chosen.append(int(near[np.argmin(steps[near])]))
    design = so_far()
    return ProfilePlan(
        layouts=tuple(layouts[i] for i in chosen),
        columns=columns,
        rank=int(np.linalg.matrix_rank(design[0])),
        condition=float(_condition(design)[0]),
        worst_relative_error=float(worst(design)[0]),
        predicted_ms=tuple(float(scores.noise_free_ms[i]) for i in chosen),
        peak_memory_gib=tuple(float(scores.peak_memory_bytes[i]) / GIB for i in chosen),
    )


def _raising_rank(designs: np.ndarray, chosen: list[int], fits: np.ndarray) -> np.ndarray:
    """The fitting candidates not yet chosen that raise the chosen runs' rank the most (none if
    no candidate raises it): what a candidate adds is the rank of its rows in the directions the
    chosen rows leave unspanned."""
    stacked = designs[chosen].reshape(-1, designs.shape[2])
    tolerance = 1e-9 * max(1.0, float(np.abs(designs).max()))  # the rows are unit counts
    _, values, directions = np.linalg.svd(stacked)
    unspanned = directions[int((values > tolerance).sum()) :].T  # (U, U - rank): the null space
    if not unspanned.size:
        return np.array([], dtype=np.int64)
    gained = np.linalg.matrix_rank(designs @ unspanned, tol=tolerance)
    gained[chosen] = 0
    gained[~fits] = 0
    return np.flatnonzero((gained == gained.max()) & (gained > 0))


def _column_costs(unit_ms: dict[str, float], columns: Sequence[str]) -> np.ndarray:
    """(U,) a cost table's ms for the design's columns (m + L as their sum)."""
    return np.array([unit_ms[MTP] + unit_ms[LOSS] if c == PAIR else unit_ms[c] for c in columns])
