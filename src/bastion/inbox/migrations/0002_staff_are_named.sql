-- Staff are named, not assumed: a signed-in user staffs their tenant's inbox only when their token's
-- server-controlled `app_metadata.roles` holds `inbox_staff` (`bastion.inbox.INBOX_STAFF_ROLE`). Before,
-- every signed-in user of a tenant was its staff, so with open sign-up anyone could register and read
-- every contact's conversation. Every staff policy reads this function, so they all follow.

create or replace function bastion.inbox_staff_tenant() returns text
  language sql stable
  set search_path = ''
  as $$
    select case
             when auth.uid() is not null
              and jsonb_typeof(auth.jwt() -> 'app_metadata' -> 'roles') = 'array'
              and auth.jwt() -> 'app_metadata' -> 'roles' @> '["inbox_staff"]'::jsonb
             then bastion.tenant_id()
           end
  $$;
