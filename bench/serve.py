"""One system's server process: `python -m bench.serve SYSTEM PORT CONFIG_JSON`.

The harness starts one per system, each alone in its process, so the CPU read from /proc is that
system's alone. uvicorn runs with its defaults (asyncio loop, h11), no access log, long keep-alive.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import uvicorn

from bench.systems import ServerConfig, load_system


def main(argv: list[str]) -> None:
    name, port, config_path = argv
    config = ServerConfig(**json.loads(Path(config_path).read_text()))
    app = load_system(name).create_app(config)
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=int(port),
        log_level="warning",
        access_log=False,
        timeout_keep_alive=120,
        lifespan="on",
    )


if __name__ == "__main__":
    main(sys.argv[1:])
