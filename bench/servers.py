"""Start each system's server in its own process on a free port, and read that process's CPU time."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path

from bench.systems import ServerConfig

_REPOSITORY = Path(__file__).resolve().parent.parent
_TICKS = os.sysconf("SC_CLK_TCK")


class ServerStartError(Exception):
    """A system's server did not come up; the message carries the end of its output."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def process_cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process `pid` so far, from /proc/<pid>/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def _process_tree(parent_pid: int) -> Iterator[tuple[int, list[str]]]:
    """`parent_pid` and its live children, each with its `/proc/<pid>/stat` fields after the name."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(entry.name) == parent_pid or int(fields[1]) == parent_pid:
            yield int(entry.name), fields


def pin_process_tree(parent_pid: int, cores: set[int]) -> None:
    """Run `parent_pid` and its live children on `cores` only; children it forks later inherit it."""
    for pid, _ in _process_tree(parent_pid):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(pid, cores)


def children_cpu_seconds(parent_pid: int) -> float:
    """CPU time of `parent_pid` and its live children (the Postgres server and its backends)."""
    return sum((int(fields[11]) + int(fields[12])) / _TICKS for _, fields in _process_tree(parent_pid))


class SystemServer:
    """One system served by uvicorn in a subprocess of the current Python."""

    def __init__(
        self,
        name: str,
        config: ServerConfig,
        workdir: Path,
        *,
        label: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """`label` names its files in `workdir` when the same system runs twice (default: `name`);
        `env` adds to the process's environment."""
        self.name = name
        self.port = free_port()
        config_path = workdir / f"{label or name}.json"
        config_path.write_text(json.dumps(asdict(config)))
        self._log = (workdir / f"{label or name}.log").open("w+b")
        env = {**os.environ, **(env or {}), "PYTHONPATH": str(_REPOSITORY)}
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.serve", name, str(self.port), str(config_path)],
            cwd=_REPOSITORY,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self.pid = self._process.pid

    def wait_ready(self, timeout: float = 180.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ServerStartError(f"{self.name} exited: {self.output()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        raise ServerStartError(f"{self.name} did not listen within {timeout:.0f} s: {self.output()}")

    def cpu_seconds(self) -> float:
        return process_cpu_seconds(self.pid)

    def output(self) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:]

    def stop(self) -> None:
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._log.close()
