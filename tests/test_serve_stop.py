"""`bastion serve` with the embedded database: stopped by SIGTERM, SIGHUP or SIGINT it stops its Postgres
(SIGTERM after draining, also when it leaves a reply still running at the deadline), and it starts
cleanly after a server that was killed (a stale entry, a Postgres left running).

The servers share one data directory, so the database is initialised and migrated once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import psutil
import pytest

from bastion.assistant.config import AssistantConfig
from bastion.assistant.server import development_sign_in

READY = "bastion assistant at"
STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(scope="module")
def data_dir() -> Iterator[Path]:
    # Its own temporary folder: pytest's numbered ones may be pruned by another run on the machine.
    with tempfile.TemporaryDirectory(prefix="bastion-serve-stop-") as folder:
        yield Path(folder)
        for server in STARTED:  # never leave a server behind, whatever a test did
            if server.poll() is None:
                server.kill()
                server.wait()
        for process in postgres_of(Path(folder)):
            process.kill()


def postgres_of(data_dir: Path) -> list[psutil.Process]:
    """The Postgres processes running on this data directory."""
    pgdata = str((data_dir / "postgres").resolve())
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        if process.info["name"] == "postgres" and pgdata in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found


def handles(data_dir: Path) -> list[int]:
    listed: list[int] = json.loads((data_dir / "postgres" / ".handle_pids.json").read_text())
    return listed


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def start(data_dir: Path, **settings: str) -> tuple[subprocess.Popen[str], list[str]]:
    """`bastion serve` on the data directory, once it says where it serves; its stderr lines so far.
    `settings` are environment variables (hooks and durable turns are off unless they say)."""
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bastion.cli",
            "serve",
            "--port",
            str(free_port()),
            "--data-dir",
            f"{data_dir}",
        ],
        cwd=data_dir,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "BASTION_HOOKS": "off", "BASTION_DURABLE": "off", **settings},
    )
    STARTED.append(server)
    assert server.stderr is not None
    said: list[str] = []
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        line = server.stderr.readline()
        if not line:
            break
        said.append(line)
        if READY in line:
            return server, said
    server.kill()
    raise AssertionError(f"bastion serve did not start: {''.join(said)}")


def stop(server: subprocess.Popen[str], how: signal.Signals) -> str:
    """Send the signal; the rest of what the server said, once it has exited."""
    server.send_signal(how)
    try:
        _, rest = server.communicate(timeout=120)  # DBOS and Postgres may take a while on a busy machine
    except subprocess.TimeoutExpired:
        server.kill()
        raise
    return rest


@pytest.mark.parametrize("how", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda how: how.name)
def test_a_signal_stops_the_embedded_database_with_the_server(data_dir: Path, how: signal.Signals) -> None:
    server, _ = start(data_dir)
    assert postgres_of(data_dir)
    said = stop(server, how)
    assert server.returncode == 0, said
    assert "Traceback" not in said
    assert postgres_of(data_dir) == []
    assert handles(data_dir) == []


def test_a_server_started_after_one_was_killed_reuses_its_database_and_stops_it(data_dir: Path) -> None:
    killed, _ = start(data_dir)
    killed.kill()
    killed.wait()
    left = postgres_of(data_dir)
    assert left and handles(data_dir) == [killed.pid]  # what a killed server leaves behind

    server, said = start(data_dir)
    reused = f"Reusing the embedded database a server that did not stop (pid {killed.pid}) left running"
    assert reused in "".join(said)
    assert {p.pid for p in postgres_of(data_dir)} >= {p.pid for p in left if p.is_running()}
    assert handles(data_dir) == [server.pid]
    stop(server, signal.SIGTERM)
    assert postgres_of(data_dir) == []
    assert handles(data_dir) == []


def test_a_server_starts_over_a_stale_entry_of_a_server_gone_with_its_database(data_dir: Path) -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )

    stale = int(gone.stdout)
    if not (data_dir / "postgres" / "PG_VERSION").exists():  # run alone: a database to start over
        stop(start(data_dir)[0], signal.SIGTERM)
    (data_dir / "postgres" / ".handle_pids.json").write_text(json.dumps([stale]))

    server, said = start(data_dir)
    cleared = f"Cleared the embedded database's record of a server that did not stop (pid {stale})"
    assert cleared in "".join(said)
    assert handles(data_dir) == [server.pid]
    stop(server, signal.SIGTERM)
    assert postgres_of(data_dir) == []
    assert handles(data_dir) == []


def address(said: list[str]) -> str:
    """Where the server said it serves."""
    [line] = [line for line in said if READY in line]
    return line.split(READY, 1)[1].split()[0].rstrip("/")


class LongReply:
    """A POST asking the demo model for its long answer (about 20 s), read in a thread: its chunks so far."""

    def __init__(self, url: str, token: str) -> None:
        self.conversation = str(uuid.uuid4())
        self.url, self.token = url, token
        self.chunks: list[dict[str, Any]] = []
        self.status: int | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        message = {
            "id": uuid.uuid4().hex,
            "role": "user",
            "parts": [{"type": "text", "text": "a long answer"}],
        }
        body = {"id": self.conversation, "messages": [message], "trigger": "submit-message"}
        headers = {"Authorization": f"Bearer {self.token}"}
        with (
            contextlib.suppress(httpx2.HTTPError),
            httpx2.Client(timeout=60) as http,
            http.stream("POST", f"{self.url}/api/chat", json=body, headers=headers) as response,
        ):
            self.status = response.status_code
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    self.chunks.append(json.loads(line[6:]))

    def streaming(self, deltas: int = 3) -> None:
        deadline = time.monotonic() + 60
        while sum(chunk["type"] == "text-delta" for chunk in self.chunks) < deltas:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the long reply did not stream"
            time.sleep(0.02)


def test_sigterm_leaves_a_reply_still_running_at_the_deadline_and_stops_the_database(data_dir: Path) -> None:
    server, said = start(data_dir, BASTION_DURABLE="on", BASTION_DRAIN_SECONDS="0.5")
    token = development_sign_in(AssistantConfig(data_dir=data_dir)).issue_token("ada")
    reply = LongReply(address(said), token)
    reply.streaming()
    rest = stop(server, signal.SIGTERM)
    assert server.returncode == 0, rest
    assert "1 turn(s) still running after 0.5 s: left to other workers." in rest
    assert "Traceback" not in rest
    # Cut short as by a worker that died, not settled: the next worker (here, the next start) takes it
    # over from the database (tests/test_durable_restart.py).
    reply.thread.join(10)
    assert reply.status == 200
    assert {"finish", "error", "abort"}.isdisjoint(chunk["type"] for chunk in reply.chunks)
    assert postgres_of(data_dir) == []
    assert handles(data_dir) == []
