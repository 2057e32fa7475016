-- Postgres's 0006 for SQLite. Operations are keyed by their operation key (the provider's call id
-- is kept for events): an old row run after an approval gets that approval's key, any other old row
-- a `legacy/` key no new call can produce. Runs record the worker (store instance) running them, so
-- a claim that meets a run of a worker that is not alive replaces it at once.

create table bastion_tool_executions_keyed (
  conversation_id text not null,
  operation_key text not null check (length(operation_key) between 1 and 200),
  tool_call_id text not null check (length(tool_call_id) between 1 and 200),
  run_id text not null,
  owner_id text not null,
  tenant_id text,
  tool_name text not null check (length(tool_name) between 1 and 200),
  input text not null check (json_valid(input)),
  status text not null check (status in ('in_flight', 'completed', 'failed')),
  output text check (output is null or json_valid(output)),
  started_at integer not null,
  finished_at integer,
  primary key (conversation_id, operation_key),
  foreign key (conversation_id, owner_id)
    references bastion_conversations (id, owner_id) on delete cascade
) strict;

insert into bastion_tool_executions_keyed (
  conversation_id, operation_key, tool_call_id, run_id, owner_id, tenant_id, tool_name, input, status,
  output, started_at, finished_at
)
select
  t.conversation_id,
  coalesce(
    (select 'approval/' || json_extract(p.value, '$.approval.id')
       from bastion_messages m, json_each(m.message, '$.parts') p
      where m.conversation_id = t.conversation_id
        and json_extract(p.value, '$.toolCallId') = t.tool_call_id
        and json_extract(p.value, '$.approval.approved') = 1
        and json_type(p.value, '$.approval.approved') = 'true'
        and length(json_extract(p.value, '$.approval.id')) between 1 and 80
      order by m.seq desc
      limit 1),
    'legacy/' || t.tool_call_id
  ),
  t.tool_call_id, t.run_id, t.owner_id, t.tenant_id, t.tool_name, t.input, t.status, t.output,
  t.started_at, t.finished_at
from bastion_tool_executions t;

drop table bastion_tool_executions;
alter table bastion_tool_executions_keyed rename to bastion_tool_executions;

alter table bastion_runs add column worker_key integer;
