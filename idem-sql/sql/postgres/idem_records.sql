-- The schema of idem's PostgresStore for the table "idem_records", up to version 6:
-- the statements PostgresStoreBuilder::migrate runs, from PostgresStoreBuilder::schema_sql.
-- Apply it in one transaction, as a role that may create tables in the schema
-- (psql --single-transaction -f FILE).
-- Every statement is idempotent: this script brings an older schema up to date, and
-- applying it again changes nothing.
-- For another table, PostgresStore::builder().table(NAME).schema_sql() writes its script.

CREATE TABLE IF NOT EXISTS "idem_records_migrations" (
    version     BIGINT NOT NULL PRIMARY KEY,
    description TEXT NOT NULL,
    applied_at  TIMESTAMPTZ NOT NULL DEFAULT (clock_timestamp())
);

-- Version 1: records table and expiry index.
INSERT INTO "idem_records_migrations" (version, description, applied_at) VALUES (1, 'records table and expiry index', clock_timestamp()) ON CONFLICT (version) DO NOTHING;
CREATE TABLE IF NOT EXISTS "idem_records" (
    key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
    fingerprint bytea NULL CHECK (octet_length(fingerprint) = 32),
    token bytea NOT NULL CHECK (octet_length(token) = 16),
    state smallint NOT NULL CHECK (state IN (0, 1)),
    expires_at timestamptz NOT NULL,
    response bytea NULL,
    is_error boolean NOT NULL DEFAULT false
);
CREATE INDEX IF NOT EXISTS "idem_records_expires_at_idx" ON "idem_records" (expires_at);

-- Version 2: steps table and its expiry index.
INSERT INTO "idem_records_migrations" (version, description, applied_at) VALUES (2, 'steps table and its expiry index', clock_timestamp()) ON CONFLICT (version) DO NOTHING;
CREATE TABLE IF NOT EXISTS "idem_records_steps" (
    key bytea NOT NULL CHECK (octet_length(key) = 32),
    name text NOT NULL CHECK (octet_length(name) <= 255),
    position integer NOT NULL CHECK (position >= -1),
    token bytea NOT NULL CHECK (octet_length(token) = 16),
    attempt bigint NOT NULL DEFAULT 0,
    finished boolean NOT NULL DEFAULT false,
    result bytea NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key, name)
);
CREATE INDEX IF NOT EXISTS "idem_records_steps_expires_at_idx" ON "idem_records_steps" (expires_at);

-- Version 3: uncertain claims and tombstones.
INSERT INTO "idem_records_migrations" (version, description, applied_at) VALUES (3, 'uncertain claims and tombstones', clock_timestamp()) ON CONFLICT (version) DO NOTHING;
ALTER TABLE "idem_records" ADD COLUMN IF NOT EXISTS result_until timestamptz NULL;
ALTER TABLE "idem_records" ADD COLUMN IF NOT EXISTS uncertain boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS "idem_records_result_until_idx" ON "idem_records" (result_until) WHERE response IS NOT NULL AND expires_at > result_until;
CREATE INDEX IF NOT EXISTS "idem_records_uncertain_idx" ON "idem_records" (key) WHERE state = 0 AND uncertain = true;

-- Version 4: the steps' journal.
INSERT INTO "idem_records_migrations" (version, description, applied_at) VALUES (4, 'the steps'' journal', clock_timestamp()) ON CONFLICT (version) DO NOTHING;
ALTER TABLE "idem_records_steps" ADD COLUMN IF NOT EXISTS journal bytea NOT NULL DEFAULT ''::bytea;

-- Version 5: the steps' journal in the record's row.
INSERT INTO "idem_records_migrations" (version, description, applied_at) VALUES (5, 'the steps'' journal in the record''s row', clock_timestamp()) ON CONFLICT (version) DO NOTHING;
ALTER TABLE "idem_records" ADD COLUMN IF NOT EXISTS journal bytea NULL;
ALTER TABLE "idem_records" ADD COLUMN IF NOT EXISTS journal_until timestamptz NULL;

-- Version 6: one index for the pruner.
INSERT INTO "idem_records_migrations" (version, description, applied_at) VALUES (6, 'one index for the pruner', clock_timestamp()) ON CONFLICT (version) DO NOTHING;
DROP INDEX IF EXISTS "idem_records_expires_at_idx";
CREATE INDEX IF NOT EXISTS "idem_records_expires_at_idx" ON "idem_records" ((CASE WHEN response IS NOT NULL AND expires_at > result_until THEN 1 ELSE 0 END), (CASE WHEN response IS NOT NULL AND expires_at > result_until THEN result_until ELSE expires_at END));
DROP INDEX IF EXISTS "idem_records_result_until_idx";
