"""A small application for the entity tests: projects that belong to tenants, conversations in projects,
and a typed conversation state. Its migrations run after bastion's, as an application's would."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pydantic

from bastion.stores import (
    AppColumn,
    ConversationSchema,
    Migration,
    apply_application_migrations,
    apply_migrations,
)
from tests.pg import PostgresCluster

POSTGRES_PROJECTS = Migration(
    1,
    "projects",
    """
create schema app;
grant usage on schema app to authenticated;

create table app.projects (
  id uuid primary key default gen_random_uuid(),
  tenant_id text not null,
  name text not null
);
alter table app.projects enable row level security;
alter table app.projects force row level security;
grant select on app.projects to authenticated;
create policy projects_in_tenant on app.projects for select to authenticated
  using (tenant_id = (select bastion.tenant_id()));

alter table bastion.conversations add column project_id uuid references app.projects (id);
create index conversations_project on bastion.conversations (project_id);
grant insert (project_id) on bastion.conversations to authenticated;

-- A conversation in a project is scoped through the project's tenant, on top of bastion's own rules:
-- a restrictive policy can only narrow what the owner policy allows.
create policy conversations_in_project_tenant on bastion.conversations
  as restrictive for all to authenticated
  using (project_id is null or exists (
    select 1 from app.projects p where p.id = project_id and p.tenant_id = (select bastion.tenant_id())
  ))
  with check (project_id is null or exists (
    select 1 from app.projects p where p.id = project_id and p.tenant_id = (select bastion.tenant_id())
  ));
create policy messages_in_visible_conversation on bastion.messages
  as restrictive for select to authenticated
  using (exists (select 1 from bastion.conversations c where c.id = conversation_id));
""",
)

SQLITE_PROJECTS = Migration(
    1,
    "projects",
    """
create table projects (id text primary key, tenant_id text, name text not null) strict;
alter table bastion_conversations add column project_id text references projects (id);
""",
)


class TaskState(pydantic.BaseModel):
    step: int
    notes: list[str] = []


@dataclass
class Checklist:
    done: list[str]
    due: str | None = None


SCHEMA = ConversationSchema(state=TaskState, columns=[AppColumn("project_id", "uuid")])


def projects_database(cluster: PostgresCluster) -> str:
    """A fresh database with bastion's migrations, then the application's."""
    name = cluster.database("entities")
    dsn = cluster.dsn(name)

    async def migrate() -> None:
        await apply_migrations(dsn)
        await apply_application_migrations(dsn, component="projects", migrations=[POSTGRES_PROJECTS])

    # On its own thread: a fixture may be set up while a test's event loop is running.
    with ThreadPoolExecutor(max_workers=1) as thread:
        thread.submit(asyncio.run, migrate()).result()
    cluster.create_login_roles()
    return name
