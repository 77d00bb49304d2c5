-- Metric history: one row per service, series, label set, resolution
-- (seconds; 0 for raw samples) and bucket start (Unix seconds): how many
-- samples fell in, their sum, first, min, max and last value. The key
-- leads with service, resolution and bucket, so retention deletes a range
-- of the key per service and a query reads one range of it; no second
-- index repeats the key's text (WITHOUT ROWID: the key is stored once).
CREATE TABLE metric_series (
    service_id TEXT NOT NULL,
    name       TEXT NOT NULL,
    labels     TEXT NOT NULL,
    resolution INTEGER NOT NULL,
    bucket     INTEGER NOT NULL,
    count      INTEGER NOT NULL,
    sum        REAL NOT NULL,
    first      REAL NOT NULL,
    min        REAL NOT NULL,
    max        REAL NOT NULL,
    last       REAL NOT NULL,
    PRIMARY KEY (service_id, resolution, bucket, name, labels)
) STRICT, WITHOUT ROWID;
