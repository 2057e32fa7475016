"""The application's database role: created or granted by `grant_application_role`, refused when
row-level security could not bind it, and granted by `bastion migrate` only when asked."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest

from bastion.stores import ApplicationRoleError, PostgresStore, StoreIdentity, grant_application_role
from tests.conftest import MigratedDatabase
from tests.pg import PostgresCluster

ROOT = Path(__file__).resolve().parent.parent


def fresh_role_name() -> str:
    return f"app_{uuid.uuid4().hex[:12]}"


def role_facts(admin_dsn: str, role: str) -> tuple[bool, bool, bool, bool] | None:
    """(login, bypassrls, member of authenticated, member of bastion_runtime), or None when absent."""
    with psycopg.connect(admin_dsn) as conn:
        row = conn.execute(
            "select rolcanlogin, rolbypassrls, pg_has_role(oid, 'authenticated', 'member'),"
            " pg_has_role(oid, 'bastion_runtime', 'member') from pg_roles where rolname = %s",
            (role,),
        ).fetchone()
    return None if row is None else (row[0], row[1], row[2], row[3])


async def test_a_created_role_logs_in_without_bypassrls_and_rls_binds_it(
    migrated_database: MigratedDatabase,
) -> None:
    role = fresh_role_name()
    assert await grant_application_role(migrated_database.admin_dsn, role, create=True) is True
    assert role_facts(migrated_database.admin_dsn, role) == (True, False, True, True)
    assert await grant_application_role(migrated_database.admin_dsn, role, create=True) is False
    dsn = migrated_database.cluster.dsn(migrated_database.name, user=role)
    async with await PostgresStore.open(dsn) as store:
        alice, bob = StoreIdentity(user_id=str(uuid.uuid4())), StoreIdentity(user_id=str(uuid.uuid4()))
        mine = await store.create_conversation(alice, title="mine")
        assert [c.id for c in await store.list_conversations(alice)] == [mine.id]
        assert await store.list_conversations(bob) == []


async def test_an_existing_role_is_granted_and_a_missing_one_is_not_created_unasked(
    migrated_database: MigratedDatabase,
) -> None:
    missing = fresh_role_name()
    with pytest.raises(ApplicationRoleError, match="does not exist"):
        await grant_application_role(migrated_database.admin_dsn, missing)
    assert role_facts(migrated_database.admin_dsn, missing) is None
    existing = fresh_role_name()
    with psycopg.connect(migrated_database.admin_dsn, autocommit=True) as conn:
        conn.execute(f'create role "{existing}" login nobypassrls')
    assert await grant_application_role(migrated_database.admin_dsn, existing) is False
    assert role_facts(migrated_database.admin_dsn, existing) == (True, False, True, True)


@pytest.mark.parametrize("privilege", ["bypassrls", "superuser"])
async def test_a_role_that_row_level_security_cannot_bind_is_refused(
    migrated_database: MigratedDatabase, privilege: str
) -> None:
    role = fresh_role_name()
    with psycopg.connect(migrated_database.admin_dsn, autocommit=True) as conn:
        conn.execute(f'create role "{role}" login {privilege}')
    with pytest.raises(ApplicationRoleError, match="superuser or has BYPASSRLS"):
        await grant_application_role(migrated_database.admin_dsn, role)
    facts = role_facts(migrated_database.admin_dsn, role)
    assert facts is not None and facts[2:] == (privilege == "superuser", privilege == "superuser")


def migrate_command(cluster: PostgresCluster, database: str, role: str, *flags: str) -> str:
    url = f"postgresql:///{database}?host={cluster.socket_dir}&port={cluster.port}"
    done = subprocess.run(
        [sys.executable, "-m", "bastion.cli", "migrate", *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT / "src"),
            "DATABASE_URL": url + "&user=postgres",
            "BASTION_APP_DATABASE_URL": url + f"&user={role}",
        },
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_bastion_migrate_grants_the_app_role_only_when_asked(
    pg_cluster: PostgresCluster, migrated_database: MigratedDatabase
) -> None:
    role = fresh_role_name()
    admin = migrated_database.admin_dsn
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'create role "{role}" login nobypassrls')
    database = pg_cluster.database("migrate")
    said = migrate_command(pg_cluster, database, role)
    assert "applied bastion 0001" in said
    assert role_facts(admin, role) == (True, False, False, False)
    said = migrate_command(pg_cluster, database, role, "--grant-app-role")
    assert "the database is up to date" in said
    assert f"the role {role} may act as users" in said
    assert role_facts(admin, role) == (True, False, True, True)
