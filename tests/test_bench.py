"""The benchmarks run and check their own turns: a broken setup fails here instead of reporting nonsense."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_the_loop_benchmark_runs_verified_turns(capsys: pytest.CaptureFixture[str]) -> None:
    bench = load("loop_overhead")
    assert await bench.bastion_turn() == bench.WORDS
    assert await bench.bare_turn() > bench.WORDS
    await bench.main(rounds=1, turns=1)
    assert "ratio" in capsys.readouterr().out


async def test_the_memory_recall_benchmark_runs_on_a_tiny_corpus() -> None:
    bench = load("memory_recall")
    lines = await bench.run(memories=200, users=4, chunks=40, tenants=2, dimensions=8, samples=2, turns=1)
    assert any(line.startswith("| memories: bastion") and "5.00 of 5" in line for line in lines)
    assert lines[-1].startswith("A turn with memory off")


async def test_the_inbox_reply_benchmark_answers_every_message() -> None:
    bench = load("inbox_replies")
    lines = await bench.run(conversations=2, messages=2)
    assert lines[2].startswith("| durable:") and lines[2].endswith("| 4 |")
    assert lines[3].startswith("| direct:") and lines[3].endswith("| 4 |")
    assert lines[-1].startswith("Durable over direct")


async def test_the_hooks_benchmark_measures_three_configurations_and_the_lag() -> None:
    bench = load("hooks")
    lines = await bench.run(users=2, turns=2, rounds=1, idle=0.2)
    assert any(line.startswith("ratio outbox/off:") for line in lines)
    [paired] = [line for line in lines if line.startswith("paired ratios")]
    # Each phase's median and range of its rounds' ratios.
    assert len(re.findall(r"\d+\.\d\d \[\d+\.\d\d to \d+\.\d\d\]", paired)) == 3
    [cpu] = [line for line in lines if line.startswith("CPU ratios")]
    # Four turns are too few for the ratios' values to mean anything; their form is what holds.
    r = r"\d+\.\d\d"
    assert re.search(f"outbox {r}; in-process delivery {r}; delivery by another process {r}$", cpu)
    assert any(line.startswith("| delivered in this process |") for line in lines)
    assert any(line.startswith("| delivered by another process |") for line in lines)
    [worker] = [line for line in lines if line.startswith("the delivering process:")]
    assert worker.endswith(" 16 events delivered")  # by the other process
    assert "outbox events per turn: 4.0" in lines[-3]
    assert "over 16 events" in lines[-2]  # four persist_sessions events per turn
    assert lines[-1].startswith("delivery with nothing to deliver, per second:")


async def test_the_outbox_benchmark_compares_the_triggers_on_with_off() -> None:
    bench = load("hooks_outbox")
    lines = await bench.run(writers=2, pairs=5, rounds=1)
    assert lines[0].startswith("Postgres CPU per pair") and "(2 writers, 5 pairs each" in lines[0]
    assert lines[1].startswith("the outbox's triggers add per turn (two pairs):")
    assert lines[2].startswith("these writes' Postgres CPU, triggers off / on:")
