-- The migrations of idem's SqliteStore, oldest first, as the store includes them: each step
-- opens with its "-- Version N: ..." line; {table} is the records table, {index} its expiry
-- index, {steps} the steps table (<table>_steps) and {steps_index} that table's expiry index.
-- Never change what an applied step creates; append a new step. Every statement is
-- idempotent (IF NOT EXISTS): a records table found missing is re-created by running the
-- applied steps again. idem_records.sql beside this file is the script these make for the
-- default table.

-- Version 1: create the records table and its expiry index.
CREATE TABLE IF NOT EXISTS {table} (
    key         BLOB    NOT NULL PRIMARY KEY CHECK (length(key) = 32),
    fingerprint BLOB             CHECK (fingerprint IS NULL OR length(fingerprint) = 32),
    token       BLOB    NOT NULL CHECK (length(token) = 16),
    state       INTEGER NOT NULL CHECK (state IN (0, 1)),
    expires_at  INTEGER NOT NULL,
    response    BLOB,
    is_error    INTEGER NOT NULL DEFAULT 0 CHECK (is_error IN (0, 1))
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);

-- Version 2: create the steps table and its expiry index.
-- One row per (operation key, step name); the row named '' at position -1 counts the
-- operation's attempts (docs/steps.md).
CREATE TABLE IF NOT EXISTS {steps} (
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
CREATE INDEX IF NOT EXISTS {steps_index} ON {steps} (expires_at);
