-- Users and roles (issue 17): a user's e-mail address and password hash
-- get columns of their own (the hash never enters doc), projects get
-- members with roles, and user tokens (OAuth codes, access and refresh
-- tokens, console sessions) a table keyed by the hash of their secret.

ALTER TABLE users ADD COLUMN email TEXT;
ALTER TABLE users ADD COLUMN password_hash TEXT;
UPDATE users SET email = lower(json_extract(doc, '$.email'));
CREATE UNIQUE INDEX users_email ON users (email);

CREATE TABLE memberships (
	project_id TEXT NOT NULL,
	user_id    TEXT NOT NULL,
	role       TEXT NOT NULL,
	created    TEXT NOT NULL,
	PRIMARY KEY (project_id, user_id)
) STRICT;
CREATE INDEX memberships_user ON memberships (user_id, created, project_id);

-- Before users and roles, the installation's first user made every
-- project and key: it becomes the owner of every project, and every
-- existing key keeps the full power it had, as an owner key.
INSERT INTO memberships (project_id, user_id, role, created)
	SELECT p.id, u.id, 'owner', p.created
	FROM projects p, (SELECT id FROM users ORDER BY created, id LIMIT 1) u;
UPDATE api_keys SET doc = json_set(doc, '$.role', 'owner') WHERE json_extract(doc, '$.role') IS NULL;

CREATE TABLE user_tokens (
	hash    BLOB PRIMARY KEY,
	user_id TEXT NOT NULL,
	family  TEXT NOT NULL,
	expires TEXT NOT NULL,
	doc     TEXT NOT NULL
) STRICT;
CREATE INDEX user_tokens_family ON user_tokens (family);
CREATE INDEX user_tokens_user ON user_tokens (user_id);
CREATE INDEX user_tokens_expires ON user_tokens (expires);
