//! Group commit, for a database with one write lock (SQLite) whose store's writers take turns:
//! the claims and completions waiting for the lock at one moment are written by one task, in
//! one transaction, a few statements to a query. See docs/performance.md, "SQLite: writers
//! grouped into one commit".

use std::borrow::Cow;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::dialect::{Ops, SqlQuery};
use crate::error::sql_error;
use crate::protocol::WriteTurns;
use idem_core::{Claim, Completion, Error, Fingerprint, Key, StoreError, StoreErrorKind};

/// The most writes of one kind sent to the database's thread in one query.
const CHUNK: usize = 8;
/// The most writes one commit takes.
const MOST: usize = 64;
/// The group's writes between two checkpoints of the write-ahead log: about SQLite's own
/// threshold (1,000 pages) at a few pages a write, fewer as writes share a commit.
const CHECKPOINT_EVERY: usize = 256;
/// The frames of the log past which the checkpointer copies the rest of it in the writers'
/// turn, so that SQLite starts the log again: the log's bound, about 16 MiB of 4 KiB pages.
const RESTART_AT: i64 = 4_000;

/// What a write is: its statement.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Kind {
    Claim = 0,
    Complete = 1,
}

/// A write whose answer is the count of rows its one statement changed: the claim of a pooled
/// connection (`claim_counted`) and the completion, with its response. The order of the
/// arguments of each statement is written here once, for the statement alone and in a group.
#[derive(Clone, Debug)]
pub(crate) enum Write<'a> {
    Claim(ClaimArgs),
    Complete(CompleteArgs, Option<Cow<'a, [u8]>>),
}

/// A claim's arguments.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClaimArgs {
    pub(crate) key: Key,
    pub(crate) fingerprint: Option<Fingerprint>,
    pub(crate) token: [u8; 16],
    pub(crate) lease_ms: i64,
    pub(crate) uncertain: bool,
}

/// A completion's arguments but its response.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CompleteArgs {
    key: Key,
    token: [u8; 16],
    is_error: bool,
    retention_ms: i64,
    key_retention_ms: i64,
}

impl<'a> Write<'a> {
    /// The completion of `claim`: its result for `retention_ms`, the key for
    /// `key_retention_ms` more.
    pub(crate) fn complete(
        claim: &Claim,
        completion: &Completion<'a>,
        retention_ms: i64,
        key_retention_ms: i64,
    ) -> Write<'a> {
        let args = CompleteArgs {
            key: *claim.key(),
            token: claim.token().to_bytes(),
            is_error: completion.is_error,
            retention_ms,
            key_retention_ms,
        };
        Write::Complete(args, completion.response.map(Cow::Borrowed))
    }

    fn kind(&self) -> Kind {
        match self {
            Write::Claim(_) => Kind::Claim,
            Write::Complete(..) => Kind::Complete,
        }
    }

    fn into_owned(self) -> Write<'static> {
        match self {
            Write::Claim(args) => Write::Claim(args),
            Write::Complete(args, response) => {
                Write::Complete(args, response.map(|r| Cow::Owned(r.into_owned())))
            }
        }
    }

    /// `query` with this write's arguments bound after those it has: `$1`… of the statement
    /// (claim: key, fingerprint, token, lease, uncertain; completion: key, token, response,
    /// is_error, retention, key retention).
    pub(crate) fn bind<'q, DB: Ops>(&'q self, query: SqlQuery<'q, DB>) -> SqlQuery<'q, DB> {
        match self {
            Write::Claim(c) => {
                let query = DB::bind_bytes(query, &c.key.as_bytes()[..]);
                let fingerprint = c.fingerprint.as_ref().map(|f| &f.as_bytes()[..]);
                let query = DB::bind_opt_bytes(query, fingerprint);
                let query = DB::bind_i64(DB::bind_bytes(query, &c.token[..]), c.lease_ms);
                DB::bind_bool(query, c.uncertain)
            }
            Write::Complete(c, response) => {
                let query = DB::bind_bytes(query, &c.key.as_bytes()[..]);
                let query =
                    DB::bind_opt_bytes(DB::bind_bytes(query, &c.token[..]), response.as_deref());
                let query = DB::bind_bool(query, c.is_error);
                DB::bind_i64(DB::bind_i64(query, c.retention_ms), c.key_retention_ms)
            }
        }
    }
}

/// A write handed to the group, and where its answer goes. `state` says whether the group has
/// taken it ([`TAKEN`]) or its caller gave up waiting ([`WITHDRAWN`]) first: exactly one of
/// them moves it from [`QUEUED`].
struct Pending {
    write: Write<'static>,
    state: Arc<AtomicU8>,
    reply: oneshot::Sender<Result<u64, Error>>,
}

const QUEUED: u8 = 0;
const TAKEN: u8 = 1;
const WITHDRAWN: u8 = 2;

/// The group of one store: the task that writes, started on the first write (and again should
/// the runtime it ran on end), and what it needs.
pub(crate) struct Group<DB: Ops> {
    shared: Arc<Shared<DB>>,
    sender: Mutex<Option<mpsc::UnboundedSender<Pending>>>,
}

struct Shared<DB: Ops> {
    /// The group's own connection (one), so that callers holding every connection of the
    /// store's pool while they wait for the group cannot starve it. Its commits run no
    /// checkpoint (`wal_autocheckpoint = 0`): `checkpoints` does, beside it.
    pool: sqlx::Pool<DB>,
    /// The connection (one) that checkpoints the write-ahead log after every
    /// [`CHECKPOINT_EVERY`] writes of the group, outside the turns, so that no writer waits for
    /// a checkpoint.
    checkpoints: sqlx::Pool<DB>,
    turns: Arc<WriteTurns>,
    /// The claim and the completion alone.
    alone: [String; 2],
    /// [`text`](Self::text)'s queries.
    texts: Vec<String>,
    /// How many writes the group's task has taken from its queue.
    #[cfg(test)]
    taken: std::sync::atomic::AtomicUsize,
}

impl<DB: Ops> Group<DB> {
    /// The group of a store whose statements are `claim` and `complete`, writing on `pool` (one
    /// connection of its own, which must not checkpoint as it commits) in the store's `turns`,
    /// and checkpointing on `checkpoints` (another).
    pub(crate) fn new(
        pool: sqlx::Pool<DB>,
        checkpoints: sqlx::Pool<DB>,
        turns: Arc<WriteTurns>,
        claim: &str,
        complete: &str,
    ) -> Group<DB> {
        let mut texts = Vec::with_capacity(2 * CHUNK * 4);
        for statement in [claim, complete] {
            let params = params_of(statement);
            for k in 1..=CHUNK {
                for begin in [false, true] {
                    for commit in [false, true] {
                        texts.push(chunk(statement, params, k, begin, commit));
                    }
                }
            }
        }
        Group {
            shared: Arc::new(Shared {
                pool,
                checkpoints,
                turns,
                alone: [claim.to_owned(), complete.to_owned()],
                texts,
                #[cfg(test)]
                taken: std::sync::atomic::AtomicUsize::new(0),
            }),
            sender: Mutex::new(None),
        }
    }

    /// The group's connections, to close with the store (before its last checkpoint).
    #[cfg_attr(not(feature = "sqlite"), allow(dead_code))] // only SQLite closes them
    pub(crate) fn pools(&self) -> [&sqlx::Pool<DB>; 2] {
        [&self.shared.pool, &self.shared.checkpoints]
    }

    /// Writes `write` in the next commit and answers the count of rows it changed, once that
    /// commit is done. A write the group has not begun when the turns' wait (the busy timeout)
    /// has passed is withdrawn and fails `Unavailable`, having written nothing, as a writer
    /// waiting its turn would.
    pub(crate) async fn write(&self, write: Write<'_>) -> Result<u64, Error> {
        let state = Arc::new(AtomicU8::new(QUEUED));
        let (reply, answer) = oneshot::channel();
        let pending = Pending {
            write: write.into_owned(),
            state: state.clone(),
            reply,
        };
        self.send(pending)?;
        let deadline = Instant::now() + self.shared.turns.wait();
        tokio::pin!(answer);
        tokio::select! {
            biased;
            answered = &mut answer => return answered.map_err(|_| stopped())?,
            () = tokio::time::sleep_until(deadline) => {}
        }
        match state.compare_exchange(QUEUED, WITHDRAWN, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => Err(self.shared.turns.waited_too_long()),
            // Begun: its answer says what was written.
            Err(_) => answer.await.map_err(|_| stopped())?,
        }
    }

    fn send(&self, mut pending: Pending) -> Result<(), Error> {
        let mut sender = self.sender.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(tx) = sender.as_ref() {
            match tx.send(pending) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::SendError(back)) => pending = back,
            }
        }
        // No task yet, or its runtime ended: start one on the caller's.
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| {
            Error::Store(StoreError::new(
                StoreErrorKind::Unavailable,
                "a SQLite store whose writers take turns writes from a task of its own, which \
                 needs a Tokio runtime: call it from within one",
            ))
        })?;
        let (tx, rx) = mpsc::unbounded_channel();
        runtime.spawn(run(self.shared.clone(), rx));
        tx.send(pending).map_err(|_| stopped())?;
        *sender = Some(tx);
        Ok(())
    }
}

/// The error of a write whose group's task ended before answering it.
fn stopped() -> Error {
    Error::Store(StoreError::new(
        StoreErrorKind::Unavailable,
        "the SQLite store's writing task stopped (its runtime is shutting down) before it \
         answered; the write may or may not have been made",
    ))
}

/// The group's task: takes the writes waiting, up to [`MOST`], commits them, answers each;
/// and after every [`CHECKPOINT_EVERY`] writes asks its checkpointer for a checkpoint.
async fn run<DB: Ops>(shared: Arc<Shared<DB>>, mut writes: mpsc::UnboundedReceiver<Pending>) {
    // One request at most waits: asked again while it checkpoints, it checkpoints once more.
    let (ask, asked) = mpsc::channel(1);
    tokio::spawn(checkpoint(
        shared.checkpoints.clone(),
        shared.turns.clone(),
        asked,
    ));
    let mut batch = Vec::with_capacity(MOST);
    let mut since = 0;
    while let Some(first) = writes.recv().await {
        batch.push(first);
        while batch.len() < MOST {
            match writes.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        since += batch.len();
        #[cfg(test)]
        shared.taken.fetch_add(batch.len(), Ordering::AcqRel);
        shared.commit(&mut batch).await;
        if since >= CHECKPOINT_EVERY {
            since = 0;
            let _ = ask.try_send(());
        }
    }
}

/// The checkpointer: a `PASSIVE` checkpoint each time it is asked, which copies what it can
/// of the log into the database while the writers go on. SQLite starts the log again from its
/// beginning only in a write transaction that began after all of it was copied, which never
/// happens beside a group that writes on (its next transaction begins before the copy ends):
/// so once the log is past [`RESTART_AT`] frames, the checkpointer copies what is left (the
/// frames written during its own copy) in the writers' turn, and the group's next commit
/// starts the log again. Ends with the group's task, or when the store closes its
/// connection.
async fn checkpoint<DB: Ops>(
    pool: sqlx::Pool<DB>,
    turns: Arc<WriteTurns>,
    mut asked: mpsc::Receiver<()>,
) {
    while asked.recv().await.is_some() {
        let done = async {
            let mut conn = pool.acquire().await.map_err(sql_error)?;
            let (log, _copied) = passive::<DB>(&mut conn).await?;
            if log >= RESTART_AT {
                let _turn = turns.take().await?;
                passive::<DB>(&mut conn).await?;
            }
            Ok::<_, Error>(())
        };
        match done.await {
            Ok(()) => {}
            Err(Error::Store(e)) if pool.is_closed() => {
                tracing::debug!(error = %e, "idem: the SQLite store closed; its checkpointer ends");
                return;
            }
            // The next request tries again; meanwhile the store's other connections still
            // checkpoint as they commit, past SQLite's threshold.
            Err(e) => tracing::warn!(error = %e, "idem: a checkpoint of the SQLite log failed"),
        }
    }
}

/// A `PASSIVE` checkpoint on `conn`: the frames in the log, and how many of them are copied.
async fn passive<DB: Ops>(conn: &mut DB::Connection) -> Result<(i64, i64), Error> {
    let query = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)");
    let rows = DB::fetch_all(conn, query).await.map_err(sql_error)?;
    let counts = |row| Ok::<_, sqlx::Error>((DB::get_i64(row, 1)?, DB::get_i64(row, 2)?));
    match rows.first() {
        Some(row) => counts(row).map_err(|e| Error::Store(sql_error(e))),
        None => Ok((0, 0)),
    }
}

impl<DB: Ops> Shared<DB> {
    /// Writes `batch` and answers each of its writes; leaves it empty.
    async fn commit(&self, batch: &mut Vec<Pending>) {
        let ready = async {
            let conn = self
                .pool
                .acquire()
                .await
                .map_err(|e| Error::Store(sql_error(e)))?;
            Ok::<_, Error>((conn, self.turns.take().await?))
        };
        let (mut conn, _turn) = match ready.await {
            Ok(ready) => ready,
            Err(e) => {
                for pending in batch.drain(..) {
                    let _ = pending.reply.send(Err(copy(&e)));
                }
                return;
            }
        };
        // Begun now, with the connection and the turn: a write whose caller went away or gave
        // up waiting meanwhile is not written.
        batch.retain(|p| {
            !p.reply.is_closed()
                && p.state
                    .compare_exchange(QUEUED, TAKEN, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
        });
        // Claims first, then completions: each kind's statements go in chunks of one text. The
        // writes of one batch are concurrent (none has been answered), so any order is one
        // they could have run in.
        batch.sort_by_key(|p| p.write.kind());
        let answers = self.answers(&mut conn, batch).await;
        for (pending, answer) in batch.drain(..).zip(answers) {
            let _ = pending.reply.send(answer);
        }
    }

    /// The answers of `batch`, written together if it is more than one write; write by write
    /// if it is one, or if together they could not be written.
    async fn answers(
        &self,
        conn: &mut DB::Connection,
        batch: &[Pending],
    ) -> Vec<Result<u64, Error>> {
        if batch.len() > 1 {
            let failed = match self.together(conn, batch).await {
                Ok(counts) => return counts.into_iter().map(Ok).collect(),
                Err(e) => Error::Store(sql_error(e)),
            };
            // Nothing of the group was written: roll back what it began, then write each
            // alone, so that one write that cannot be made fails only itself; unless the
            // database is out of reach (its lock held past the busy timeout), which each would
            // wait as long to learn again.
            let _ = DB::execute(&mut *conn, sqlx::query("ROLLBACK")).await;
            if unavailable(&failed) {
                return batch.iter().map(|_| Err(copy(&failed))).collect();
            }
        }
        let mut answers: Vec<Result<u64, Error>> = Vec::with_capacity(batch.len());
        for pending in batch {
            // The database is out of reach: the rest would wait as long to learn the same.
            if let Some(Err(e)) = answers.last()
                && unavailable(e)
            {
                let e = copy(e);
                answers.push(Err(e));
                continue;
            }
            let w = &pending.write;
            let query = w.bind(sqlx::query(&self.alone[w.kind() as usize]));
            let count = DB::execute(&mut *conn, query).await;
            answers.push(count.map_err(|e| Error::Store(sql_error(e))));
        }
        answers
    }

    /// `batch` (two writes or more, sorted by kind) in one transaction: its counts, or the
    /// first error, the transaction then left to roll back.
    async fn together(
        &self,
        conn: &mut DB::Connection,
        batch: &[Pending],
    ) -> Result<Vec<u64>, sqlx::Error> {
        let mut counts = Vec::with_capacity(batch.len());
        let mut i = 0;
        while i < batch.len() {
            let kind = batch[i].write.kind();
            let mut j = i + 1;
            while j < batch.len() && j - i < CHUNK && batch[j].write.kind() == kind {
                j += 1;
            }
            let text = self.text(kind, j - i, i == 0, j == batch.len());
            let mut query = sqlx::query(text);
            for pending in &batch[i..j] {
                query = pending.write.bind(query);
            }
            let rows = DB::fetch_all(&mut *conn, query).await?;
            if rows.len() != j - i {
                return Err(sqlx::Error::Protocol(format!(
                    "a group of {} writes answered {} counts",
                    j - i,
                    rows.len()
                )));
            }
            for row in &rows {
                counts.push(u64::try_from(DB::get_i64(row, 0)?).unwrap_or(0));
            }
            i = j;
        }
        Ok(counts)
    }

    fn text(&self, kind: Kind, k: usize, begin: bool, commit: bool) -> &str {
        let at =
            ((kind as usize * CHUNK + (k - 1)) * 2 + usize::from(begin)) * 2 + usize::from(commit);
        &self.texts[at]
    }
}

/// Whether `e` says the database is out of reach: its lock held past the busy timeout, its
/// file gone.
fn unavailable(e: &Error) -> bool {
    matches!(e, Error::Store(s) if s.kind() == StoreErrorKind::Unavailable)
}

/// `e` again, for another write of the batch it failed.
fn copy(e: &Error) -> Error {
    let (kind, words) = match e {
        Error::Store(s) => (
            s.kind(),
            std::error::Error::source(s).map_or_else(|| s.to_string(), |w| w.to_string()),
        ),
        other => (StoreErrorKind::Unavailable, other.to_string()),
    };
    Error::Store(StoreError::new(kind, words))
}

/// `k` copies of `statement` (whose parameters are `$1` to `$params`), each followed by
/// `SELECT changes()` (its count, as a row), their parameters numbered on; after `BEGIN
/// IMMEDIATE` and before `COMMIT` as asked.
fn chunk(statement: &str, params: usize, k: usize, begin: bool, commit: bool) -> String {
    let mut parts = Vec::with_capacity(2 * k + 2);
    if begin {
        parts.push("BEGIN IMMEDIATE".to_owned());
    }
    for m in 0..k {
        parts.push(renumber(statement, m * params));
        parts.push("SELECT changes()".to_owned());
    }
    if commit {
        parts.push("COMMIT".to_owned());
    }
    parts.join("; ")
}

/// `sql` with each parameter `$n` made `$(n + offset)`.
fn renumber(sql: &str, offset: usize) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..=at]);
        rest = &rest[at + 1..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        match rest[..digits].parse::<usize>() {
            Ok(n) => out.push_str(&(n + offset).to_string()),
            Err(_) => out.push_str(&rest[..digits]),
        }
        rest = &rest[digits..];
    }
    out.push_str(rest);
    out
}

/// The highest parameter `$n` of `sql`.
fn params_of(sql: &str) -> usize {
    sql.split('$')
        .skip(1)
        .filter_map(|s| {
            let digits = s.bytes().take_while(u8::is_ascii_digit).count();
            s[..digits].parse::<usize>().ok()
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A claim handed to the group whose caller goes away while the group waits for its turn
    /// is not written: the group begins a write only once it holds the connection and the turn.
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn a_write_whose_caller_went_away_before_its_turn_is_not_written() {
        use idem_core::{ClaimOutcome, ClaimRequest, Store};
        let dir = tempfile::tempdir().unwrap();
        let store = crate::SqliteStore::builder()
            .pruner(None)
            .writers_take_turns(true)
            .open(dir.path().join("idem.db"))
            .await
            .unwrap();
        let key = |n: u32| Key::derive("group-test", "", &format!("k{n}")).unwrap();
        let lease = std::time::Duration::from_secs(30);
        let claimed = store.claim(ClaimRequest::new(&key(1), lease)).await;
        assert!(
            matches!(claimed, Ok(ClaimOutcome::Claimed(_))),
            "{claimed:?}"
        );

        let group = store.protocol.group().unwrap();
        let taken = || group.shared.taken.load(Ordering::Acquire);
        let before = taken();
        let turn = group.shared.turns.take().await.unwrap();
        let two = key(2);
        {
            let gone = store.claim(ClaimRequest::new(&two, lease));
            tokio::pin!(gone);
            for _ in 0..1000 {
                let polled = std::future::poll_fn(|cx| {
                    std::task::Poll::Ready(gone.as_mut().poll(cx).is_ready())
                });
                assert!(!polled.await, "claimed while the turn was held");
                if taken() > before {
                    break;
                }
                tokio::task::yield_now().await;
            }
            assert_eq!(taken(), before + 1, "the group never took the claim");
        }
        drop(turn);
        let next = store.claim(ClaimRequest::new(&key(3), lease)).await;
        assert!(matches!(next, Ok(ClaimOutcome::Claimed(_))), "{next:?}");
        assert_eq!(store.get(&two).await.unwrap(), None);
    }

    #[test]
    fn parameters_are_numbered_on() {
        assert_eq!(
            renumber("a = $1 AND b = $12 OR c = $2", 5),
            "a = $6 AND b = $17 OR c = $7"
        );
        assert_eq!(renumber("no parameters", 3), "no parameters");
        assert_eq!(params_of("x $3 y $12 z $1"), 12);
        assert_eq!(
            chunk("UPDATE t SET v = $2 WHERE k = $1", 2, 2, true, true),
            "BEGIN IMMEDIATE; UPDATE t SET v = $2 WHERE k = $1; SELECT changes(); \
             UPDATE t SET v = $4 WHERE k = $3; SELECT changes(); COMMIT"
        );
    }
}
