//! The steps rows (docs/steps.md): an operation of three steps, each one write to an effects
//! table, through `Call::run_steps`, against the same three writes by hand on the same store,
//! and against those writes made resumable by hand (Brandur Leach's recovery points: the key's
//! row claimed, a fenced update of it after each write, the result stored).

use std::sync::{Arc, Mutex, PoisonError};

use idem::{Idempotency, Key};
use sqlx::{PgPool, SqlitePool};

use crate::harness::{op, Hit, Op};
use crate::raw::Raw;
use crate::workload::{random_key, work, Receipt};
use crate::BenchError;

/// The rows' variant names.
pub const IDEM: &str = "run_steps, 3 × steps.run";
pub const RECOVERY_POINTS: &str = "recovery points by hand";
pub const BY_HAND: &str = "3 writes by hand";

/// The steps of one operation.
pub const STEPS: [&str; 3] = ["create", "charge", "queue"];

/// Where a step's write goes.
#[derive(Clone)]
pub enum Effects {
    /// Rows of (operation key, step) in a table of the store's database, on its pool.
    Sqlite {
        pool: SqlitePool,
        insert: String,
    },
    Postgres {
        pool: PgPool,
        insert: String,
    },
    /// The memory store's rows: pairs pushed onto a vector under a lock.
    Memory(Arc<Mutex<Vec<EffectRow>>>),
}

/// One write of the memory rows: the operation's key and the step's number.
type EffectRow = ([u8; 32], i64);

impl Effects {
    /// Creates the effects table `table` on SQLite.
    pub async fn sqlite(pool: SqlitePool, table: &str) -> Result<Effects, BenchError> {
        sqlx::query(&format!(
            "CREATE TABLE \"{table}\" (id INTEGER PRIMARY KEY, op BLOB NOT NULL, step INTEGER NOT NULL)"
        ))
        .execute(&pool)
        .await?;
        let insert = format!("INSERT INTO \"{table}\" (op, step) VALUES (?1, ?2)");
        Ok(Effects::Sqlite { pool, insert })
    }

    /// Creates the effects table `table` on PostgreSQL (the caller drops it).
    pub async fn postgres(pool: PgPool, table: &str) -> Result<Effects, BenchError> {
        sqlx::query(&format!(
            "CREATE TABLE \"{table}\" (id BIGSERIAL PRIMARY KEY, op BYTEA NOT NULL, step BIGINT NOT NULL)"
        ))
        .execute(&pool)
        .await?;
        let insert = format!("INSERT INTO \"{table}\" (op, step) VALUES ($1, $2)");
        Ok(Effects::Postgres { pool, insert })
    }

    pub fn memory() -> Effects {
        Effects::Memory(Arc::new(Mutex::new(Vec::new())))
    }

    /// One step's write: one statement on the SQL stores.
    async fn write(&self, key: &[u8; 32], step: i64) -> Result<(), BenchError> {
        match self {
            Effects::Sqlite { pool, insert } => {
                sqlx::query(insert)
                    .bind(&key[..])
                    .bind(step)
                    .execute(pool)
                    .await?;
            }
            Effects::Postgres { pool, insert } => {
                sqlx::query(insert)
                    .bind(&key[..])
                    .bind(step)
                    .execute(pool)
                    .await?;
            }
            Effects::Memory(rows) => {
                let mut rows = rows.lock().unwrap_or_else(PoisonError::into_inner);
                // Bounded: the rows are only there to be written.
                if rows.len() >= 1 << 16 {
                    rows.clear();
                }
                rows.push((*key, step));
            }
        }
        Ok(())
    }
}

/// The three steps through `Call::run_steps` on a new key, each an at-least-once step whose
/// work is one write.
pub fn idem_steps(engine: &Idempotency, effects: &Effects) -> Op {
    let (engine, effects) = (engine.clone(), effects.clone());
    op(move || {
        let (engine, effects) = (engine.clone(), effects.clone());
        async move {
            let key = random_key();
            let seed = fastrand::u64(..);
            let effects = &effects;
            let out = engine
                .call(Key::from_bytes(key))
                .run_steps(|steps| async move {
                    for (i, name) in (0i64..).zip(STEPS) {
                        steps
                            .run(
                                name,
                                || async move { effects.write(&key, i).await.map(|()| i) },
                            )
                            .await?;
                    }
                    Ok::<_, BenchError>(work(seed))
                })
                .await?;
            if out.is_replayed() {
                return Err(BenchError::Unexpected("a new random key replayed".into()));
            }
            Ok(Hit::Fresh)
        }
    })
}

/// The same three writes by hand: no key, no record, nothing to resume from.
pub fn by_hand(effects: &Effects) -> Op {
    let effects = effects.clone();
    op(move || {
        let effects = effects.clone();
        async move {
            let key = random_key();
            for i in 0..STEPS.len() as i64 {
                effects.write(&key, i).await?;
            }
            let _: Receipt = work(fastrand::u64(..));
            Ok(Hit::Fresh)
        }
    })
}

/// The three writes made resumable by hand: the key claimed with the raw INSERT, a fenced
/// UPDATE of its row naming the step after each write (the recovery point), the result stored
/// with the raw UPDATE.
pub fn recovery_points(raw: &Raw, effects: &Effects) -> Op {
    let (raw, effects) = (raw.clone(), effects.clone());
    op(move || {
        let (raw, effects) = (raw.clone(), effects.clone());
        async move {
            let key = random_key();
            let token = raw.claim(&key).await?;
            for (i, name) in (0i64..).zip(STEPS) {
                effects.write(&key, i).await?;
                raw.checkpoint(&key, &token, name.as_bytes()).await?;
            }
            let response = serde_json::to_vec(&work(fastrand::u64(..)))?;
            raw.update(&key, &token, &response).await?;
            Ok(Hit::Fresh)
        }
    })
}
