-- History a client can read: operations list by their parent too (a read
-- replica set's service, a peering's VPC), and each project has a stream of
-- events whose IDs increase by one in commit order. The counter row of a
-- project is updated by every event insert, so concurrent writers of one
-- project take their IDs in the order they commit. Keep it line for line
-- beside sqlite/migrations.
ALTER TABLE operations ADD COLUMN parent_id TEXT COLLATE "C" NOT NULL DEFAULT '';
CREATE INDEX operations_parent ON operations (parent_id, created, id);

CREATE TABLE event_counters (
	project_id TEXT COLLATE "C" PRIMARY KEY,
	last_id    BIGINT NOT NULL
);

CREATE TABLE events (
	project_id TEXT COLLATE "C" NOT NULL,
	id         BIGINT NOT NULL,
	created    TEXT COLLATE "C" NOT NULL,
	doc        JSON NOT NULL,
	PRIMARY KEY (project_id, id)
);
CREATE INDEX events_created ON events (created);
