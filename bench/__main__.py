"""`python -m bench`: measure the systems and write the tables into BENCHMARKS.md (see `bench/run`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from bench.harness import Options, run_benchmark
from bench.report import render, write_report
from bench.systems import SYSTEMS


def _numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench/run", description=__doc__)
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated; default: all")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=_numbers, default=[1, 16, 32])
    parser.add_argument("--scenarios", default="new,conversation")
    parser.add_argument("--min-turns", type=int, default=24, help="least turns in one batch")
    parser.add_argument("--calibration-words", type=int, default=20, help="0 to skip the CPU split")
    parser.add_argument(
        "--conversation-concurrency",
        type=_numbers,
        default=[],
        help="run the conversations only at these concurrencies (default: every --concurrency)",
    )
    parser.add_argument(
        "--round-trips", type=int, default=8, help="turns per system of the counted pass (0: none)"
    )
    parser.add_argument(
        "--output", type=Path, default=Path(__file__).resolve().parent.parent / "BENCHMARKS.md"
    )
    arguments = parser.parse_args(argv)
    options = Options(
        systems=[name for name in arguments.systems.split(",") if name],
        rounds=arguments.rounds,
        concurrency=arguments.concurrency,
        scenarios=[s for s in arguments.scenarios.split(",") if s],  # type: ignore[misc]
        min_turns=arguments.min_turns,
        calibration_words=arguments.calibration_words,
        round_trip_turns=arguments.round_trips,
        conversation_concurrency=arguments.conversation_concurrency,
    )
    run = run_benchmark(options, progress=lambda line: print(line, flush=True))
    section = render(run, command=" ".join(["bench/run", *map(shlex.quote, argv)]))
    write_report(arguments.output, section)
    print(section)
    failed = any(batch.failures for batch in run.batches)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
