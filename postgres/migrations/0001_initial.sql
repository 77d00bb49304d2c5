-- The first schema. Keep it line for line beside sqlite/migrations: the
-- two differ only in types (JSON/BYTEA/COLLATE "C" here, TEXT/BLOB there)
-- and SQLite's STRICT. doc is JSON, not JSONB: it is always read and written
-- whole, JSON returns it as stored, and JSONB would refuse \u0000 in strings.
-- Keys and times are COLLATE "C" so that they sort by byte, as in SQLite,
-- whatever the database's locale.
--
-- Each entity is a JSON document in doc; the other columns copy the fields
-- that lookups and ordering need and are rewritten with doc on every update.
-- Times are UTC RFC 3339 with nine fractional digits, so text order is time
-- order. Lists order by (created, id), hence the indexes ending in both.
-- There are no foreign keys: the Tx interface has no project deletion, and
-- operations point at resources of several kinds.

CREATE TABLE users (
	id      TEXT COLLATE "C" PRIMARY KEY,
	created TEXT COLLATE "C" NOT NULL,
	doc     JSON NOT NULL
);
CREATE INDEX users_created ON users (created, id);

CREATE TABLE projects (
	id      TEXT COLLATE "C" PRIMARY KEY,
	created TEXT COLLATE "C" NOT NULL,
	doc     JSON NOT NULL
);
CREATE INDEX projects_created ON projects (created, id);

CREATE TABLE api_keys (
	access_key  TEXT COLLATE "C" PRIMARY KEY,
	project_id  TEXT COLLATE "C" NOT NULL,
	created     TEXT COLLATE "C" NOT NULL,
	secret_hash BYTEA,
	doc         JSON NOT NULL
);
CREATE INDEX api_keys_project ON api_keys (project_id, created, access_key);

CREATE TABLE services (
	id         TEXT COLLATE "C" PRIMARY KEY,
	project_id TEXT COLLATE "C" NOT NULL,
	created    TEXT COLLATE "C" NOT NULL,
	doc        JSON NOT NULL
);
CREATE INDEX services_project ON services (project_id, created, id);

CREATE TABLE replica_sets (
	id         TEXT COLLATE "C" PRIMARY KEY,
	project_id TEXT COLLATE "C" NOT NULL,
	service_id TEXT COLLATE "C" NOT NULL,
	created    TEXT COLLATE "C" NOT NULL,
	doc        JSON NOT NULL
);
CREATE INDEX replica_sets_project ON replica_sets (project_id, created, id);
CREATE INDEX replica_sets_service ON replica_sets (project_id, service_id, created, id);

CREATE TABLE vpcs (
	id         TEXT COLLATE "C" PRIMARY KEY,
	project_id TEXT COLLATE "C" NOT NULL,
	created    TEXT COLLATE "C" NOT NULL,
	doc        JSON NOT NULL
);
CREATE INDEX vpcs_project ON vpcs (project_id, created, id);

CREATE TABLE peerings (
	id         TEXT COLLATE "C" PRIMARY KEY,
	project_id TEXT COLLATE "C" NOT NULL,
	vpc_id     TEXT COLLATE "C" NOT NULL,
	created    TEXT COLLATE "C" NOT NULL,
	doc        JSON NOT NULL
);
CREATE INDEX peerings_vpc ON peerings (vpc_id, created, id);

CREATE TABLE operations (
	id          TEXT COLLATE "C" PRIMARY KEY,
	project_id  TEXT COLLATE "C" NOT NULL,
	resource_id TEXT COLLATE "C" NOT NULL,
	state       TEXT COLLATE "C" NOT NULL,
	created     TEXT COLLATE "C" NOT NULL,
	doc         JSON NOT NULL
);
CREATE INDEX operations_created ON operations (created, id);
CREATE INDEX operations_resource ON operations (resource_id, created, id);
CREATE INDEX operations_pending ON operations (created, id) WHERE state = 'pending';

CREATE TABLE ports (
	port  INTEGER PRIMARY KEY,
	owner TEXT COLLATE "C" NOT NULL
);
CREATE INDEX ports_owner ON ports (owner);

CREATE TABLE idempotency (
	credential      TEXT COLLATE "C" NOT NULL,
	idempotency_key TEXT COLLATE "C" NOT NULL,
	created         TEXT COLLATE "C" NOT NULL,
	doc             JSON NOT NULL,
	PRIMARY KEY (credential, idempotency_key)
);
CREATE INDEX idempotency_created ON idempotency (created);
