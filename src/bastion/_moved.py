"""Old import paths that still work: a module whose names moved re-exports each with a warning.

A shim module sets `__getattr__ = moved_names(__name__, {name: new_module, ...}, rest=module)`; each
access to a moved name (`from old import name` included) raises a `DeprecationWarning` naming where to
import it from, and returns the very object that lives there. `rest` is the module the old one became:
its other public names (those outside the old `__all__`) are found there the same way. `renamed` maps
a name that moved under a new name to (new module, new name). `others` answers every other name (a
package's own lazy names), without a warning.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any


def moved_names(
    old_module: str,
    new_homes: Mapping[str, str],
    *,
    rest: str | None = None,
    renamed: Mapping[str, tuple[str, str]] | None = None,
    others: Callable[[str], Any] | None = None,
) -> Callable[[str], Any]:
    """A module `__getattr__` that finds each of `new_homes`' names in its new module, with a warning."""

    def __getattr__(name: str) -> Any:
        if renamed is not None and name in renamed:
            renamed_in, new_name = renamed[name]
            warnings.warn(
                f"{old_module}.{name} was renamed: import {new_name} from {renamed_in}",
                DeprecationWarning,
                stacklevel=2,
            )
            return getattr(importlib.import_module(renamed_in), new_name)
        new_module = new_homes.get(name)
        if new_module is None and rest is not None and not name.startswith("_"):
            new_module = rest if hasattr(importlib.import_module(rest), name) else None
        if new_module is None and others is not None:
            return others(name)
        if new_module is None:
            raise AttributeError(f"module {old_module!r} has no attribute {name!r}")
        warnings.warn(
            f"{old_module}.{name} moved: import it from {new_module}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(new_module), name)

    return __getattr__
