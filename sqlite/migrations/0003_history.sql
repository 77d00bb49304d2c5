-- History a client can read: operations list by their parent too (a read
-- replica set's service, a peering's VPC), and each project has a stream of
-- events whose IDs increase by one in commit order. The counter row of a
-- project is updated by every event insert, so concurrent writers of one
-- project take their IDs in the order they commit.
ALTER TABLE operations ADD COLUMN parent_id TEXT NOT NULL DEFAULT '';
CREATE INDEX operations_parent ON operations (parent_id, created, id);

CREATE TABLE event_counters (
	project_id TEXT PRIMARY KEY,
	last_id    INTEGER NOT NULL
) STRICT;

CREATE TABLE events (
	project_id TEXT NOT NULL,
	id         INTEGER NOT NULL,
	created    TEXT NOT NULL,
	doc        TEXT NOT NULL,
	PRIMARY KEY (project_id, id)
) STRICT;
CREATE INDEX events_created ON events (created);
