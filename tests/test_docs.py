"""The documentation site builds strictly, and every Python block in it and in the README type-checks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```(?:python|py)\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)


def documented_pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def python_blocks() -> list[tuple[str, str]]:
    """Each Python block as (a module name naming its page and place, its code)."""
    blocks = []
    for page in documented_pages():
        stem = re.sub(r"\W", "_", str(page.relative_to(ROOT).with_suffix("")))
        for index, code in enumerate(BLOCK.findall(page.read_text())):
            blocks.append((f"doc_{stem}_{index}", code))
    return blocks


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    """A broken link, a missing page or a reference to a name that does not exist fails the build."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "reference" / "chat" / "index.html").is_file()


def test_the_pages_have_python_examples() -> None:
    """Guards the check below against finding nothing to check."""
    pages = {name.rsplit("_", 1)[0] for name, _ in python_blocks()}
    assert len(pages) >= 10, pages


def test_every_python_block_type_checks(tmp_path: Path) -> None:
    """Each block is a module of its own, checked by mypy with the project's strict settings."""
    files = []
    for name, code in python_blocks():
        path = tmp_path / f"{name}.py"
        path.write_text(code)
        files.append(str(path))
    checked = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
