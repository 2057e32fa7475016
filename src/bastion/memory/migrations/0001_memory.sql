-- Memory: core memory, archival memories (facts with embeddings), tenant knowledge and versioned
-- documents (the agent's own notes, and the per-operation recall records), each under the same
-- row-level security as conversations: a user reaches only their own rows inside their tenant, and
-- knowledge only inside their tenant. Applied as the `memory` component, after bastion's migrations.
--
-- Embeddings are `vector` without a fixed dimension, with the model that made them on every row:
-- rows of different models are never compared. Recall does not depend on an approximate index: it
-- scans the caller's own rows (a btree the policy can use) inside a subquery fenced by `offset 0`,
-- so no ORDER BY reaches an index, computes each distance there, and orders them exactly; only the
-- k nearest rows are read again for their text. k visible rows always give k results, whatever
-- HNSW index an application adds.
--
-- Error codes (SQLSTATE): BS403 forbidden write.

create extension if not exists vector;

-- Small, always in context: one text per label (`user`, `persona`, ...) per user and scope.
create table bastion.memory_core (
  owner_id uuid not null default auth.uid(),
  tenant_id text default bastion.tenant_id(),
  scope text not null check (char_length(scope) between 1 and 100),
  label text not null check (char_length(label) between 1 and 100),
  content text not null check (char_length(content) <= 4000),
  updated_at timestamptz not null default now(),
  unique nulls not distinct (owner_id, tenant_id, scope, label)
);

-- Archival memories. Every version is a row; versions of one memory share `memory_id`, and the
-- current one has `superseded_at` null. A near-duplicate write supersedes the closest memory
-- instead of adding another (see `remember_memory`), so its history stays readable.
create table bastion.memories (
  id uuid primary key default gen_random_uuid(),
  memory_id uuid not null,
  owner_id uuid not null default auth.uid(),
  tenant_id text default bastion.tenant_id(),
  scope text not null check (char_length(scope) between 1 and 100),
  content text not null check (char_length(content) between 1 and 2000),
  content_hash text not null check (char_length(content_hash) = 64),
  embedding vector not null,
  embedding_model text not null check (char_length(embedding_model) between 1 and 200),
  source text not null check (source in ('tool', 'extract', 'api')),
  created_at timestamptz not null default now(),
  superseded_at timestamptz,
  superseded_by uuid
);
-- The exact path: the policy's `owner_id = (select auth.uid())` is an index condition here.
create index memories_owner_recall on bastion.memories (owner_id, scope, embedding_model)
  where superseded_at is null;
create index memories_lineage on bastion.memories (memory_id, created_at);
create unique index memories_one_current on bastion.memories (memory_id) where superseded_at is null;
create unique index memories_no_duplicates on bastion.memories (owner_id, tenant_id, scope, content_hash)
  nulls not distinct where superseded_at is null;

-- Knowledge: documents shared by every member of a tenant, in named collections, stored as chunks.
-- Rows without a tenant cannot exist, so a user without a tenant reads no knowledge.
create table bastion.knowledge_documents (
  id uuid primary key default gen_random_uuid(),
  tenant_id text not null default bastion.tenant_id(),
  collection text not null check (char_length(collection) between 1 and 100),
  title text not null check (char_length(title) between 1 and 500),
  created_by uuid not null default auth.uid(),
  created_at timestamptz not null default now(),
  unique (id, tenant_id)
);

create table bastion.knowledge_chunks (
  id bigint generated always as identity primary key,
  document_id uuid not null,
  tenant_id text not null default bastion.tenant_id(),
  collection text not null check (char_length(collection) between 1 and 100),
  seq integer not null check (seq >= 0),
  content text not null check (char_length(content) between 1 and 8000),
  embedding vector not null,
  embedding_model text not null check (char_length(embedding_model) between 1 and 200),
  unique (document_id, seq),
  foreign key (document_id, tenant_id)
    references bastion.knowledge_documents (id, tenant_id) on delete cascade
);
create index knowledge_chunks_recall on bastion.knowledge_chunks (tenant_id, collection, embedding_model);

-- Versioned documents: the agent's own notes, and recall records (scope `bastion-ops`) that expire.
create table bastion.memory_documents (
  owner_id uuid not null default auth.uid(),
  tenant_id text default bastion.tenant_id(),
  scope text not null check (char_length(scope) between 1 and 100),
  path text not null check (char_length(path) between 1 and 500),
  content text not null check (char_length(content) <= 1000000),
  version bigint not null default 1 check (version > 0),
  expires_at timestamptz,
  updated_at timestamptz not null default now(),
  unique nulls not distinct (owner_id, tenant_id, scope, path)
);
create index memory_documents_expiry on bastion.memory_documents (expires_at) where expires_at is not null;

revoke all on bastion.memory_core, bastion.memories, bastion.knowledge_documents,
  bastion.knowledge_chunks, bastion.memory_documents from public, anon, authenticated;
grant select, delete on bastion.memory_core, bastion.memories, bastion.memory_documents to authenticated;
grant insert (scope, label, content) on bastion.memory_core to authenticated;
grant update (content, updated_at) on bastion.memory_core to authenticated;
grant insert (id, memory_id, scope, content, content_hash, embedding, embedding_model, source)
  on bastion.memories to authenticated;
grant update (superseded_at, superseded_by) on bastion.memories to authenticated;
grant insert (scope, path, content, version, expires_at) on bastion.memory_documents to authenticated;
grant update (content, version, expires_at, updated_at) on bastion.memory_documents to authenticated;
grant select, delete on bastion.knowledge_documents, bastion.knowledge_chunks to authenticated;
grant insert (id, collection, title) on bastion.knowledge_documents to authenticated;
grant insert (document_id, collection, seq, content, embedding, embedding_model)
  on bastion.knowledge_chunks to authenticated;
grant all on bastion.memory_core, bastion.memories, bastion.knowledge_documents,
  bastion.knowledge_chunks, bastion.memory_documents to service_role;

alter table bastion.memory_core enable row level security;
alter table bastion.memory_core force row level security;
alter table bastion.memories enable row level security;
alter table bastion.memories force row level security;
alter table bastion.knowledge_documents enable row level security;
alter table bastion.knowledge_documents force row level security;
alter table bastion.knowledge_chunks enable row level security;
alter table bastion.knowledge_chunks force row level security;
alter table bastion.memory_documents enable row level security;
alter table bastion.memory_documents force row level security;

create policy memory_core_owner on bastion.memory_core for all to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()))
  with check (
    owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id())
  );

create policy memories_owner on bastion.memories for all to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()))
  with check (
    owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id())
  );

create policy memory_documents_owner on bastion.memory_documents for all to authenticated
  using (owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id()))
  with check (
    owner_id = (select auth.uid()) and tenant_id is not distinct from (select bastion.tenant_id())
  );

-- Every member of a tenant reads its knowledge; only the application server writes or deletes it
-- (a member of `bastion_runtime`, which decides who may), and only inside the caller's tenant.
create policy knowledge_documents_tenant_read on bastion.knowledge_documents for select to authenticated
  using (tenant_id = (select bastion.tenant_id()));
create policy knowledge_documents_runtime_insert on bastion.knowledge_documents for insert to authenticated
  with check (
    tenant_id = (select bastion.tenant_id())
    and created_by = (select auth.uid())
    and (select pg_has_role(session_user, 'bastion_runtime', 'MEMBER'))
  );
create policy knowledge_documents_runtime_delete on bastion.knowledge_documents for delete to authenticated
  using (
    tenant_id = (select bastion.tenant_id()) and (select pg_has_role(session_user, 'bastion_runtime', 'MEMBER'))
  );
create policy knowledge_chunks_tenant_read on bastion.knowledge_chunks for select to authenticated
  using (tenant_id = (select bastion.tenant_id()));
create policy knowledge_chunks_runtime_insert on bastion.knowledge_chunks for insert to authenticated
  with check (
    tenant_id = (select bastion.tenant_id()) and (select pg_has_role(session_user, 'bastion_runtime', 'MEMBER'))
  );
create policy knowledge_chunks_runtime_delete on bastion.knowledge_chunks for delete to authenticated
  using (
    tenant_id = (select bastion.tenant_id()) and (select pg_has_role(session_user, 'bastion_runtime', 'MEMBER'))
  );

-- Remember a fact for the caller, deduplicated, in one statement under the caller's row-level
-- security: the same normalized text (`p_hash`) is the memory already there; a current memory at
-- least `p_threshold` cosine-similar is superseded by the new text (same `memory_id`, a new
-- version); anything else is a new memory. Writes of one user and scope are serialized, so two
-- concurrent writes of one fact still make one memory. Returns `{outcome, memory_id}`, the outcome
-- being `created`, `duplicate` or `updated`.
create function bastion.remember_memory(
  p_scope text,
  p_content text,
  p_hash text,
  p_embedding vector,
  p_model text,
  p_threshold double precision,
  p_source text
) returns jsonb
  language plpgsql
  set search_path = pg_catalog, public, extensions
  as $$
declare
  v_user uuid := auth.uid();
  v_memory uuid;
  v_version uuid;
  v_similarity double precision;
  v_new uuid := gen_random_uuid();
begin
  if v_user is null then
    raise exception 'memory needs a signed-in user' using errcode = 'BS403';
  end if;
  perform pg_advisory_xact_lock(
    hashtextextended(concat_ws('/', 'bastion.memory', v_user, bastion.tenant_id(), p_scope), 0)
  );
  select m.memory_id into v_memory from bastion.memories m
   where m.scope = p_scope and m.content_hash = p_hash and m.superseded_at is null;
  if found then
    return jsonb_build_object('outcome', 'duplicate', 'memory_id', v_memory);
  end if;
  select mine.id, mine.memory_id, 1 - mine.distance into v_version, v_memory, v_similarity
    from (
      select m.id, m.memory_id, m.embedding <=> p_embedding as distance from bastion.memories m
       where m.scope = p_scope and m.embedding_model = p_model and m.superseded_at is null
      offset 0
    ) mine
   order by mine.distance limit 1;
  if v_version is not null and v_similarity >= p_threshold then
    update bastion.memories set superseded_at = now(), superseded_by = v_new where id = v_version;
  else
    v_memory := v_new;
  end if;
  insert into bastion.memories (id, memory_id, scope, content, content_hash, embedding, embedding_model, source)
  values (v_new, v_memory, p_scope, p_content, p_hash, p_embedding, p_model, p_source);
  return jsonb_build_object(
    'outcome', case when v_memory = v_new then 'created' else 'updated' end, 'memory_id', v_memory
  );
end
$$;

-- The memory context of one operation (a turn's step), recalled once and stored: a later call with
-- the same `p_operation` returns the stored answer, so a replayed step sees the same rows even after
-- new memories were added. The answer is the caller's core memory, their `p_k` current memories
-- nearest `p_query`, and the `p_k` chunks of their tenant's `p_collections` nearest it, each ordered
-- exactly over the rows the caller can see. The record expires after `p_ttl`.
create function bastion.recall_memory(
  p_operation text,
  p_scope text,
  p_query vector,
  p_model text,
  p_k integer,
  p_collections text[],
  p_ttl interval
) returns jsonb
  language plpgsql
  set search_path = pg_catalog, public, extensions
  as $$
declare
  v_path text := 'recall/' || p_scope || '/' || p_operation;
  v_answer jsonb;
  v_stored text;
begin
  if auth.uid() is null then
    raise exception 'memory needs a signed-in user' using errcode = 'BS403';
  end if;
  select d.content into v_stored from bastion.memory_documents d
   where d.scope = 'bastion-ops' and d.path = v_path and (d.expires_at is null or d.expires_at > now());
  if found then
    return v_stored::jsonb || jsonb_build_object('replayed', true);
  end if;
  if p_query is null then
    return null;
  end if;
  with nearest as (
    select mine.id, mine.distance from (
      select m.id, m.embedding <=> p_query as distance from bastion.memories m
       where m.scope = p_scope and m.embedding_model = p_model and m.superseded_at is null
      offset 0
    ) mine
    order by mine.distance limit p_k
  ), chunks as (
    select shared.id, shared.distance from (
      select c.id, c.embedding <=> p_query as distance from bastion.knowledge_chunks c
       where c.collection = any (coalesce(p_collections, '{}')) and c.embedding_model = p_model
      offset 0
    ) shared
    order by shared.distance limit p_k
  )
  select jsonb_build_object(
    'core', coalesce(
      (select jsonb_object_agg(c.label, c.content order by c.label) from bastion.memory_core c
        where c.scope = p_scope),
      '{}'::jsonb
    ),
    'memories', coalesce(
      (select jsonb_agg(
         jsonb_build_object('id', m.memory_id, 'text', m.content, 'similarity', 1 - n.distance)
         order by n.distance
       ) from nearest n join bastion.memories m on m.id = n.id),
      '[]'::jsonb
    ),
    'knowledge', coalesce(
      (select jsonb_agg(
         jsonb_build_object(
           'document_id', c.document_id, 'title', d.title, 'seq', c.seq, 'text', c.content,
           'similarity', 1 - k.distance
         ) order by k.distance
       ) from chunks k
         join bastion.knowledge_chunks c on c.id = k.id
         join bastion.knowledge_documents d on d.id = c.document_id),
      '[]'::jsonb
    )
  ) into v_answer;
  insert into bastion.memory_documents (scope, path, content, expires_at)
  values ('bastion-ops', v_path, v_answer::text, now() + p_ttl)
  on conflict (owner_id, tenant_id, scope, path) do update
    set content = excluded.content, version = bastion.memory_documents.version + 1,
        expires_at = excluded.expires_at, updated_at = now()
    where bastion.memory_documents.expires_at <= now()
  returning content into v_stored;
  if v_stored is null then
    -- Another call for the same operation stored its answer first: that one is the answer.
    select d.content into v_stored from bastion.memory_documents d
     where d.scope = 'bastion-ops' and d.path = v_path;
    return v_stored::jsonb || jsonb_build_object('replayed', true);
  end if;
  return v_answer || jsonb_build_object('replayed', false);
end
$$;

-- Delete every expired document (recall records after their 7 days) of every user. Only the
-- application server (a member of `bastion_runtime`) may; it runs without any user's identity.
create function bastion.purge_memory_documents() returns bigint
  language plpgsql
  security definer
  set search_path = ''
  as $$
declare
  v_count bigint;
begin
  if not pg_has_role(session_user, 'bastion_runtime', 'MEMBER') then
    raise exception 'only the application server may purge' using errcode = 'BS403';
  end if;
  delete from bastion.memory_documents d where d.expires_at <= now();
  get diagnostics v_count = row_count;
  return v_count;
end
$$;

revoke execute on function
  bastion.remember_memory(text, text, text, vector, text, double precision, text),
  bastion.recall_memory(text, text, vector, text, integer, text[], interval),
  bastion.purge_memory_documents()
  from public;
grant execute on function
  bastion.remember_memory(text, text, text, vector, text, double precision, text),
  bastion.recall_memory(text, text, vector, text, integer, text[], interval)
  to authenticated;
grant execute on function bastion.purge_memory_documents() to bastion_runtime;
