//! A store that encrypts what it keeps (feature `encryption`): [`EncryptedStore`] seals every
//! stored result, step result and operation input with AES-256-GCM under keys the application
//! supplies ([`EncryptionKeys`], [`KeyRing`]) before the store it wraps sees them, and opens
//! them again when they are read. docs/encryption.md describes the format, rotation and what
//! each failure does.
//!
//! ```text
//! byte 0          0xE5: the format (version 1)
//! byte 1          n, the key id's length (1 to 255)
//! bytes 2..2+n    the key id, UTF-8
//! 12 bytes        the nonce (random per value)
//! the rest        the ciphertext and its 16-byte tag
//! ```
//!
//! The associated data is the operation's [`Key`] (the digest of scope, caller and client
//! key) and the value's place in the record (the result; a step's position and name; the
//! input's scope), so a sealed value copied onto another record, or onto another step of the
//! same record, does not open.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use async_trait::async_trait;

use super::forward::{Forward, Forwarding};
use super::Store;
use crate::error::{Error, StoreError, StoreErrorKind};
use crate::key::Key;
use crate::record::{Claim, ClaimOutcome, ClaimRequest, Completion, Record, RecordState};
use crate::step::{Abandoned, AbandonedQuery, StepLog, StepState, StepWrite, INPUT_STEP};

const FORMAT: u8 = 0xE5;
const NONCE: usize = 12;
const TAG: usize = 16;
/// The most a sealed value is longer than the value: the head with the longest key id, the
/// nonce and the tag.
pub const ENCRYPTION_OVERHEAD: usize = 2 + 255 + NONCE + TAG;
/// Versions the associated data, so a later format cannot be confused with this one.
const AAD_VERSION: &[u8] = b"idem-encrypted-1";

/// A 256-bit AES key, kept expanded for AES-GCM (so that a read or write does not expand it
/// again). Its `Debug` never prints the key.
///
/// ```
/// use idem::EncryptionKey;
/// let key = EncryptionKey::from_bytes([7; 32]);
/// assert_eq!(format!("{key:?}"), "EncryptionKey(..)");
/// assert!(EncryptionKey::from_slice(&[7; 16]).is_err());
/// ```
#[derive(Clone)]
pub struct EncryptionKey(Arc<Aes256Gcm>);

impl EncryptionKey {
    /// The key from its 32 bytes (from a secret manager or a KMS data key).
    pub fn from_bytes(bytes: [u8; 32]) -> EncryptionKey {
        EncryptionKey(Arc::new(Aes256Gcm::new(&bytes.into())))
    }

    /// The key from a slice, which must be 32 bytes long; otherwise
    /// [`Error::InvalidConfig`].
    pub fn from_slice(bytes: &[u8]) -> Result<EncryptionKey, Error> {
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| {
            Error::InvalidConfig(format!(
                "an encryption key is 32 bytes (AES-256), not {}",
                bytes.len()
            ))
        })?;
        Ok(EncryptionKey::from_bytes(bytes))
    }

    fn cipher(&self) -> &Aes256Gcm {
        &self.0
    }
}

impl fmt::Debug for EncryptionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("EncryptionKey(..)")
    }
}

/// Where an [`EncryptedStore`] gets its keys: the one that seals new values, named by an id
/// that every sealed value carries, and any key by its id to open what was sealed before a
/// rotation. [`KeyRing`] holds them in memory; a provider of your own may fetch them from a
/// secret manager or a KMS (and should cache them: they are asked for on every read and
/// write).
///
/// ```
/// use std::sync::Arc;
/// use idem::{EncryptionKey, EncryptionKeys};
///
/// /// One key, under the id "only".
/// struct One(EncryptionKey);
///
/// impl EncryptionKeys for One {
///     fn current(&self) -> (Arc<str>, EncryptionKey) {
///         (Arc::from("only"), self.0.clone())
///     }
///     fn key(&self, id: &str) -> Option<EncryptionKey> {
///         (id == "only").then(|| self.0.clone())
///     }
/// }
/// let keys = One(EncryptionKey::from_bytes([1; 32]));
/// assert!(keys.key("other").is_none());
/// ```
pub trait EncryptionKeys: Send + Sync + 'static {
    /// The id (1 to 255 bytes of UTF-8) and the key that seal new values.
    fn current(&self) -> (Arc<str>, EncryptionKey);

    /// The key with this id, or `None` when this process does not have it (a read of a value
    /// sealed under it is then a [`StoreErrorKind::KeyUnavailable`] error).
    fn key(&self, id: &str) -> Option<EncryptionKey>;
}

/// Keys held in memory: the current one and older ones kept to open what they sealed.
///
/// ```
/// use idem::{EncryptionKey, EncryptionKeys, KeyRing};
/// let ring = KeyRing::new("2026-12", EncryptionKey::from_bytes([2; 32]))?
///     .with_old("2026-11", EncryptionKey::from_bytes([1; 32]))?;
/// assert_eq!(&*ring.current().0, "2026-12");
/// assert!(ring.key("2026-11").is_some());
/// assert!(KeyRing::new("", EncryptionKey::from_bytes([2; 32])).is_err());
/// # Ok::<(), idem::Error>(())
/// ```
#[derive(Clone)]
pub struct KeyRing {
    current: (Arc<str>, EncryptionKey),
    keys: HashMap<Arc<str>, EncryptionKey>,
}

impl KeyRing {
    /// A ring whose current key is `key`, under `id` (1 to 255 bytes; otherwise
    /// [`Error::InvalidConfig`]).
    pub fn new(id: &str, key: EncryptionKey) -> Result<KeyRing, Error> {
        check_key_id(id)?;
        let id: Arc<str> = Arc::from(id);
        Ok(KeyRing {
            keys: HashMap::from([(id.clone(), key.clone())]),
            current: (id, key),
        })
    }

    /// This ring with an older key, which opens what it sealed and seals nothing new. An id
    /// already in the ring, or one out of range, is [`Error::InvalidConfig`].
    pub fn with_old(mut self, id: &str, key: EncryptionKey) -> Result<KeyRing, Error> {
        check_key_id(id)?;
        if self.keys.contains_key(id) {
            return Err(Error::InvalidConfig(format!(
                "the key ring already holds a key with id {id:?}"
            )));
        }
        self.keys.insert(Arc::from(id), key);
        Ok(self)
    }
}

impl fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut ids: Vec<&str> = self.keys.keys().map(|id| &**id).collect();
        ids.sort_unstable();
        f.debug_struct("KeyRing")
            .field("current", &self.current.0)
            .field("ids", &ids)
            .finish()
    }
}

impl EncryptionKeys for KeyRing {
    fn current(&self) -> (Arc<str>, EncryptionKey) {
        self.current.clone()
    }

    fn key(&self, id: &str) -> Option<EncryptionKey> {
        self.keys.get(id).cloned()
    }
}

fn check_key_id(id: &str) -> Result<(), Error> {
    if id.is_empty() || id.len() > 255 {
        return Err(Error::InvalidConfig(format!(
            "an encryption key id is 1 to 255 bytes, not {} ({id:?})",
            id.len()
        )));
    }
    Ok(())
}

/// A store whose stored results, step results and inputs are encrypted: every value the
/// engine hands it is sealed with AES-256-GCM under the current key of its
/// [`EncryptionKeys`] before the inner store sees it, and opened on the way back. Keys,
/// fingerprints and tokens stay as they are (hashes and random ids); the scope of an
/// operation's input stays in clear, as the stores read it to find abandoned operations.
///
/// A value that does not open is an error, never garbage and never a second run: a value
/// sealed under a key id the provider does not have is [`StoreErrorKind::KeyUnavailable`]; one
/// that fails its check (a wrong key under that id, bytes copied from another record, damage)
/// or that is not encrypted at all is [`StoreErrorKind::Undecryptable`]. The engine does not run
/// a call whose claim fails, so the key stays answered with that error until the key comes
/// back or the record ends. To turn encryption on over a store that already holds plain
/// records, [`read_unencrypted`](Forwarding::read_unencrypted) lets them replay until their
/// retention ends.
///
/// Wrap it outermost: over a store that offloads large results to object storage, so that the
/// objects hold ciphertext too. Each read and write costs one AES-GCM pass over the value and
/// no round trip (docs/encryption.md has the figures).
///
/// ```
/// use idem::{EncryptedStore, EncryptionKey, Error, Idempotency, Key, KeyRing, MemoryStore};
/// use idem::{RecordState, Store};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Error> {
/// let plain = MemoryStore::new();
/// let keys = KeyRing::new("k1", EncryptionKey::from_bytes([9; 32]))?;
/// let engine = Idempotency::new(EncryptedStore::new(plain.clone(), keys));
/// let key = Key::derive("cards", "", "c-1")?;
/// let card = engine.call(key).run(async { Ok::<_, Error>("4242 4242 4242 4242".to_string()) }).await?.into_inner();
/// // What the memory store keeps is ciphertext…
/// let Some(RecordState::Completed(kept)) = plain.get(&key).await?.map(|r| r.state) else {
///     unreachable!("the call completed");
/// };
/// assert!(!kept.response.unwrap().windows(4).any(|w| w == b"4242"));
/// // …and a retry replays the card.
/// let again = engine.call(key).run(async { Ok::<_, Error>(String::new()) }).await?.into_inner();
/// assert_eq!(again, card);
/// # Ok(()) }
/// ```
pub type EncryptedStore<S> = Forwarding<Encryption<S>>;

/// What [`EncryptedStore`] adds to the store it wraps: see there.
pub struct Encryption<S> {
    inner: S,
    keys: Arc<dyn EncryptionKeys>,
    read_unencrypted: bool,
}

impl<S: Store> EncryptedStore<S> {
    /// `inner`, with every value it keeps sealed under `keys`.
    pub fn new(inner: S, keys: impl EncryptionKeys) -> EncryptedStore<S> {
        Forwarding(Encryption {
            inner,
            keys: Arc::new(keys),
            read_unencrypted: false,
        })
    }

    /// The same, with the keys already shared.
    pub fn from_arc_keys(inner: S, keys: Arc<dyn EncryptionKeys>) -> EncryptedStore<S> {
        Forwarding(Encryption {
            inner,
            keys,
            read_unencrypted: false,
        })
    }
}

impl<S> Encryption<S> {
    /// The store it wraps.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S> fmt::Debug for Encryption<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Encryption")
            .field("read_unencrypted", &self.read_unencrypted)
            .finish_non_exhaustive()
    }
}

impl<S: Store> EncryptedStore<S> {
    /// Whether a value that is not encrypted is read as it is (`true`: to turn encryption on
    /// over a store that holds plain records, until their retention ends) or refused as
    /// [`StoreErrorKind::Undecryptable`] (`false`, the default: a plain value where a sealed
    /// one belongs is a value someone wrote around the encryption).
    ///
    /// ```
    /// use idem::{EncryptedStore, EncryptionKey, KeyRing, MemoryStore};
    /// let keys = KeyRing::new("k1", EncryptionKey::from_bytes([9; 32]))?;
    /// let store = EncryptedStore::new(MemoryStore::new(), keys).read_unencrypted(true);
    /// # Ok::<(), idem::Error>(())
    /// ```
    pub fn read_unencrypted(mut self, read: bool) -> EncryptedStore<S> {
        self.0.read_unencrypted = read;
        self
    }
}

/// Where a sealed value sits in its record: part of its associated data.
#[derive(Clone, Copy)]
enum Place<'a> {
    Result,
    Step { position: u32, name: &'a str },
    Input { scope: &'a str },
}

fn aad(key: &Key, place: Place<'_>) -> Vec<u8> {
    let mut aad = Vec::with_capacity(AAD_VERSION.len() + 32 + 8 + 64);
    aad.extend_from_slice(AAD_VERSION);
    aad.extend_from_slice(key.as_bytes());
    match place {
        Place::Result => aad.push(0),
        Place::Step { position, name } => {
            aad.push(1);
            aad.extend_from_slice(&position.to_be_bytes());
            aad.extend_from_slice(name.as_bytes());
        }
        Place::Input { scope } => {
            aad.push(2);
            aad.extend_from_slice(scope.as_bytes());
        }
    }
    aad
}

fn refused(kind: StoreErrorKind, message: String) -> Error {
    Error::Store(StoreError::new(kind, message))
}

impl<S> Encryption<S> {
    fn seal(&self, key: &Key, place: Place<'_>, plain: &[u8]) -> Result<Vec<u8>, Error> {
        let (id, secret) = self.keys.current();
        check_key_id(&id)?;
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let aad = aad(key, place);
        let sealed = secret
            .cipher()
            .encrypt(
                &nonce,
                Payload {
                    msg: plain,
                    aad: &aad,
                },
            )
            .map_err(|_| {
                refused(
                    StoreErrorKind::Undecryptable,
                    format!("AES-GCM refused to seal a value of {} bytes", plain.len()),
                )
            })?;
        let mut out = Vec::with_capacity(2 + id.len() + NONCE + sealed.len());
        out.push(FORMAT);
        out.push(id.len() as u8);
        out.extend_from_slice(id.as_bytes());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    fn open(&self, key: &Key, place: Place<'_>, stored: Vec<u8>) -> Result<Vec<u8>, Error> {
        let Some((id, nonce, sealed)) = split(&stored) else {
            if self.read_unencrypted && stored.first() != Some(&FORMAT) {
                return Ok(stored);
            }
            return Err(refused(
                StoreErrorKind::Undecryptable,
                format!(
                    "a stored value of key {key} is not encrypted (or its head is damaged); \
                     it was written around the encryption. Evict the key, or set \
                     read_unencrypted(true) while plain records from before encryption age out"
                ),
            ));
        };
        let secret = self.keys.key(id).ok_or_else(|| {
            refused(
                StoreErrorKind::KeyUnavailable,
                format!(
                    "the stored value of key {key} is sealed under encryption key {id:?}, which \
                     the key provider does not have; give it the key again (keep old keys until \
                     the records they sealed have ended)"
                ),
            )
        })?;
        let aad = aad(key, place);
        secret
            .cipher()
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: sealed,
                    aad: &aad,
                },
            )
            .map_err(|_| {
                refused(
                    StoreErrorKind::Undecryptable,
                    format!(
                        "the stored value of key {key} does not open under encryption key \
                         {id:?}: the key under that id is not the one that sealed it, or the \
                         value was copied from another record or damaged. Nothing was run; \
                         evict the key to let it run again"
                    ),
                )
            })
    }

    fn open_response(&self, key: &Key, response: &mut Option<Vec<u8>>) -> Result<(), Error> {
        if let Some(stored) = response.take() {
            *response = Some(self.open(key, Place::Result, stored)?);
        }
        Ok(())
    }

    fn open_input(&self, found: Abandoned) -> Result<Abandoned, Error> {
        let input = self.open(
            &found.key,
            Place::Input {
                scope: &found.scope,
            },
            found.input,
        )?;
        Ok(Abandoned { input, ..found })
    }
}

/// The key id, nonce and ciphertext of a sealed value, or `None` when it is not one.
fn split(stored: &[u8]) -> Option<(&str, &[u8], &[u8])> {
    let (&format, rest) = stored.split_first()?;
    let (&len, rest) = rest.split_first()?;
    let len = usize::from(len);
    if format != FORMAT || len == 0 || rest.len() < len + NONCE + TAG {
        return None;
    }
    let (id, rest) = rest.split_at(len);
    let (nonce, sealed) = rest.split_at(NONCE);
    Some((std::str::from_utf8(id).ok()?, nonce, sealed))
}

#[async_trait]
impl<S: Store> Forward for Encryption<S> {
    fn inner(&self) -> &dyn Store {
        &self.inner
    }

    fn max_response_bytes(&self) -> Option<usize> {
        self.inner
            .max_response_bytes()
            .map(|most| most.saturating_sub(ENCRYPTION_OVERHEAD))
    }

    async fn claim(&self, request: ClaimRequest<'_>) -> Result<ClaimOutcome, Error> {
        let key = *request.key;
        let mut outcome = self.inner.claim(request).await?;
        if let ClaimOutcome::Completed(stored) = &mut outcome {
            self.open_response(&key, &mut stored.response)?;
        }
        Ok(outcome)
    }

    async fn complete(&self, claim: &Claim, completion: Completion<'_>) -> Result<(), Error> {
        let sealed = match completion.response {
            Some(plain) => Some(self.seal(claim.key(), Place::Result, plain)?),
            None => None,
        };
        let completion = Completion {
            response: sealed.as_deref(),
            ..completion
        };
        self.inner.complete(claim, completion).await
    }

    async fn get(&self, key: &Key) -> Result<Option<Record>, Error> {
        let mut record = self.inner.get(key).await?;
        if let Some(Record {
            state: RecordState::Completed(stored),
            ..
        }) = &mut record
        {
            self.open_response(key, &mut stored.response)?;
        }
        Ok(record)
    }

    async fn begin_steps(&self, claim: &Claim, retention: Duration) -> Result<StepLog, Error> {
        let mut log = self.inner.begin_steps(claim, retention).await?;
        for step in &mut log.steps {
            let StepState::Finished(stored) = &mut step.state else {
                continue;
            };
            let stored = std::mem::take(stored);
            let opened = if step.name == INPUT_STEP {
                let found = self.open_input(Abandoned::decode(*claim.key(), &stored)?)?;
                Abandoned::encode_input(&found.scope, &found.input)
            } else {
                let place = Place::Step {
                    position: step.position,
                    name: &step.name,
                };
                self.open(claim.key(), place, stored)?
            };
            step.state = StepState::Finished(opened);
        }
        Ok(log)
    }

    async fn write_step(&self, claim: &Claim, step: StepWrite<'_>) -> Result<(), Error> {
        let Some(plain) = step.result else {
            return self.inner.write_step(claim, step).await;
        };
        let sealed = if step.name == INPUT_STEP {
            let given = Abandoned::decode(*claim.key(), plain)?;
            let place = Place::Input {
                scope: &given.scope,
            };
            let input = self.seal(claim.key(), place, &given.input)?;
            Abandoned::encode_input(&given.scope, &input)
        } else {
            let place = Place::Step {
                position: step.position,
                name: step.name,
            };
            self.seal(claim.key(), place, plain)?
        };
        let step = StepWrite {
            result: Some(&sealed),
            ..step
        };
        self.inner.write_step(claim, step).await
    }

    async fn find_abandoned(&self, query: AbandonedQuery<'_>) -> Result<Vec<Abandoned>, Error> {
        self.inner
            .find_abandoned(query)
            .await?
            .into_iter()
            .map(|found| self.open_input(found))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    fn ring(id: &str, byte: u8) -> KeyRing {
        KeyRing::new(id, EncryptionKey::from_bytes([byte; 32])).unwrap_or_else(|e| panic!("{e}"))
    }

    fn key(client: &str) -> Key {
        Key::derive("cards", "", client).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn a_sealed_value_opens_in_its_place_only() {
        let store = EncryptedStore::new(MemoryStore::new(), ring("k1", 1));
        let a = key("a");
        let sealed = store.seal(&a, Place::Result, b"secret").unwrap();
        assert_eq!(&sealed[..4], &[FORMAT, 2, b'k', b'1']);
        assert_eq!(sealed.len(), 2 + 2 + NONCE + 6 + TAG);
        assert!(!sealed.windows(6).any(|w| w == b"secret"));
        assert_eq!(
            store.open(&a, Place::Result, sealed.clone()).unwrap(),
            b"secret"
        );
        let elsewhere = [
            (key("b"), Place::Result),
            (
                a,
                Place::Step {
                    position: 0,
                    name: "x",
                },
            ),
            (a, Place::Input { scope: "cards" }),
        ];
        for (k, place) in elsewhere {
            let e = store.open(&k, place, sealed.clone()).unwrap_err();
            assert!(matches!(&e, Error::Store(s) if s.kind() == StoreErrorKind::Undecryptable));
        }
        // Two seals of one value differ (a nonce each).
        assert_ne!(store.seal(&a, Place::Result, b"secret").unwrap(), sealed);
    }

    #[test]
    fn damaged_plain_and_unknown_values_are_typed() {
        let store = EncryptedStore::new(MemoryStore::new(), ring("k1", 1));
        let a = key("a");
        let mut sealed = store.seal(&a, Place::Result, b"secret").unwrap();
        let last = sealed.len() - 1;
        sealed[last] ^= 1;
        let kind = |r: Result<Vec<u8>, Error>| match r {
            Err(Error::Store(e)) => e.kind(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            kind(store.open(&a, Place::Result, sealed)),
            StoreErrorKind::Undecryptable
        );
        assert_eq!(
            kind(store.open(&a, Place::Result, b"\xE1plain".to_vec())),
            StoreErrorKind::Undecryptable
        );
        let other = EncryptedStore::new(MemoryStore::new(), ring("k2", 2));
        let by_other = other.seal(&a, Place::Result, b"secret").unwrap();
        assert_eq!(
            kind(store.open(&a, Place::Result, by_other)),
            StoreErrorKind::KeyUnavailable
        );
        let lenient = EncryptedStore::new(MemoryStore::new(), ring("k1", 1)).read_unencrypted(true);
        assert_eq!(
            lenient
                .open(&a, Place::Result, b"\xE1plain".to_vec())
                .unwrap(),
            b"\xE1plain"
        );
    }

    #[test]
    fn key_ids_and_lengths_are_checked() {
        assert!(KeyRing::new(&"x".repeat(256), EncryptionKey::from_bytes([0; 32])).is_err());
        assert!(ring("a", 1)
            .with_old("a", EncryptionKey::from_bytes([0; 32]))
            .is_err());
        assert!(EncryptionKey::from_slice(&[0; 31]).is_err());
        assert!(EncryptionKey::from_slice(&[0; 32]).is_ok());
        let debug = format!(
            "{:?}",
            ring("b", 1)
                .with_old("a", EncryptionKey::from_bytes([0; 32]))
                .unwrap()
        );
        assert_eq!(debug, r#"KeyRing { current: "b", ids: ["a", "b"] }"#);
    }
}
