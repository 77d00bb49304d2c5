-- Change counters (issue 19): a row per scope whose rev grows in the same
-- transaction as every write to what the scope covers, so a control plane
-- may keep what it read (verified credentials, encoded services) for as
-- long as the counter it read with it has not moved, and every plane sees
-- every other plane's writes at its next read of the counter. A missing
-- row reads as 0.
CREATE TABLE revisions (
    scope TEXT COLLATE "C" PRIMARY KEY,
    rev   BIGINT NOT NULL
);
