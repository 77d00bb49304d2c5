-- Leases: which control-plane process works on a resource, until when.
CREATE TABLE leases (
    resource_id TEXT COLLATE "C" PRIMARY KEY,
    owner       TEXT NOT NULL,
    expires     TEXT COLLATE "C" NOT NULL
);
