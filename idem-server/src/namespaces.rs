//! Namespaces as Diom has them: configured by the admin, each a key space of its own. They are
//! records in the same store, written through the engine (one completed record per namespace,
//! retained ten years, with no tombstone after it and released, never uncertain, if a
//! configure dies holding it), so every server node over one store sees the same ones; each
//! node keeps a namespace it has read for a few seconds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idem_core::{CallClaim, Error, Holder, Idempotency, Key, OnLapse};
use idem_wire::NamespaceOut;
use tokio::time::Instant;

use crate::keys::{check_namespace, part};
use crate::service::engine_error;
use crate::wire::ApiError;

/// The name requests without a namespace use. It exists without being configured.
pub const DEFAULT_NAMESPACE: &str = "default";

/// The scope of the namespace records' keys.
const SCOPE: &str = "idem-server.namespaces";

/// How long a namespace's record is kept: the longest retention a store takes.
const FOREVER: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// How long a node answers from a namespace it has read: a change made through another node
/// (`require_token`) is seen within this.
const FRESH_FOR: Duration = Duration::from_secs(5);

/// How many times a configure that races another starts over.
const TRIES: usize = 8;

/// A namespace a request runs in.
#[derive(Debug, Clone)]
pub struct Namespace {
    /// Its name (the scope of its keys, and the label of its metrics).
    pub scope: Arc<str>,
    /// Whether complete and abort need the claim's token here.
    pub require_token: bool,
}

/// The namespaces, read through the engine and kept briefly per node.
pub struct Namespaces {
    engine: Idempotency,
    /// Whether the default namespace (and so every namespace) requires tokens.
    require_token: bool,
    seen: Mutex<HashMap<String, (Namespace, Instant)>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn key_of(name: &str) -> Result<Key, ApiError> {
    Key::derive(SCOPE, "", &part(name)).map_err(|e| ApiError::invalid("name", e))
}

fn decode(bytes: &[u8]) -> Result<NamespaceOut, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::server(
            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
            "corrupt",
            format!("a namespace record does not parse: {e}"),
        )
    })
}

impl Namespaces {
    /// The namespaces of `engine`'s store; `require_token` makes every namespace require
    /// tokens.
    pub fn new(engine: Idempotency, require_token: bool) -> Namespaces {
        Namespaces {
            engine,
            require_token,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// A namespace as stored, if it is.
    pub async fn get(&self, name: &str) -> Result<Option<NamespaceOut>, ApiError> {
        check_namespace(name, "name")?;
        match self
            .engine
            .holder(&key_of(name)?)
            .await
            .map_err(engine_error)?
        {
            Holder::Completed(bytes) => decode(&bytes).map(Some),
            // A record that is not a namespace's settings (one being written, or one an older
            // server left as a tombstone or uncertain) configures nothing.
            _ if name == DEFAULT_NAMESPACE => Ok(Some(NamespaceOut {
                name: name.to_owned(),
                created: 0,
                updated: 0,
                require_token: self.require_token,
            })),
            Holder::Absent
            | Holder::Claimed(_)
            | Holder::Uncertain { .. }
            | Holder::Expired { .. } => Ok(None),
        }
    }

    /// The namespace a request names (the default one when it names none); `400 not_found`
    /// when it is not configured.
    pub async fn resolve(&self, name: Option<&str>) -> Result<Namespace, ApiError> {
        let name = name.unwrap_or(DEFAULT_NAMESPACE);
        check_namespace(name, "namespace")?;
        let known = self.lock().get(name).cloned();
        if let Some((ns, at)) = &known
            && at.elapsed() < FRESH_FOR
        {
            return Ok(ns.clone());
        }
        let Some(stored) = self.get(name).await? else {
            // Namespaces are never deleted: one this node has seen is being rewritten by a
            // configure (its record is replaced), and keeps its last settings meanwhile.
            if let Some((ns, _)) = known {
                return Ok(ns);
            }
            // Diom's answer, word for word; the server's log names the namespace.
            tracing::debug!(namespace = name, "no such namespace: configure it first");
            return Err(ApiError::not_found());
        };
        let ns = Namespace {
            scope: Arc::from(part(name).as_ref()),
            require_token: self.require_token || stored.require_token,
        };
        self.lock()
            .insert(name.to_owned(), (ns.clone(), Instant::now()));
        Ok(ns)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Namespace, Instant)>> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Creates or updates a namespace (Diom's configure is an upsert); `require_token` absent
    /// keeps what the namespace had (off for a new one).
    pub async fn configure(
        &self,
        name: &str,
        require_token: Option<bool>,
    ) -> Result<NamespaceOut, ApiError> {
        check_namespace(name, "name")?;
        let key = key_of(name)?;
        // Bounded: a configure that meets another one starts over, at most TRIES times.
        for _ in 0..TRIES {
            let now = now_ms();
            let next = match self.engine.holder(&key).await.map_err(engine_error)? {
                Holder::Completed(bytes) => {
                    let old = decode(&bytes)?;
                    self.engine.evict(&key).await.map_err(engine_error)?;
                    NamespaceOut {
                        updated: now,
                        require_token: require_token.unwrap_or(old.require_token),
                        ..old
                    }
                }
                // A record with no settings left in it blocks nothing: namespace records keep
                // no tombstone and are never uncertain, but one written otherwise (by an older
                // server) is evicted and the namespace written anew.
                Holder::Uncertain { .. } | Holder::Expired { .. } => {
                    self.engine.evict(&key).await.map_err(engine_error)?;
                    continue;
                }
                Holder::Absent => NamespaceOut {
                    name: name.to_owned(),
                    created: now,
                    updated: now,
                    require_token: require_token.unwrap_or(false),
                },
                Holder::Claimed(_) => {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            };
            let claim = match self
                .engine
                .call(key)
                .lease(Duration::from_secs(10))
                .on_lapse(OnLapse::Release)
                .claim()
                .await
            {
                Ok(CallClaim::Claimed(claim)) => claim,
                // Another configure got there first: start over from what it wrote. (A tombstone
                // or an uncertain record met here is an older server's: evicted next pass.)
                Ok(CallClaim::Completed(_))
                | Err(
                    Error::Locked { .. }
                    | Error::ResultExpired { .. }
                    | Error::Uncertain { .. }
                    | Error::Abandoned { .. },
                ) => continue,
                Err(e) => return Err(engine_error(e)),
            };
            let bytes = serde_json::to_vec(&next).map_err(|e| {
                ApiError::server(
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    "internal_error",
                    e,
                )
            })?;
            self.engine
                .finish(SCOPE, &claim, bytes)
                .retention(FOREVER)
                .key_retention(Duration::ZERO)
                .await
                .map_err(engine_error)?;
            self.lock().remove(name);
            return Ok(next);
        }
        Err(ApiError::operation(
            axum::http::StatusCode::CONFLICT,
            "conflict",
            format!("namespace `{name}` is being configured by another request; try again"),
        ))
    }
}
