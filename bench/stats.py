"""Figures from batches: medians across rounds with their spread, pooled latency percentiles, and the
split of server CPU into a fixed cost per turn and a cost per streamed text delta."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.harness import Batch, Cell


@dataclass(frozen=True, slots=True)
class Spread:
    """The median of per-round values and the lowest and highest of them."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        if not values:
            return None
        return cls(statistics.median(values), min(values), max(values))

    def format(self, digits: int = 1, scale: float = 1.0) -> str:
        median, low, high = (round(v * scale, digits) for v in (self.median, self.low, self.high))
        if low == high:
            return f"{median:.{digits}f}"
        return f"{median:.{digits}f} ({low:.{digits}f}–{high:.{digits}f})"


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile: the smallest value at or above `fraction` of the sorted values."""
    if not values:
        raise ValueError("no values")
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True, slots=True)
class CellFigures:
    """One system in one cell, over all rounds. None where nothing was measured."""

    turns: int
    failures: int
    first_failure: str | None
    turns_per_second: Spread | None
    p50_ms: float | None
    p99_ms: float | None
    first_delta_p50_ms: float | None
    first_delta_p99_ms: float | None
    cpu_ms_per_turn: Spread | None
    db_statements_per_turn: Spread | None
    wal_bytes_per_turn: Spread | None
    rows_written_per_turn: Spread | None
    db_cpu_ms_per_turn: Spread | None
    transactions_per_turn: Spread | None = None

    @property
    def failed(self) -> bool:
        return self.failures > 0


def cell_figures(batches: Sequence[Batch]) -> CellFigures:
    """Figures of one system's batches in one cell (one batch per round)."""
    measured = [b for b in batches if b.turns and not b.failures]
    latencies = [latency for b in measured for latency in b.latencies]
    firsts = [first for b in measured for first in b.first_deltas]
    with_db = [b for b in measured if b.database is not None]
    failures = [reason for b in batches for reason in b.failures]

    def per_turn(values: list[tuple[float, int]]) -> Spread | None:
        return Spread.of([value / turns for value, turns in values])

    return CellFigures(
        turns=sum(b.turns for b in batches),
        failures=len(failures),
        first_failure=failures[0] if failures else None,
        turns_per_second=Spread.of([b.turns / b.wall_seconds for b in measured]),
        p50_ms=percentile(latencies, 0.50) * 1000 if latencies else None,
        p99_ms=percentile(latencies, 0.99) * 1000 if latencies else None,
        first_delta_p50_ms=percentile(firsts, 0.50) * 1000 if firsts else None,
        first_delta_p99_ms=percentile(firsts, 0.99) * 1000 if firsts else None,
        cpu_ms_per_turn=per_turn([(b.server_cpu_seconds * 1000, b.turns) for b in measured]),
        db_statements_per_turn=per_turn([(b.database.statements, b.turns) for b in with_db if b.database]),
        wal_bytes_per_turn=per_turn([(b.database.wal_bytes, b.turns) for b in with_db if b.database]),
        rows_written_per_turn=per_turn([(b.database.rows_written, b.turns) for b in with_db if b.database]),
        db_cpu_ms_per_turn=per_turn(
            [(b.database.cpu_seconds * 1000, b.turns) for b in with_db if b.database]
        ),
        transactions_per_turn=per_turn([(b.database.transactions, b.turns) for b in with_db if b.database]),
    )


def figures_by_cell(batches: Sequence[Batch]) -> dict[tuple[str, Cell], CellFigures]:
    grouped: dict[tuple[str, Cell], list[Batch]] = {}
    for batch in batches:
        grouped.setdefault((batch.system, batch.cell), []).append(batch)
    return {key: cell_figures(group) for key, group in grouped.items()}


@dataclass(frozen=True, slots=True)
class CpuSplit:
    """Server CPU as `fixed_ms + words × per_delta_us`, from the same cell at two word counts."""

    fixed_ms: float
    per_delta_us: float


def cpu_split(full: CellFigures, short: CellFigures, *, words: int, short_words: int) -> CpuSplit | None:
    if full.cpu_ms_per_turn is None or short.cpu_ms_per_turn is None or words == short_words:
        return None
    per_delta_ms = (full.cpu_ms_per_turn.median - short.cpu_ms_per_turn.median) / (words - short_words)
    return CpuSplit(
        fixed_ms=full.cpu_ms_per_turn.median - words * per_delta_ms, per_delta_us=per_delta_ms * 1000
    )
