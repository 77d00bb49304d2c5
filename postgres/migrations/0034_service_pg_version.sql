-- PostgreSQL versions per service (issue 34, decisions.md section 11): the
-- major version a service runs, in its document and as a column of its
-- own. Every service made before services chose a version runs 15.
ALTER TABLE services ADD COLUMN pg_version INTEGER NOT NULL DEFAULT 15;
UPDATE services SET doc = jsonb_set(doc::jsonb, '{spec,pg_version}', '15')::json
	WHERE doc->'spec'->'pg_version' IS NULL;
