-- The migrations of idem's SqliteStore, oldest first, as the store includes them: each step
-- opens with its "-- Version N: ..." line; {table} is the records table, {index} its expiry
-- index, {steps} the steps table (<table>_steps) and {steps_index} that table's expiry index,
-- {result_index} and {uncertain_index} the records table's partial indexes of version 3,
-- and {drop_index} and {drop_result_index} the names version 6 drops {index} and
-- {result_index} by ({index} is the pruner's index since version 6).
-- Never change what an applied step creates; append a new step. Every statement is
-- idempotent (IF NOT EXISTS) but version 3's ADD COLUMNs, which SQLite cannot make conditional
-- (the migrator runs each step once, as its ledger says): a records table found missing is
-- re-created by running the applied steps again. idem_records.sql beside this file is the script these make for the
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

-- Version 3: add uncertain claims and tombstones.
-- What a record keeps past its lease (docs/architecture.md, "Past the lease"). expires_at stays
-- when the key frees: a running claim's lease end, a completed record's tombstone end (its
-- retention's end when it has no tombstone). result_until is a completed record's retention
-- end (NULL while running, and on rows completed before this version, which read it as
-- expires_at); uncertain marks a claim made with OnLapse::Uncertain, which no claim takes over
-- once its lease ends. The partial indexes hold only the rows the pruner strips of their
-- response (a tombstone's, once its retention ends) and the uncertain claims.
-- SQLite cannot add a column only if it is missing: the migrator runs this step once (its
-- ledger row says it ran), and a script re-applied to a table at this version fails here,
-- changing nothing once rolled back.
ALTER TABLE {table} ADD COLUMN result_until INTEGER;
ALTER TABLE {table} ADD COLUMN uncertain INTEGER NOT NULL DEFAULT 0 CHECK (uncertain IN (0, 1));
CREATE INDEX IF NOT EXISTS {result_index} ON {table} (result_until) WHERE response IS NOT NULL AND expires_at > result_until;
CREATE INDEX IF NOT EXISTS {uncertain_index} ON {table} (key) WHERE state = 0 AND uncertain = true;

-- Version 4: add the steps' journal.
-- The finished steps of an operation, appended to its '' row as one byte string (entries of
-- position, name and result; docs/steps.md, "How a SQL store keeps them"), so that a step is
-- one update of that row where it was a row of its own. Rows of the earlier shape stay and are
-- read beside it. As version 3, a step SQLite runs once (its ledger row says it ran).
ALTER TABLE {steps} ADD COLUMN journal BLOB NOT NULL DEFAULT X'';

-- Version 5: the steps' journal in the record's row.
-- A claim's finished steps, appended to its own record (journal, entries as in version 4) with
-- the time they are kept until (journal_until): a step is one update of the row the claim
-- already holds, as a hand-written recovery point is. The row stays while its journal does: a
-- release keeps it as a lapsed claim, which the next claim takes over with the journal, and the
-- pruner leaves a lapsed claim whose journal is still kept. Journals of version 4, in the steps
-- table's '' rows, stay and are read before it. As version 3, a step SQLite runs once.
ALTER TABLE {table} ADD COLUMN journal BLOB;
ALTER TABLE {table} ADD COLUMN journal_until INTEGER;

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
