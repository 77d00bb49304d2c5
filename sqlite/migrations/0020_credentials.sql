-- Database credentials (issue 35, decisions.md section 12): a row per
-- credential until the runtime has dropped its role.
CREATE TABLE credentials (
	id         TEXT PRIMARY KEY,
	project_id TEXT NOT NULL,
	service_id TEXT NOT NULL,
	created    TEXT NOT NULL,
	doc        TEXT NOT NULL
) STRICT;
CREATE INDEX credentials_service ON credentials (project_id, service_id, created, id);
