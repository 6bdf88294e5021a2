//! The object store's side: uploading a result as a new object, reading one back checked, and
//! deleting the objects of ended hours; object_store's errors as idem's.

use std::error::Error as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures_util::stream::FuturesOrdered;
use futures_util::{StreamExt, TryStreamExt};
use idem_core::{Error, Key, StoreError, StoreErrorKind};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload};
use sha2::{Digest, Sha256};

use crate::hours::{self, Hour};
use crate::pointer::{corrupt, Pointer};

/// Multipart uploads keep this many parts in flight: the copies the upload holds beside the
/// result are at most this many parts.
const PARTS_IN_FLIGHT: usize = 2;

/// The objects of one [`OffloadStore`](crate::OffloadStore): where they go and how they are
/// written.
pub(crate) struct Objects {
    pub(crate) store: Arc<dyn ObjectStore>,
    pub(crate) prefix: Path,
    pub(crate) part_size: usize,
    /// Set once the object store answered that it cannot create an object only if it is absent
    /// (an S3-compatible store with conditional puts off): later uploads overwrite instead, which
    /// their unique names make equivalent.
    create_refused: AtomicBool,
}

impl Objects {
    pub(crate) fn new(store: Arc<dyn ObjectStore>, prefix: Path, part_size: usize) -> Objects {
        Objects {
            store,
            prefix,
            part_size,
            create_refused: AtomicBool::new(false),
        }
    }

    /// A new object's location: `<prefix>/<hour its retention ends>/<key>.<128 random bits>`,
    /// as `idem/2026-11-29T13/5f0c…e1.7d2a…90`.
    pub(crate) fn location(&self, key: &Key, ends: SystemTime) -> Path {
        let id = uuid::Uuid::new_v4().simple();
        self.prefix
            .clone()
            .join(hours::name(hours::hour_of(ends)))
            .join(format!("{key}.{id}"))
    }

    /// Uploads `bytes` as a new object at `location`; the pointer to it. One `PUT` (mode
    /// create) for a result of at most a part, else a multipart upload of parts of
    /// `part_size`, [`PARTS_IN_FLIGHT`] at a time, each copied from `bytes` only as it is sent.
    pub(crate) async fn upload(&self, location: Path, bytes: &[u8]) -> Result<Pointer, Error> {
        let mut digest = Sha256::new();
        if bytes.len() <= self.part_size {
            digest.update(bytes);
            self.put(&location, Bytes::copy_from_slice(bytes)).await?;
        } else {
            self.put_parts(&location, bytes, &mut digest).await?;
        }
        Ok(Pointer {
            size: bytes.len() as u64,
            sha256: digest.finalize().into(),
            location,
        })
    }

    async fn put(&self, location: &Path, bytes: Bytes) -> Result<(), Error> {
        let payload = PutPayload::from(bytes);
        if !self.create_refused.load(Ordering::Relaxed) {
            let create = PutOptions {
                mode: PutMode::Create,
                ..PutOptions::default()
            };
            match self.store.put_opts(location, payload.clone(), create).await {
                Ok(_) => return Ok(()),
                Err(object_store::Error::NotImplemented { .. }) => {
                    tracing::info!(
                        store = %self.store,
                        "the object store cannot create an object only if it is absent; \
                         offloaded results are written with a plain put (their names are unique)"
                    );
                    self.create_refused.store(true, Ordering::Relaxed);
                }
                Err(e) => return Err(object_error("write", location, e)),
            }
        }
        self.store
            .put_opts(location, payload, PutOptions::default())
            .await
            .map(drop)
            .map_err(|e| object_error("write", location, e))
    }

    async fn put_parts(
        &self,
        location: &Path,
        bytes: &[u8],
        digest: &mut Sha256,
    ) -> Result<(), Error> {
        let mut upload = self
            .store
            .put_multipart(location)
            .await
            .map_err(|e| object_error("start the multipart upload of", location, e))?;
        // At most PARTS_IN_FLIGHT parts are copied out at a time: the next is copied only
        // once the oldest has been sent (the others keep going meanwhile).
        let sent = async {
            let mut in_flight = FuturesOrdered::new();
            for part in bytes.chunks(self.part_size) {
                if in_flight.len() >= PARTS_IN_FLIGHT {
                    in_flight.try_next().await?;
                }
                digest.update(part);
                in_flight
                    .push_back(upload.put_part(PutPayload::from(Bytes::copy_from_slice(part))));
            }
            // Bounded: each pass takes one of the parts pushed above.
            while in_flight.try_next().await?.is_some() {}
            Ok::<_, object_store::Error>(())
        }
        .await;
        let done = match sent {
            Ok(()) => upload.complete().await.map(drop),
            Err(e) => Err(e),
        };
        if let Err(e) = done {
            if let Err(abort) = upload.abort().await {
                tracing::warn!(%location, error = %abort, "aborting a failed multipart upload failed; the object store may keep its parts until a lifecycle rule removes them");
            }
            return Err(object_error("write", location, e));
        }
        Ok(())
    }

    /// The object `pointer` names, checked: its size and SHA-256 must be the pointer's. Read
    /// into one buffer of its size. A missing object or other bytes are
    /// [`StoreErrorKind::Corrupt`], never a replay.
    pub(crate) async fn download(&self, pointer: &Pointer) -> Result<Vec<u8>, Error> {
        let location = &pointer.location;
        let got = match self.store.get(location).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(corrupt(format!(
                    "the offloaded result at {location} is missing from {}: it was deleted (a \
                     bucket lifecycle rule shorter than the retention, a manual delete) or \
                     another object store is configured; its record cannot replay it, so evict \
                     the key to run the work again",
                    self.store
                )))
            }
            Err(e) => return Err(object_error("read", location, e)),
        };
        if got.meta.size != pointer.size {
            return Err(replaced(
                location,
                &format!(
                    "it holds {} bytes where its record says {}",
                    got.meta.size, pointer.size
                ),
            ));
        }
        let bytes = got
            .bytes()
            .await
            .map_err(|e| object_error("read", location, e))?;
        if bytes.len() as u64 != pointer.size {
            return Err(replaced(
                location,
                &format!(
                    "{} bytes were read where its record says {}",
                    bytes.len(),
                    pointer.size
                ),
            ));
        }
        if Sha256::digest(&bytes).as_slice() != pointer.sha256 {
            return Err(replaced(location, "its SHA-256 is not its record's"));
        }
        Ok(Vec::from(bytes))
    }

    /// Deletes the object at `location` if it can; it is otherwise an orphan that
    /// [`prune_ended`](Self::prune_ended) removes with its hour.
    pub(crate) async fn delete_quietly(&self, location: &Path) {
        match self.store.delete(location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => {
                tracing::warn!(%location, error = %e, "deleting an offloaded result no record points at failed; the pruner removes it once its hour has ended")
            }
        }
    }

    /// Deletes at most `limit` objects of the hours that ended before `cutoff`, oldest hour
    /// first; how many went. One listing of the prefix's hours, then per ended hour one listing
    /// and its deletes (batched by the object store: S3 deletes up to 1,000 per request).
    pub(crate) async fn prune_ended(&self, cutoff: SystemTime, limit: u64) -> Result<u64, Error> {
        if limit == 0 {
            return Ok(0);
        }
        let listed = self
            .store
            .list_with_delimiter(Some(&self.prefix))
            .await
            .map_err(|e| object_error("list", &self.prefix, e))?;
        let mut ended: Vec<(Hour, Path)> = listed
            .common_prefixes
            .into_iter()
            .filter_map(|dir| Some((hours::parse(dir.filename()?)?, dir)))
            .filter(|(hour, _)| hours::end_of(*hour) <= cutoff)
            .collect();
        ended.sort();
        let mut deleted = 0;
        for (_, dir) in ended {
            if deleted >= limit {
                break;
            }
            let room = usize::try_from(limit - deleted).unwrap_or(usize::MAX);
            let doomed = self
                .store
                .list(Some(&dir))
                .take(room)
                .map_ok(|o| o.location);
            let mut gone = self.store.delete_stream(doomed.boxed());
            while let Some(result) = gone.next().await {
                match result {
                    Ok(_) => deleted += 1,
                    Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(object_error("delete ended objects under", &dir, e)),
                }
            }
        }
        Ok(deleted)
    }
}

/// The object at `location` was replaced or damaged: `why`.
fn replaced(location: &Path, why: &str) -> Error {
    corrupt(format!(
        "the offloaded result at {location} is not the one its record points at ({why}): the \
         object was overwritten or damaged; its record cannot replay it, so evict the key to \
         run the work again"
    ))
}

/// An object store's failure to `action` the object (or prefix) at `location`, as a
/// [`StoreError`] of the kind its variant says: a refused credential is
/// [`Unauthorized`](StoreErrorKind::Unauthorized), a request the store cannot serve (an
/// operation or path it does not support) [`Query`](StoreErrorKind::Query), a name taken
/// [`Transient`](StoreErrorKind::Transient) (the next try takes another), a full or read-only
/// disk under a local directory [`Full`](StoreErrorKind::Full) or
/// [`ReadOnly`](StoreErrorKind::ReadOnly), anything else (a connection refused or cut, an
/// answer of 5xx after object_store's retries) [`Unavailable`](StoreErrorKind::Unavailable).
pub(crate) fn object_error(action: &str, location: &Path, e: object_store::Error) -> Error {
    use object_store::Error as E;
    let kind = match &e {
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => StoreErrorKind::Unauthorized,
        E::NotSupported { .. }
        | E::NotImplemented { .. }
        | E::InvalidPath { .. }
        | E::UnknownConfigurationKey { .. } => StoreErrorKind::Query,
        E::AlreadyExists { .. } | E::Precondition { .. } | E::NotModified { .. } => {
            StoreErrorKind::Transient
        }
        E::NotFound { .. } => StoreErrorKind::Corrupt,
        _ => io_kind(&e).unwrap_or(StoreErrorKind::Unavailable),
    };
    Error::Store(StoreError::new(
        kind,
        format!("the object store could not {action} {location}: {e}"),
    ))
}

/// The kind of the I/O error under `e`, if a full disk or a read-only file system caused it.
fn io_kind(e: &object_store::Error) -> Option<StoreErrorKind> {
    let mut cause = e.source();
    // Bounded by the chain of sources, which ends.
    while let Some(error) = cause {
        if let Some(io) = error.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::StorageFull => Some(StoreErrorKind::Full),
                std::io::ErrorKind::ReadOnlyFilesystem => Some(StoreErrorKind::ReadOnly),
                std::io::ErrorKind::PermissionDenied => Some(StoreErrorKind::Unauthorized),
                _ => None,
            };
        }
        cause = error.source();
    }
    None
}

/// When the objects of an hour that ended before it may go: `now` less the grace.
pub(crate) fn cutoff(now: SystemTime, grace: Duration) -> SystemTime {
    now.checked_sub(grace).unwrap_or(SystemTime::UNIX_EPOCH)
}
