-- Metric history: one row per service, series, label set, resolution
-- (seconds; 0 for raw samples) and bucket start (Unix seconds): how many
-- samples fell in, their sum, first, min, max and last value. The key
-- leads with service, resolution and bucket, so retention deletes a range
-- of the key per service and a query reads one range of it; no second
-- index repeats the key's text.
CREATE TABLE metric_series (
    service_id TEXT COLLATE "C" NOT NULL,
    name       TEXT COLLATE "C" NOT NULL,
    labels     TEXT COLLATE "C" NOT NULL,
    resolution BIGINT NOT NULL,
    bucket     BIGINT NOT NULL,
    count      BIGINT NOT NULL,
    sum        DOUBLE PRECISION NOT NULL,
    first      DOUBLE PRECISION NOT NULL,
    min        DOUBLE PRECISION NOT NULL,
    max        DOUBLE PRECISION NOT NULL,
    last       DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (service_id, resolution, bucket, name, labels)
);
