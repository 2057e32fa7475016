"""The application's database role: a login role without BYPASSRLS that may act as users.

`PostgresStore` connects as this role and switches to `authenticated` inside each transaction, so
row-level security always applies; membership in `bastion_runtime` lets it write turns. The grants
are made once, by the database owner, after `apply_migrations` has created those roles.
"""

from __future__ import annotations

from typing import ClassVar

from bastion._extras import missing_extra

try:
    import psycopg
    from psycopg import sql
except ImportError as error:
    raise missing_extra("bastion.stores.grant_application_role", "postgres", error) from error

__all__ = ["ApplicationRoleError", "grant_application_role"]


class ApplicationRoleError(Exception):
    """The role cannot serve as the application's role; the message says what to change."""

    code: ClassVar[str] = "application_role_refused"


async def grant_application_role(admin_conninfo: str, role: str, *, create: bool = False) -> bool:
    """Let `role` run the application: grant it `authenticated` (to act as users) and `bastion_runtime`.

    Connect with `admin_conninfo` as the owner that ran the migrations. A missing role is created as
    `login nobypassrls` when `create` is true (its password, if any, is yours to set), and refused
    otherwise. A superuser or a role with BYPASSRLS is refused: row-level security would not bind
    it. Granting again changes nothing. Returns whether the role was created.
    """
    if not isinstance(role, str) or not role or len(role) > 63:
        raise ValueError("role must be a Postgres role name of 1 to 63 characters")
    identifier = sql.Identifier(role)
    async with await psycopg.AsyncConnection.connect(admin_conninfo, autocommit=True) as conn:
        runtime = await conn.execute("select 1 from pg_roles where rolname = 'bastion_runtime'")
        if await runtime.fetchone() is None:
            raise ApplicationRoleError("The database has no bastion roles yet: apply the migrations first.")
        found = await conn.execute("select rolsuper, rolbypassrls from pg_roles where rolname = %s", (role,))
        row = await found.fetchone()
        created = False
        if row is None:
            if not create:
                raise ApplicationRoleError(
                    f"The role {role!r} does not exist. Create it as a login role without BYPASSRLS "
                    "(create role ... login nobypassrls), or pass create=True."
                )
            await conn.execute(sql.SQL("create role {} login nobypassrls").format(identifier))
            created = True
        elif row[0] or row[1]:
            raise ApplicationRoleError(
                f"The role {role!r} is a superuser or has BYPASSRLS, so row-level security would not "
                "bind it. Use a login role without either."
            )
        await conn.execute(sql.SQL("grant authenticated, bastion_runtime to {}").format(identifier))
        return created
