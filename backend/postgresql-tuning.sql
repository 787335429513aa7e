-- FerretDB v1.24.2 tuning for the embedded PostgreSQL cluster (applied by
-- scripts/backend at every start; safe to run again).
--
-- Why: FerretDB stores each collection as a table with one jsonb column
-- (_jsonb) and pushes an equality filter {field: value} down as
--     _jsonb -> $1 @> $2
-- with the field name as a bind parameter.  The only indexes FerretDB makes
-- are btree expression indexes, which cannot serve @>; so without help every
-- GridFS lookup (files by filename or _id, chunks by files_id) reads the whole
-- table.  A GIN index (jsonb_ops) on the same expression can serve @>, but
-- only in a plan built with the parameter values known, hence
-- plan_cache_mode = force_custom_plan for this database.  docs/backends.md
-- has the measurements.
--
-- Tables are created lazily when a collection is first written, under mangled
-- names (fs.files -> fs_files_<8 hex>), so an event trigger indexes each new
-- GridFS table as it is created, and a pass at the end covers existing ones.

SET client_min_messages = warning;

ALTER DATABASE ferretdb SET plan_cache_mode = force_custom_plan;

-- The fields of GridFS queries per table kind: files are found by filename
-- (by-name reads, revisions) and by _id (reads by id); chunks by files_id.
-- Deletes and updates by _id already use FerretDB's own btree _id index.
CREATE OR REPLACE FUNCTION public.gridfsctl_tune_table(tbl oid) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
	rel name;
	nsp name;
	field text;
	fields text[];
BEGIN
	SELECT c.relname, n.nspname INTO rel, nsp
	FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
	WHERE c.oid = tbl AND c.relkind = 'r';
	IF rel IS NULL OR nsp LIKE 'pg\_%' OR nsp = 'information_schema' THEN
		RETURN;
	END IF;
	-- FerretDB data tables have exactly one column, _jsonb.
	IF (SELECT array_agg(attname::text) FROM pg_attribute
	    WHERE attrelid = tbl AND attnum > 0 AND NOT attisdropped) IS DISTINCT FROM ARRAY['_jsonb'] THEN
		RETURN;
	END IF;
	IF rel ~ '_files_[0-9a-f]{8}$' THEN
		fields := ARRAY['filename', '_id'];
	ELSIF rel ~ '_chunks_[0-9a-f]{8}$' THEN
		fields := ARRAY['files_id'];
	ELSE
		RETURN;
	END IF;
	FOREACH field IN ARRAY fields LOOP
		-- Name: table prefix + hash keeps it unique and under 63 bytes, and
		-- "gfsgin" keeps it apart from FerretDB's own "..._idx" names.
		EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I.%I USING gin ((_jsonb -> %L)) WITH (fastupdate = off)',
			left(rel, 36) || '_' || left(md5(rel || '/' || field), 8) || '_gfsgin_'
				|| replace(field, '_', ''),
			nsp, rel, field);
	END LOOP;
END
$fn$;

CREATE OR REPLACE FUNCTION public.gridfsctl_tune_new_tables() RETURNS event_trigger
LANGUAGE plpgsql AS $fn$
DECLARE
	r record;
BEGIN
	FOR r IN SELECT objid FROM pg_event_trigger_ddl_commands()
	         WHERE command_tag = 'CREATE TABLE' AND object_type = 'table' LOOP
		PERFORM public.gridfsctl_tune_table(r.objid);
	END LOOP;
END
$fn$;

DROP EVENT TRIGGER IF EXISTS gridfsctl_tune_new_tables;
CREATE EVENT TRIGGER gridfsctl_tune_new_tables ON ddl_command_end
	WHEN TAG IN ('CREATE TABLE')
	EXECUTE FUNCTION public.gridfsctl_tune_new_tables();

-- Tables that existed before this file was applied.
SELECT public.gridfsctl_tune_table(c.oid)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND n.nspname NOT LIKE 'pg\_%' AND n.nspname <> 'information_schema';
