-- The migrations of idem's PostgresStore, oldest first, as the store includes them: each step
-- opens with its "-- Version N: ..." line; {table} is the records table, {index} its expiry
-- index, {steps} the steps table (<table>_steps) and {steps_index} that table's expiry index,
-- {result_index} and {uncertain_index} the records table's partial indexes of version 3,
-- and {drop_index} and {drop_result_index} the names version 6 drops {index} and
-- {result_index} by ({index} is the pruner's index since version 6).
-- Never change what an applied step creates; append a new step. Every statement is
-- idempotent (IF NOT EXISTS): a records table found missing is re-created by running the
-- applied steps again. idem_records.sql beside this file is the script these make for the
-- default table.

-- Version 1: records table and expiry index.
CREATE TABLE IF NOT EXISTS {table} (
    key bytea PRIMARY KEY CHECK (octet_length(key) = 32),
    fingerprint bytea NULL CHECK (octet_length(fingerprint) = 32),
    token bytea NOT NULL CHECK (octet_length(token) = 16),
    state smallint NOT NULL CHECK (state IN (0, 1)),
    expires_at timestamptz NOT NULL,
    response bytea NULL,
    is_error boolean NOT NULL DEFAULT false
);
CREATE INDEX IF NOT EXISTS {index} ON {table} (expires_at);

-- Version 2: steps table and its expiry index.
-- One row per (operation key, step name); the row named '' at position -1 counts the
-- operation's attempts (docs/steps.md).
CREATE TABLE IF NOT EXISTS {steps} (
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
CREATE INDEX IF NOT EXISTS {steps_index} ON {steps} (expires_at);

-- Version 3: uncertain claims and tombstones.
-- What a record keeps past its lease (docs/architecture.md, "Past the lease"). expires_at stays
-- when the key frees: a running claim's lease end, a completed record's tombstone end (its
-- retention's end when it has no tombstone). result_until is a completed record's retention
-- end (NULL while running, and on rows completed before this version, which read it as
-- expires_at); uncertain marks a claim made with OnLapse::Uncertain, which no claim takes over
-- once its lease ends. The partial indexes hold only the rows the pruner strips of their
-- response (a tombstone's, once its retention ends) and the uncertain claims.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS result_until timestamptz NULL;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS uncertain boolean NOT NULL DEFAULT false;
CREATE INDEX IF NOT EXISTS {result_index} ON {table} (result_until) WHERE response IS NOT NULL AND expires_at > result_until;
CREATE INDEX IF NOT EXISTS {uncertain_index} ON {table} (key) WHERE state = 0 AND uncertain = true;

-- Version 4: the steps' journal.
-- The finished steps of an operation, appended to its '' row as one byte string (entries of
-- position, name and result; docs/steps.md, "How a SQL store keeps them"), so that a step is
-- one update of that row where it was a row of its own. Rows of the earlier shape stay and are
-- read beside it.
ALTER TABLE {steps} ADD COLUMN IF NOT EXISTS journal bytea NOT NULL DEFAULT ''::bytea;

-- Version 5: the steps' journal in the record's row.
-- A claim's finished steps, appended to its own record (journal, entries as in version 4) with
-- the time they are kept until (journal_until): a step is one update of the row the claim
-- already holds, as a hand-written recovery point is. The row stays while its journal does: a
-- release keeps it as a lapsed claim, which the next claim takes over with the journal, and the
-- pruner leaves a lapsed claim whose journal is still kept. Journals of version 4, in the steps
-- table's '' rows, stay and are read before it.
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS journal bytea NULL;
ALTER TABLE {table} ADD COLUMN IF NOT EXISTS journal_until timestamptz NULL;

-- Version 6: one index for the pruner.
-- Each row once in one index, by what the pruner next does to it and when: strip its response
-- (1) at its result's end, a completed record's while a tombstone follows, else delete it (0)
-- when its key frees (expires_at). It replaces the partial index of responses to strip of
-- version 3, and the expiry index of version 1 under that index's name, so that version 1's
-- CREATE INDEX IF NOT EXISTS, run again by a script applied again, finds it and changes
-- nothing. A completion that keeps a tombstone then moves one index entry, as one without does
-- (docs/performance.md, "The SQL stores"). The prune and the strip state these expressions
-- word for word, so the database uses the index.
DROP INDEX IF EXISTS {drop_index};
CREATE INDEX IF NOT EXISTS {index} ON {table} ((CASE WHEN response IS NOT NULL AND expires_at > result_until THEN 1 ELSE 0 END), (CASE WHEN response IS NOT NULL AND expires_at > result_until THEN result_until ELSE expires_at END));
DROP INDEX IF EXISTS {drop_result_index};
