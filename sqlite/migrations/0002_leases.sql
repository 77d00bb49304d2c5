-- Leases: which control-plane process works on a resource, until when.
CREATE TABLE leases (
    resource_id TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    expires     TEXT NOT NULL
) STRICT;
