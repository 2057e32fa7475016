"""Skills: a validated catalog whose loader reads only registered skills, each time anew."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from bastion.skills import DEFAULT_SKILL_TOOL_NAME, Skill, SkillCatalog, create_skill_catalog
from bastion.tools import Tool, ToolCall, ToolInputError

SECRET_CONTENT = "Step 1: open the vault with code 4711."


def content(text: str) -> Callable[[], Awaitable[str]]:
    async def load() -> str:
        return text

    return load


def skill(
    name: str = "pdf-forms", description: str = "Fill in PDF forms.", text: str = SECRET_CONTENT
) -> Skill:
    return Skill(name=name, description=description, load=content(text))


def catalog(*skills: Skill, tool_name: str = DEFAULT_SKILL_TOOL_NAME) -> SkillCatalog:
    return create_skill_catalog(skills or (skill(),), tool_name=tool_name)


async def load(loader: Tool, name: Any, *, call_id: str = "call-1") -> Any:
    """Call the loader's executor directly, bypassing schema validation as a forged call would."""
    assert loader.execute is not None
    pending = loader.execute(ToolCall(tool_name=loader.name, input={"name": name}, tool_call_id=call_id))
    assert inspect.isawaitable(pending)
    return await pending


# Validation


def test_catalog_needs_at_least_one_skill() -> None:
    with pytest.raises(ValueError, match="at least one skill"):
        create_skill_catalog([])


def test_catalog_refuses_duplicate_names() -> None:
    with pytest.raises(ValueError, match="Duplicate skill name: 'pdf-forms'"):
        create_skill_catalog([skill("pdf-forms"), skill("sql"), skill("pdf-forms")])


@pytest.mark.parametrize("name", ["pdf", "pdf-forms", "sql_queries", "v2", "a1-b2_c3"])
def test_catalog_accepts_lower_case_kebab_and_snake_names(name: str) -> None:
    assert catalog(skill(name)).skills[0].name == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "PDF",
        "Pdf-forms",
        "pdf forms",
        "-pdf",
        "pdf-",
        "pdf--forms",
        "../x",
        "a/b",
        "pdf.md",
        "__proto__",
        "émoji",
    ],
)
def test_catalog_refuses_malformed_names(name: str) -> None:
    with pytest.raises(ValueError, match="Skill name"):
        create_skill_catalog([skill(name)])


def test_catalog_refuses_a_name_with_a_trailing_newline() -> None:
    with pytest.raises(ValueError, match="Skill name"):
        create_skill_catalog([skill("pdf\n")])


def test_catalog_refuses_a_non_string_name() -> None:
    with pytest.raises(ValueError, match="Skill name"):
        create_skill_catalog([Skill(name=7, description="Seven.", load=content("x"))])  # type: ignore[arg-type]


@pytest.mark.parametrize("description", ["", "   ", "\n\t"])
def test_catalog_refuses_blank_descriptions(description: str) -> None:
    with pytest.raises(ValueError, match="description"):
        create_skill_catalog([skill(description=description)])


def test_catalog_refuses_a_non_string_description() -> None:
    with pytest.raises(ValueError, match="description"):
        create_skill_catalog([Skill(name="pdf", description=None, load=content("x"))])  # type: ignore[arg-type]


def test_catalog_refuses_a_skill_without_a_callable_load() -> None:
    with pytest.raises(ValueError, match="load"):
        create_skill_catalog([Skill(name="pdf", description="PDF.", load="file.md")])  # type: ignore[arg-type]


def test_catalog_refuses_an_invalid_loader_tool_name() -> None:
    with pytest.raises(ValueError, match="Tool name"):
        create_skill_catalog([skill()], tool_name="load skill")


def test_catalog_accepts_any_iterable_of_skills() -> None:
    built = create_skill_catalog(skill(name) for name in ("pdf", "sql"))

    assert [item.name for item in built.skills] == ["pdf", "sql"]


# Instructions


def test_instructions_list_each_skills_name_and_description() -> None:
    built = catalog(skill("pdf-forms", "Fill in PDF forms."), skill("sql", "Write safe SQL."))

    assert "- pdf-forms: Fill in PDF forms." in built.instructions
    assert "- sql: Write safe SQL." in built.instructions


def test_instructions_name_the_loader_tool() -> None:
    assert "`load_skill`" in catalog().instructions


def test_instructions_never_contain_skill_content() -> None:
    loaded: list[str] = []

    async def tracked() -> str:
        loaded.append("pdf")
        return SECRET_CONTENT

    built = create_skill_catalog([Skill(name="pdf", description="PDF.", load=tracked)])

    assert SECRET_CONTENT not in built.instructions
    assert loaded == []


def test_instructions_strip_surrounding_whitespace_from_descriptions() -> None:
    assert (
        "- pdf: Fill in PDF forms.\n"
        in catalog(skill("pdf", "  Fill in PDF forms.\n"), skill("sql")).instructions
    )


# The loader tool


def test_loader_is_named_load_skill_by_default() -> None:
    assert catalog().loader().name == "load_skill"


def test_loader_can_be_renamed() -> None:
    built = catalog(tool_name="load_knowledge")

    assert built.loader().name == "load_knowledge"
    assert "`load_knowledge`" in built.instructions
    assert "load_skill" not in built.instructions


def test_loader_schema_is_an_enum_of_the_registered_names() -> None:
    loader = catalog(skill("pdf-forms"), skill("sql")).loader()

    assert loader.input_schema == {
        "type": "object",
        "properties": {"name": {"type": "string", "enum": ["pdf-forms", "sql"]}},
        "required": ["name"],
        "additionalProperties": False,
    }


def test_loader_does_not_need_approval() -> None:
    assert catalog().loader().needs_approval is False


async def test_loader_returns_the_name_and_content_of_the_requested_skill() -> None:
    loader = catalog(skill("pdf", text="PDF guidance."), skill("sql", text="SQL guidance.")).loader()

    assert await load(loader, "sql") == {"name": "sql", "content": "SQL guidance."}


@pytest.mark.parametrize(
    "name",
    [
        "unknown",
        "../x",
        "../../etc/passwd",
        "__proto__",
        "constructor",
        "toString",
        "PDF",
        "pdf ",
        "",
        None,
        7,
    ],
)
async def test_loader_rejects_names_that_are_not_registered(name: Any) -> None:
    loader = catalog(skill("pdf")).loader()

    with pytest.raises(ToolInputError, match="Unknown skill"):
        await load(loader, name)


async def test_loader_rejects_input_that_is_not_an_object() -> None:
    loader = catalog(skill("pdf")).loader()
    assert loader.execute is not None
    pending = loader.execute(ToolCall(tool_name="load_skill", input="pdf", tool_call_id="call-1"))
    assert inspect.isawaitable(pending)

    with pytest.raises(ToolInputError, match="Unknown skill"):
        await pending


@pytest.mark.parametrize("name", ["unknown", "../x", "__proto__", "constructor", 7])
def test_loader_check_input_refuses_names_that_are_not_registered(name: Any) -> None:
    loader = catalog(skill("pdf")).loader()

    with pytest.raises(ToolInputError, match="name"):
        loader.check_input({"name": name})


def test_loader_check_input_refuses_extra_keys() -> None:
    loader = catalog(skill("pdf")).loader()

    with pytest.raises(ToolInputError, match="path"):
        loader.check_input({"name": "pdf", "path": "../x"})


def test_loader_check_input_accepts_a_registered_name() -> None:
    assert catalog(skill("pdf")).loader().check_input({"name": "pdf"}) == {"name": "pdf"}


async def test_loader_runs_load_on_every_call() -> None:
    versions = iter(["first version", "second version"])

    async def changing() -> str:
        return next(versions)

    loader = create_skill_catalog([Skill(name="pdf", description="PDF.", load=changing)]).loader()

    assert (await load(loader, "pdf"))["content"] == "first version"
    assert (await load(loader, "pdf"))["content"] == "second version"


async def test_loader_loads_only_the_requested_skill() -> None:
    loaded: list[str] = []

    def tracked(name: str) -> Callable[[], Awaitable[str]]:
        async def load_skill() -> str:
            loaded.append(name)
            return name

        return load_skill

    built = create_skill_catalog(
        [Skill(name=name, description=f"{name}.", load=tracked(name)) for name in ("pdf", "sql")]
    )

    await load(built.loader(), "sql")

    assert loaded == ["sql"]


async def test_loader_propagates_a_failing_load() -> None:
    async def broken() -> str:
        raise OSError("disk unavailable")

    loader = create_skill_catalog([Skill(name="pdf", description="PDF.", load=broken)]).loader()

    with pytest.raises(OSError, match="disk unavailable"):
        await load(loader, "pdf")


async def test_catalogs_are_isolated() -> None:
    first = catalog(skill("pdf", text="first catalog"))
    second = catalog(skill("pdf", text="second catalog"), skill("sql", text="only second"))

    assert (await load(first.loader(), "pdf"))["content"] == "first catalog"
    assert (await load(second.loader(), "pdf"))["content"] == "second catalog"
    with pytest.raises(ToolInputError, match="Unknown skill"):
        await load(first.loader(), "sql")


async def test_catalog_is_not_changed_by_the_list_it_was_built_from() -> None:
    skills = [skill("pdf")]
    built = create_skill_catalog(skills)
    skills.append(skill("sql"))

    with pytest.raises(ToolInputError, match="Unknown skill"):
        await load(built.loader(), "sql")
    assert "sql" not in built.instructions
