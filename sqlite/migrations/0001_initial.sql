-- The first schema. Keep it line for line beside postgres/migrations: the
-- two differ only in types (TEXT/BLOB here, JSON/BYTEA/COLLATE "C" there)
-- and SQLite's STRICT.
--
-- Each entity is a JSON document in doc; the other columns copy the fields
-- that lookups and ordering need and are rewritten with doc on every update.
-- Times are UTC RFC 3339 with nine fractional digits, so text order is time
-- order. Lists order by (created, id), hence the indexes ending in both.
-- There are no foreign keys: the Tx interface has no project deletion, and
-- operations point at resources of several kinds.

CREATE TABLE users (
	id      TEXT PRIMARY KEY,
	created TEXT NOT NULL,
	doc     TEXT NOT NULL
) STRICT;
CREATE INDEX users_created ON users (created, id);

CREATE TABLE projects (
	id      TEXT PRIMARY KEY,
	created TEXT NOT NULL,
	doc     TEXT NOT NULL
) STRICT;
CREATE INDEX projects_created ON projects (created, id);

CREATE TABLE api_keys (
	access_key  TEXT PRIMARY KEY,
	project_id  TEXT NOT NULL,
	created     TEXT NOT NULL,
	secret_hash BLOB,
	doc         TEXT NOT NULL
) STRICT;
CREATE INDEX api_keys_project ON api_keys (project_id, created, access_key);

CREATE TABLE services (
	id         TEXT PRIMARY KEY,
	project_id TEXT NOT NULL,
	created    TEXT NOT NULL,
	doc        TEXT NOT NULL
) STRICT;
CREATE INDEX services_project ON services (project_id, created, id);

CREATE TABLE replica_sets (
	id         TEXT PRIMARY KEY,
	project_id TEXT NOT NULL,
	service_id TEXT NOT NULL,
	created    TEXT NOT NULL,
	doc        TEXT NOT NULL
) STRICT;
CREATE INDEX replica_sets_project ON replica_sets (project_id, created, id);
CREATE INDEX replica_sets_service ON replica_sets (project_id, service_id, created, id);

CREATE TABLE vpcs (
	id         TEXT PRIMARY KEY,
	project_id TEXT NOT NULL,
	created    TEXT NOT NULL,
	doc        TEXT NOT NULL
) STRICT;
CREATE INDEX vpcs_project ON vpcs (project_id, created, id);

CREATE TABLE peerings (
	id         TEXT PRIMARY KEY,
	project_id TEXT NOT NULL,
	vpc_id     TEXT NOT NULL,
	created    TEXT NOT NULL,
	doc        TEXT NOT NULL
) STRICT;
CREATE INDEX peerings_vpc ON peerings (vpc_id, created, id);

CREATE TABLE operations (
	id          TEXT PRIMARY KEY,
	project_id  TEXT NOT NULL,
	resource_id TEXT NOT NULL,
	state       TEXT NOT NULL,
	created     TEXT NOT NULL,
	doc         TEXT NOT NULL
) STRICT;
CREATE INDEX operations_created ON operations (created, id);
CREATE INDEX operations_resource ON operations (resource_id, created, id);
CREATE INDEX operations_pending ON operations (created, id) WHERE state = 'pending';

CREATE TABLE ports (
	port  INTEGER PRIMARY KEY,
	owner TEXT NOT NULL
) STRICT;
CREATE INDEX ports_owner ON ports (owner);

CREATE TABLE idempotency (
	credential      TEXT NOT NULL,
	idempotency_key TEXT NOT NULL,
	created         TEXT NOT NULL,
	doc             TEXT NOT NULL,
	PRIMARY KEY (credential, idempotency_key)
) STRICT;
CREATE INDEX idempotency_created ON idempotency (created);
