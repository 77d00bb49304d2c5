-- Metric history: one row per service, series, label set, resolution
-- (seconds; 0 for raw samples) and bucket start (Unix seconds): how many
-- samples fell in, their sum, first, min, max and last value.
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
    PRIMARY KEY (service_id, name, resolution, labels, bucket)
) STRICT;
-- Retention deletes by resolution and age.
CREATE INDEX metric_series_age ON metric_series (resolution, bucket);
