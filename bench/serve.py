"""One system's server process: `python -m bench.serve SYSTEM PORT CONFIG_JSON`.

The harness starts one per system, each alone in its process, so the CPU read from /proc is that
system's alone. uvicorn runs with its defaults (asyncio loop, h11), no access log, long keep-alive.
With `BENCH_CPROFILE=PATH` the process can run under cProfile, timed by this thread's CPU clock (the
event loop's thread, where a turn's Python runs): SIGUSR1 starts profiling, SIGUSR2 stops it and
writes the statistics to PATH.
"""

from __future__ import annotations

import cProfile
import json
import os
import signal
import sys
import time
from pathlib import Path

import uvicorn

from bench.systems import ServerConfig, load_system


def main(argv: list[str]) -> None:
    name, port, config_path = argv
    config = ServerConfig(**json.loads(Path(config_path).read_text()))
    app = load_system(name).create_app(config)
    profile_path = os.environ.get("BENCH_CPROFILE")
    profile = cProfile.Profile(time.thread_time_ns, 1e-9) if profile_path else None
    if profile is not None:
        signal.signal(signal.SIGUSR1, lambda *_: profile.enable())

        def stop(*_: object) -> None:
            profile.disable()
            profile.dump_stats(profile_path)

        signal.signal(signal.SIGUSR2, stop)
    _serve(app, int(port))


def _serve(app: object, port: int) -> None:
    uvicorn.run(
        app,  # type: ignore[arg-type]
        host="127.0.0.1",
        port=port,
        log_level="warning",
        access_log=False,
        timeout_keep_alive=120,
        lifespan="on",
    )


if __name__ == "__main__":
    main(sys.argv[1:])
