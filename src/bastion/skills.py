"""Skills: guidance the model loads on demand, so only names and descriptions sit in the instructions.

The loader tool accepts exactly the registered names (an enum in its schema, checked again on
execution), so it can never be used to read a path or any other name. Nothing is cached: each call
runs the skill's own `load()`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from bastion.tools import Tool, ToolCall, ToolInputError

__all__ = ["DEFAULT_SKILL_TOOL_NAME", "Skill", "SkillCatalog", "create_skill_catalog"]

DEFAULT_SKILL_TOOL_NAME = "load_skill"
_SKILL_NAME = re.compile(r"[a-z0-9]+(?:[-_][a-z0-9]+)*")


@dataclass(frozen=True, kw_only=True)
class Skill:
    """A named piece of guidance. `load()` returns its text when the model asks for it."""

    name: str
    description: str
    load: Callable[[], Awaitable[str]]


@dataclass(frozen=True)
class SkillCatalog:
    """Validated skills and the loader tool that reads them."""

    skills: tuple[Skill, ...]
    tool_name: str

    @property
    def instructions(self) -> str:
        """The catalog as the model sees it: names and descriptions only."""
        lines = [
            f"Skills are available. Load a skill with the `{self.tool_name}` tool before following it.",
            *(f"- {skill.name}: {skill.description.strip()}" for skill in self.skills),
        ]
        return "\n".join(lines)

    def loader(self) -> Tool:
        """The tool that loads one registered skill by name."""
        by_name = {skill.name: skill for skill in self.skills}

        async def load(call: ToolCall) -> dict[str, Any]:
            name = call.input.get("name") if isinstance(call.input, dict) else None
            skill = by_name.get(name) if isinstance(name, str) else None
            if skill is None:
                raise ToolInputError("Unknown skill.")
            return {"name": skill.name, "content": await skill.load()}

        return Tool(
            name=self.tool_name,
            description="Load the guidance of one skill from the catalog in the instructions.",
            input_schema={
                "type": "object",
                "properties": {"name": {"type": "string", "enum": list(by_name)}},
                "required": ["name"],
                "additionalProperties": False,
            },
            execute=load,
        )


def create_skill_catalog(
    skills: Iterable[Skill], *, tool_name: str = DEFAULT_SKILL_TOOL_NAME
) -> SkillCatalog:
    """Validate skills (at least one, unique well-formed names, non-blank descriptions) into a catalog."""
    collected = tuple(skills)
    if not collected:
        raise ValueError("A skill catalog needs at least one skill.")
    seen: set[str] = set()
    for skill in collected:
        if not isinstance(skill.name, str) or not _SKILL_NAME.fullmatch(skill.name):
            raise ValueError(
                f"Skill name {skill.name!r} must be lower-case letters and digits joined by '-' or '_'."
            )
        if skill.name in seen:
            raise ValueError(f"Duplicate skill name: {skill.name!r}")
        if not isinstance(skill.description, str) or not skill.description.strip():
            raise ValueError(f"Skill {skill.name!r} needs a description.")
        if not callable(skill.load):
            raise ValueError(f"Skill {skill.name!r} needs a load() callable.")
        seen.add(skill.name)
    Tool(name=tool_name)  # validates the loader's name before anything uses the catalog
    return SkillCatalog(skills=collected, tool_name=tool_name)
