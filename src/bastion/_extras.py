"""Optional parts of bastion come as extras; a module that needs one says which to install.

`import bastion` needs only the core dependencies. A store, the MCP client or the reference
application imports its driver at the top, inside `try`, and turns a missing package into
`MissingExtraError`, an `ImportError` whose message is the command that fixes it.
"""

from __future__ import annotations

from typing import Final

import pydantic_ai.models
from pydantic_ai.models import Model

__all__ = ["MissingExtraError", "infer_model", "missing_extra"]


class MissingExtraError(ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""

    def __init__(self, feature: str, extra: str, missing: str | None) -> None:
        self.feature = feature
        self.extra = extra
        self.missing = missing
        package = f" (the package {missing!r} is missing)" if missing else ""
        command = f"pip install 'bastion[{extra}]'"
        super().__init__(f"{feature} needs bastion's {extra!r} extra{package}: {command}")


def missing_extra(feature: str, extra: str, error: ImportError) -> MissingExtraError:
    """The error to raise, `from error`, when importing an optional package failed."""
    return MissingExtraError(feature, extra, error.name.split(".")[0] if error.name else None)


# pydantic-ai model name prefixes whose provider package comes with one of bastion's extras.
_PROVIDER_EXTRAS: Final = (("openai", "openai"), ("anthropic", "anthropic"))


def infer_model(name: str) -> Model:
    """pydantic-ai's model for a name such as `"openai:gpt-5.4-nano"`; a missing provider names its extra."""
    try:
        return pydantic_ai.models.infer_model(name)
    except ImportError as error:
        provider = name.partition(":")[0]
        for prefix, extra in _PROVIDER_EXTRAS:
            if provider.startswith(prefix):
                raise missing_extra(f"The model {name!r}", extra, error) from error
        raise
