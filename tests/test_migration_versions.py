"""Each migration component numbers its files once: two branches that both add version N must not both
land, since a database records one migration per version and would skip the other."""

from __future__ import annotations

from collections import Counter

import pytest

from bastion.stores import available_migrations

COMPONENTS = [
    ("bastion.stores", "migrations"),
    ("bastion.stores", "sqlite_migrations"),
    ("bastion.hooks", "migrations"),
    ("bastion.hooks", "chat_migrations"),
    ("bastion.inbox", "migrations"),
    ("bastion.memory", "migrations"),
    ("bastion.assistant", "migrations"),
]


@pytest.mark.parametrize(("package", "directory"), COMPONENTS)
def test_every_migration_version_is_used_once(package: str, directory: str) -> None:
    migrations = available_migrations(package, directory)
    assert migrations, f"{package}/{directory} has no migrations: is the list above out of date?"
    repeated = {version for version, count in Counter(m.version for m in migrations).items() if count > 1}
    assert not repeated, f"{package}/{directory} numbers more than one migration {sorted(repeated)}"
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))
