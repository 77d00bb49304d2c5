-- Invitations and keys' last use (issue 36): an invitation is found by
-- the hash of its one-time token (never the token), and a key's last use
-- gets a column of its own, written apart from the key's document.
CREATE TABLE invitations (
	id         TEXT PRIMARY KEY,
	project_id TEXT NOT NULL,
	hash       BLOB NOT NULL UNIQUE,
	created    TEXT NOT NULL,
	doc        TEXT NOT NULL
) STRICT;
CREATE INDEX invitations_project ON invitations (project_id, created, id);

ALTER TABLE api_keys ADD COLUMN last_used TEXT;
