-- Users and roles (issue 17); line for line beside sqlite/migrations.
-- A user's e-mail address and password hash get columns of their own (the
-- hash never enters doc), projects get members with roles, and user tokens
-- (OAuth codes, access and refresh tokens, console sessions) a table keyed
-- by the hash of their secret.

ALTER TABLE users ADD COLUMN email TEXT COLLATE "C";
ALTER TABLE users ADD COLUMN password_hash TEXT;
UPDATE users SET email = lower(doc->>'email');
CREATE UNIQUE INDEX users_email ON users (email);

CREATE TABLE memberships (
	project_id TEXT COLLATE "C" NOT NULL,
	user_id    TEXT COLLATE "C" NOT NULL,
	role       TEXT NOT NULL,
	created    TEXT COLLATE "C" NOT NULL,
	PRIMARY KEY (project_id, user_id)
);
CREATE INDEX memberships_user ON memberships (user_id, created, project_id);

-- Before users and roles, the installation's first user made every
-- project and key: it becomes the owner of every project, and every
-- existing key keeps the full power it had, as an owner key.
INSERT INTO memberships (project_id, user_id, role, created)
	SELECT p.id, u.id, 'owner', p.created
	FROM projects p, (SELECT id FROM users ORDER BY created, id LIMIT 1) u;
UPDATE api_keys SET doc = jsonb_set(doc::jsonb, '{role}', '"owner"')::json WHERE doc->>'role' IS NULL;

CREATE TABLE user_tokens (
	hash    BYTEA PRIMARY KEY,
	user_id TEXT COLLATE "C" NOT NULL,
	family  TEXT COLLATE "C" NOT NULL,
	expires TEXT COLLATE "C" NOT NULL,
	doc     JSON NOT NULL
);
CREATE INDEX user_tokens_family ON user_tokens (family);
CREATE INDEX user_tokens_user ON user_tokens (user_id);
CREATE INDEX user_tokens_expires ON user_tokens (expires);
