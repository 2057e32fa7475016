"""Both stores implement the one `Store` protocol the chat package asks for, with its signatures."""

from __future__ import annotations

import inspect

import pytest

from bastion.chat import ChatStore, ConversationStore, RunStore
from bastion.stores import PostgresStore, SqliteStore, Store

MEMBERS = sorted(name for name in vars(Store) if not name.startswith("_") and name not in {"schema"})


def test_the_chat_package_asks_every_store_for_the_one_protocol() -> None:
    assert ChatStore is Store and ConversationStore is Store and RunStore is Store


@pytest.mark.parametrize("store", [PostgresStore, SqliteStore], ids=["postgres", "sqlite"])
@pytest.mark.parametrize("member", MEMBERS)
def test_a_store_accepts_every_argument_the_protocol_declares(store: type, member: str) -> None:
    declared = inspect.signature(getattr(Store, member)).parameters
    implemented = inspect.signature(getattr(store, member)).parameters
    for name, parameter in declared.items():
        assert name in implemented, f"{store.__name__}.{member} lacks {name}"
        assert implemented[name].kind == parameter.kind, f"{store.__name__}.{member}({name})"
        assert implemented[name].default == parameter.default, f"{store.__name__}.{member}({name})"
    assert inspect.iscoroutinefunction(getattr(store, member)) == inspect.iscoroutinefunction(
        getattr(Store, member)
    )


def test_the_protocol_covers_the_entity_api_and_persistence() -> None:
    assert {"create_conversation", "list_conversations", "get_conversation", "persistence"} <= set(MEMBERS)
    assert isinstance(inspect.getattr_static(Store, "schema"), property)
