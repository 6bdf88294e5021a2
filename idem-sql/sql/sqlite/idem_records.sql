-- The schema of idem's SqliteStore for the table "idem_records", up to version 6:
-- the statements SqliteStoreBuilder::migrate runs, from SqliteStoreBuilder::schema_sql.
-- Apply it in one transaction (sqlite3: BEGIN; .read FILE; COMMIT;).
-- Every statement is idempotent but the ADD COLUMNs of versions 3 to 5, which SQLite
-- cannot make conditional: this script brings an older schema up to date, and applied
-- again to a table at version 3 or later it fails at them (duplicate column name) and
-- changes nothing.
-- For another table, SqliteStore::builder().table(NAME).schema_sql() writes its script.

CREATE TABLE IF NOT EXISTS "idem_records_migrations" (
    version     INTEGER NOT NULL PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at  INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER))
);

-- Version 1: create the records table and its expiry index.
INSERT INTO "idem_records_migrations" (version, description, applied_at) VALUES (1, 'create the records table and its expiry index', CAST(round(unixepoch('subsec') * 1000) AS INTEGER)) ON CONFLICT (version) DO NOTHING;
CREATE TABLE IF NOT EXISTS "idem_records" (
    key         BLOB    NOT NULL PRIMARY KEY CHECK (length(key) = 32),
    fingerprint BLOB             CHECK (fingerprint IS NULL OR length(fingerprint) = 32),
    token       BLOB    NOT NULL CHECK (length(token) = 16),
    state       INTEGER NOT NULL CHECK (state IN (0, 1)),
    expires_at  INTEGER NOT NULL,
    response    BLOB,
    is_error    INTEGER NOT NULL DEFAULT 0 CHECK (is_error IN (0, 1))
);
CREATE INDEX IF NOT EXISTS "idem_records_expires_at" ON "idem_records" (expires_at);

-- Version 2: create the steps table and its expiry index.
INSERT INTO "idem_records_migrations" (version, description, applied_at) VALUES (2, 'create the steps table and its expiry index', CAST(round(unixepoch('subsec') * 1000) AS INTEGER)) ON CONFLICT (version) DO NOTHING;
CREATE TABLE IF NOT EXISTS "idem_records_steps" (
    key         BLOB    NOT NULL CHECK (length(key) = 32),
    name        TEXT    NOT NULL CHECK (length(name) <= 255),
    position    INTEGER NOT NULL CHECK (position >= -1),
    token       BLOB    NOT NULL CHECK (length(token) = 16),
    attempt     INTEGER NOT NULL DEFAULT 0,
    finished    INTEGER NOT NULL DEFAULT 0 CHECK (finished IN (0, 1)),
    result      BLOB,
    expires_at  INTEGER NOT NULL,
    PRIMARY KEY (key, name)
);
CREATE INDEX IF NOT EXISTS "idem_records_steps_expires_at" ON "idem_records_steps" (expires_at);

-- Version 3: add uncertain claims and tombstones.
INSERT INTO "idem_records_migrations" (version, description, applied_at) VALUES (3, 'add uncertain claims and tombstones', CAST(round(unixepoch('subsec') * 1000) AS INTEGER)) ON CONFLICT (version) DO NOTHING;
ALTER TABLE "idem_records" ADD COLUMN result_until INTEGER;
ALTER TABLE "idem_records" ADD COLUMN uncertain INTEGER NOT NULL DEFAULT 0 CHECK (uncertain IN (0, 1));
CREATE INDEX IF NOT EXISTS "idem_records_result_until" ON "idem_records" (result_until) WHERE response IS NOT NULL AND expires_at > result_until;
CREATE INDEX IF NOT EXISTS "idem_records_uncertain" ON "idem_records" (key) WHERE state = 0 AND uncertain = true;

-- Version 4: add the steps' journal.
INSERT INTO "idem_records_migrations" (version, description, applied_at) VALUES (4, 'add the steps'' journal', CAST(round(unixepoch('subsec') * 1000) AS INTEGER)) ON CONFLICT (version) DO NOTHING;
ALTER TABLE "idem_records_steps" ADD COLUMN journal BLOB NOT NULL DEFAULT X'';

-- Version 5: the steps' journal in the record's row.
INSERT INTO "idem_records_migrations" (version, description, applied_at) VALUES (5, 'the steps'' journal in the record''s row', CAST(round(unixepoch('subsec') * 1000) AS INTEGER)) ON CONFLICT (version) DO NOTHING;
ALTER TABLE "idem_records" ADD COLUMN journal BLOB;
ALTER TABLE "idem_records" ADD COLUMN journal_until INTEGER;

-- Version 6: one index for the pruner.
INSERT INTO "idem_records_migrations" (version, description, applied_at) VALUES (6, 'one index for the pruner', CAST(round(unixepoch('subsec') * 1000) AS INTEGER)) ON CONFLICT (version) DO NOTHING;
DROP INDEX IF EXISTS "idem_records_expires_at";
CREATE INDEX IF NOT EXISTS "idem_records_expires_at" ON "idem_records" ((CASE WHEN response IS NOT NULL AND expires_at > result_until THEN 1 ELSE 0 END), (CASE WHEN response IS NOT NULL AND expires_at > result_until THEN result_until ELSE expires_at END));
DROP INDEX IF EXISTS "idem_records_result_until";
