"""The previous release's code, from this repository's own history, to run beside this one.

A rolling deploy runs workers of two releases on one database at once: the new release migrates it
first (expand), then its workers replace the old ones one by one. `previous_release_tree` extracts the
previous release (`PREVIOUS_RELEASE`, a commit of `main`) with `git archive`; its processes run from
that tree (`PYTHONPATH`) on this checkout's virtual environment. Without the repository's history (a
shallow clone, or a source archive) there is nothing to extract, and the tests that need it say so.

When a release is cut, `PREVIOUS_RELEASE` moves to it (see docs/rolling-deploys.md).
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parent.parent
# `main` when the durable-turn work was released: the release this one must run beside.
PREVIOUS_RELEASE: Final = "237b14018d50aa14625f9a9ce899ffea595501e6"

# Every migration of every component, as the assistant applies them (`bastion migrate` applies the
# framework's; the assistant adds memory, the inbox, the hooks, the chat tables and its own), once per
# line read: a release's migrations, applied again later, in one process (its imports take seconds).
_MIGRATE = """
import asyncio, sys
from bastion.assistant.database import Database, migrate
dsn = sys.argv[1]
for _ in sys.stdin:
    applied = asyncio.run(migrate(Database(app_conninfo=dsn, admin_conninfo=dsn), grant_app_role=False))
    print(" ".join(version.replace(" ", ":") for version in applied), flush=True)
"""


class PreviousReleaseUnavailable(RuntimeError):
    """The previous release cannot be extracted; the message says why (a skip reason)."""


def previous_release_tree(into: Path) -> Path:
    """The previous release's files under `into` (extracted once); raises `PreviousReleaseUnavailable`."""
    tree = into / PREVIOUS_RELEASE[:12]
    if (tree / "src" / "bastion").is_dir():
        return tree
    try:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", PREVIOUS_RELEASE],
            capture_output=True,
            check=False,
            timeout=120,
        )
    except FileNotFoundError:
        raise PreviousReleaseUnavailable("git is not installed") from None
    if archive.returncode != 0:
        why = "a shallow clone" if _git("rev-parse", "--is-shallow-repository") == "true" else "not found"
        raise PreviousReleaseUnavailable(
            f"the previous release ({PREVIOUS_RELEASE[:12]}) is not in this checkout's git history "
            f"({why}: {archive.stderr.decode(errors='replace').strip()[:200]}); "
            "clone the repository with its history (git fetch --unshallow) to run the rolling-deploy tests"
        )
    tree.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False, timeout=30)
    return done.stdout.decode(errors="replace").strip()


def release_env(tree: Path) -> dict[str, str]:
    """An environment whose `bastion` and `tests` are the release's in `tree`."""
    return {**os.environ, "PYTHONPATH": f"{tree / 'src'}:{tree}"}


@contextlib.contextmanager
def migrator(tree: Path, dsn: str) -> Iterator[Callable[[], list[str]]]:
    """Apply the migrations of the release in `tree` to `dsn` (as its owner) each time the callable is
    called, in a process of its own; it returns the versions applied, as `component:version`."""
    with subprocess.Popen(
        [sys.executable, "-c", _MIGRATE, dsn],
        cwd=tree,
        env=release_env(tree),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        stdin, stdout, stderr = process.stdin, process.stdout, process.stderr

        def migrate() -> list[str]:
            stdin.write("\n")
            stdin.flush()
            line = stdout.readline()
            if not line:
                raise AssertionError(f"Migrating with {tree.name} failed: {stderr.read()}")
            return line.split()

        try:
            yield migrate
        finally:
            stdin.close()
            process.wait(timeout=60)
