//! Operation keys and request fingerprints.
//!
//! A [`Key`] names one operation: SHA-256 over the length-prefixed parts `(scope, caller,
//! client_key)`. Length prefixes make `("a:b", "c")` and `("a", "b:c")` differ. A
//! [`Fingerprint`] is SHA-256 of the canonical request payload and detects a key that a client
//! reused for a different request.

use std::borrow::Cow;
use std::fmt;
use std::rc::Rc;
use std::sync::Arc;

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::canonical::{to_canonical, FingerprintError};

/// The longest client key, scope or caller accepted, in bytes.
pub const MAX_KEY_LEN: usize = 255;

/// Why a scope, caller or client key was refused.
///
/// ```
/// use idem::{Key, KeyError};
/// assert_eq!(Key::derive("deposit", "", ""), Err(KeyError::Empty { part: "client key" }));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The part is empty.
    #[error("the {part} is empty: send 1 to 255 printable ASCII characters")]
    Empty {
        /// Which part: "scope", "caller" or "client key".
        part: &'static str,
    },
    /// The part is longer than [`MAX_KEY_LEN`] bytes.
    #[error("the {part} is {len} bytes long; at most 255 bytes are allowed")]
    TooLong {
        /// Which part.
        part: &'static str,
        /// Its length in bytes.
        len: usize,
    },
    /// The part holds a byte outside printable ASCII (0x20..=0x7E).
    #[error("the {part} holds byte 0x{byte:02x} at offset {offset}; only printable ASCII (0x20..=0x7E) is allowed")]
    NotPrintable {
        /// Which part.
        part: &'static str,
        /// The first offending byte.
        byte: u8,
        /// Its offset.
        offset: usize,
    },
}

fn check(part: &'static str, value: &str, allow_empty: bool) -> Result<(), KeyError> {
    if value.is_empty() {
        return if allow_empty {
            Ok(())
        } else {
            Err(KeyError::Empty { part })
        };
    }
    if value.len() > MAX_KEY_LEN {
        return Err(KeyError::TooLong {
            part,
            len: value.len(),
        });
    }
    match value
        .bytes()
        .enumerate()
        .find(|(_, b)| !(0x20..=0x7e).contains(b))
    {
        Some((offset, byte)) => Err(KeyError::NotPrintable { part, byte, offset }),
        None => Ok(()),
    }
}

/// Checks that `client_key` is a valid client key: 1..=255 bytes of printable ASCII.
///
/// ```
/// assert!(idem::validate_client_key("order-42").is_ok());
/// assert!(idem::validate_client_key("tab\there").is_err());
/// ```
pub fn validate_client_key(client_key: &str) -> Result<(), KeyError> {
    check("client key", client_key, false)
}

/// Checks a scope as [`Key::derive`] does, for configuration read before any key is derived.
pub fn check_scope(scope: &str) -> Result<(), KeyError> {
    check("scope", scope, false)
}

/// The identity of one operation: SHA-256 over the length-prefixed `(scope, caller, client_key)`.
///
/// - `scope` names the operation (`"deposit"`). Renaming a scope forgets every key stored under
///   the old name.
/// - `caller` is who asks (tenant, user, token id); it may be empty. Two callers sending the same
///   client key never share a record.
/// - `client_key` is what the caller sent: a request id, an `Idempotency-Key` header, a message id.
///
/// ```
/// use idem::Key;
/// let a = Key::derive("a:b", "", "c")?;
/// let b = Key::derive("a", "", "b:c")?;
/// assert_ne!(a, b);
/// assert_eq!(a, Key::derive("a:b", "", "c")?);
/// # Ok::<(), idem::KeyError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key([u8; 32]);

/// Hashes the key as two 128-bit words: the same 32 bytes the derived impl hashes, without its
/// length prefix and byte-slice loop (a fifth of a memory-store claim went to hashing keys).
impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let (low, high) = self.words();
        state.write_u128(low);
        state.write_u128(high);
    }
}

/// A map keyed by [`Key`]s, hashed with foldhash (seeded per process) rather than SipHash: a key
/// is already a digest, and SipHash cost more than the rest of a memory-store lookup.
pub(crate) type KeyMap<V> = std::collections::HashMap<Key, V, foldhash::fast::RandomState>;

impl Key {
    /// The 32 bytes as two little-endian 128-bit words.
    pub(crate) fn words(&self) -> (u128, u128) {
        let mut low = [0u8; 16];
        let mut high = [0u8; 16];
        low.copy_from_slice(&self.0[..16]);
        high.copy_from_slice(&self.0[16..]);
        (u128::from_le_bytes(low), u128::from_le_bytes(high))
    }

    /// Derives the key of `client_key` sent by `caller` for the operation `scope`.
    ///
    /// Scope and client key must be 1..=255 bytes of printable ASCII; the caller may be empty.
    pub fn derive(scope: &str, caller: &str, client_key: &str) -> Result<Key, KeyError> {
        check("scope", scope, false)?;
        check("caller", caller, true)?;
        validate_client_key(client_key)?;
        let mut h = Sha256::new();
        h.update(b"idem/v1");
        for part in [scope, caller, client_key] {
            h.update((part.len() as u64).to_be_bytes());
            h.update(part.as_bytes());
        }
        Ok(Key(h.finalize().into()))
    }

    /// Rebuilds a key from its 32 stored bytes (as a store reads it back).
    ///
    /// ```
    /// # use idem::Key;
    /// let k = Key::derive("s", "", "k")?;
    /// assert_eq!(Key::from_bytes(*k.as_bytes()), k);
    /// # Ok::<(), idem::KeyError>(())
    /// ```
    pub const fn from_bytes(bytes: [u8; 32]) -> Key {
        Key(bytes)
    }

    /// A key to pass to a provider that takes an idempotency key of its own (Stripe's
    /// `Idempotency-Key`, a payment network's request id) for this operation's effect, or for
    /// its step `step`: `idem-` and 64 hex digits of SHA-256 over this key (and the step's
    /// name). The same on every attempt and after a takeover, so the provider applies the
    /// effect once, and a reconciler can ask it about that key; unrelated to the client's own
    /// key, which never reaches the provider.
    ///
    /// ```
    /// use idem::Key;
    /// let key = Key::derive("charge", "alice", "req-1")?;
    /// let op = key.provider_key(None);
    /// assert!(op.starts_with("idem-") && op.len() == 69);
    /// assert_ne!(op, key.provider_key(Some("charge")));
    /// assert_eq!(key.provider_key(Some("charge")), key.provider_key(Some("charge")));
    /// # Ok::<(), idem::KeyError>(())
    /// ```
    pub fn provider_key(&self, step: Option<&str>) -> String {
        let mut h = Sha256::new();
        h.update(b"idem/provider/v1");
        h.update(self.0);
        if let Some(step) = step {
            h.update((step.len() as u64).to_be_bytes());
            h.update(step.as_bytes());
        }
        let digest: [u8; 32] = h.finalize().into();
        let mut out = String::with_capacity(69);
        out.push_str("idem-");
        for b in digest {
            use std::fmt::Write;
            let _ = write!(out, "{b:02x}");
        }
        out
    }

    /// The 32 bytes of the digest, as stores keep them.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

fn hex(bytes: &[u8], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    bytes.iter().try_for_each(|b| write!(f, "{b:02x}"))
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Key(")?;
        hex(&self.0[..8], f)?;
        f.write_str("…)")
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        hex(&self.0, f)
    }
}

/// SHA-256 of the canonical request payload, with the version of the policy that made it;
/// detects a key reused for another request.
///
/// Its 32 bytes are the first 28 of the digest (SHA-224's strength) and the policy version,
/// big-endian: so every record that keeps a fingerprint keeps the version of the policy it was
/// stored under, on every store, in the bytes it kept before. Two fingerprints whose digests
/// differ are different requests ([`Error::KeyReused`](crate::Error::KeyReused)), or, when
/// their versions differ too, the same request fingerprinted by two policies
/// ([`Error::PolicyChanged`](crate::Error::PolicyChanged)); two with the same digest match
/// whatever their versions (docs/architecture.md, "Policy versions").
///
/// ```
/// use idem::Fingerprint;
/// #[derive(serde::Serialize)]
/// struct Deposit { account: u32, cents: u64 }
/// let a = Fingerprint::of_json(&Deposit { account: 1, cents: 500 })?;
/// let b = Fingerprint::of_json(&serde_json::json!({ "cents": 500, "account": 1 }))?;
/// assert_eq!(a, b); // key order does not matter
/// # Ok::<(), idem::FingerprintError>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fingerprint([u8; 32]);

/// How many of a fingerprint's bytes are its digest; the rest is its policy version.
const DIGEST: usize = 28;

impl Fingerprint {
    /// SHA-256 of raw bytes.
    ///
    /// ```
    /// # use idem::Fingerprint;
    /// assert_eq!(Fingerprint::of_bytes(b"x"), Fingerprint::of_bytes(b"x"));
    /// ```
    pub fn of_bytes(bytes: &[u8]) -> Fingerprint {
        let mut out: [u8; 32] = Sha256::digest(bytes).into();
        out[DIGEST..].fill(0);
        Fingerprint(out)
    }

    /// This fingerprint, made under policy `version` (0 by default). Set it when what is
    /// fingerprinted changes (a field added to the request's fingerprint, another canonical
    /// form), so a retry across the change gets [`Error::PolicyChanged`](crate::Error::PolicyChanged)
    /// instead of [`Error::KeyReused`](crate::Error::KeyReused).
    ///
    /// ```
    /// use idem::Fingerprint;
    /// let v2 = Fingerprint::of_bytes(b"x").with_policy(2);
    /// assert_eq!(v2.policy(), 2);
    /// assert!(v2.same_request(&Fingerprint::of_bytes(b"x")));
    /// ```
    pub const fn with_policy(mut self, version: u32) -> Fingerprint {
        let v = version.to_be_bytes();
        let mut i = 0;
        while i < 4 {
            self.0[DIGEST + i] = v[i];
            i += 1;
        }
        self
    }

    /// The version of the policy this fingerprint was made under.
    ///
    /// ```
    /// assert_eq!(idem::Fingerprint::of_bytes(b"x").policy(), 0);
    /// ```
    pub const fn policy(&self) -> u32 {
        let b = &self.0;
        u32::from_be_bytes([b[DIGEST], b[DIGEST + 1], b[DIGEST + 2], b[DIGEST + 3]])
    }

    /// Whether both fingerprint the same request: their digests match, whatever their policy
    /// versions.
    ///
    /// ```
    /// use idem::Fingerprint;
    /// assert!(!Fingerprint::of_bytes(b"x").same_request(&Fingerprint::of_bytes(b"y")));
    /// ```
    pub fn same_request(&self, other: &Fingerprint) -> bool {
        self.0[..DIGEST] == other.0[..DIGEST]
    }

    /// SHA-256 of the canonical form of `value`: two encodings of the same request hash alike,
    /// two different requests never do.
    ///
    /// The canonical form is compact JSON with object keys sorted, extended where JSON would
    /// collapse two values:
    ///
    /// | value | written as |
    /// |---|---|
    /// | integers of any width, `i128` and `u128` included | exact decimal, the same for every width: `1`, `-7`, `340282366920938463463374607431768211455` |
    /// | finite floats (`f32` widened to `f64` exactly) | the shortest text that reads back as the same `f64`: `0.1`, `1.0`, `-0.0`, `1e+16` |
    /// | NaN, +∞, −∞ | `NaN`, `Infinity`, `-Infinity` (all NaNs are one value) |
    /// | strings and chars | JSON strings |
    /// | `None`, `()`, unit structs | `null`; inside `Some` marked once per `Some` (`?null`), so `Some(None)` differs from `None` |
    /// | `Some(x)`, newtype structs | as `x` |
    /// | sequences, tuples, byte strings | `[…]` |
    /// | maps and structs | `{key:value,…}`, each key in its own canonical form, so the integer key `1` differs from the string key `"1"`; string keys first in the order of their text, then other keys in the order of their form |
    /// | enum variants | as serde_json writes them: `"Unit"`, `{"Newtype":x}`, `{"Tuple":[…]}`, `{"Struct":{…}}` |
    ///
    /// So a struct hashes like a JSON object with the same fields and values.
    ///
    /// The canonical form is part of every stored record: when an upgrade changes it, records
    /// stored by the older build keep their old fingerprints, so a retry sent across the upgrade
    /// with a payload whose form changed gets [`Error::KeyReused`](crate::Error::KeyReused)
    /// (HTTP 422).
    ///
    /// ```
    /// use idem::Fingerprint;
    /// use std::collections::BTreeMap;
    /// let big = Fingerprint::of_json(&100_000_000_000_000_000_001_u128)?;
    /// assert_ne!(big, Fingerprint::of_json(&100_000_000_000_000_000_000_u128)?);
    /// assert_ne!(Fingerprint::of_json(&f64::NAN)?, Fingerprint::of_json(&())?);
    /// let int_key = BTreeMap::from([(1, "a")]);
    /// let str_key = BTreeMap::from([("1", "a")]);
    /// assert_ne!(Fingerprint::of_json(&int_key)?, Fingerprint::of_json(&str_key)?);
    /// # Ok::<(), idem::FingerprintError>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`FingerprintError::TooDeep`] when `value` nests deeper than [`MAX_FINGERPRINT_DEPTH`](crate::MAX_FINGERPRINT_DEPTH)
    /// levels, [`FingerprintError::Serialize`] when its `Serialize` implementation fails.
    pub fn of_json<T: Serialize + ?Sized>(value: &T) -> Result<Fingerprint, FingerprintError> {
        Ok(Fingerprint::of_bytes(&to_canonical(value)?))
    }

    /// A fingerprint of policy version 0 from a SHA-256 `digest` computed elsewhere (a
    /// transport hashing a request as it streams by): its first 28 bytes are kept.
    ///
    /// ```
    /// use idem::Fingerprint;
    /// let f = Fingerprint::from_digest([0xab; 32]);
    /// assert_eq!(f.policy(), 0);
    /// assert!(f.same_request(&Fingerprint::from_digest([0xab; 32]).with_policy(3)));
    /// ```
    pub const fn from_digest(digest: [u8; 32]) -> Fingerprint {
        Fingerprint(digest).with_policy(0)
    }

    /// Rebuilds a fingerprint from its stored bytes (digest and policy version as they were
    /// kept).
    ///
    /// ```
    /// # use idem::Fingerprint;
    /// let f = Fingerprint::of_bytes(b"x");
    /// assert_eq!(Fingerprint::from_bytes(*f.as_bytes()), f);
    /// ```
    pub const fn from_bytes(bytes: [u8; 32]) -> Fingerprint {
        Fingerprint(bytes)
    }

    /// The 32 bytes stores keep: 28 of the digest, then the policy version.
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprint(")?;
        hex(&self.0[..8], f)?;
        f.write_str("…)")
    }
}

/// A claim's fencing token: random 128 bits, unique across a key's whole history.
///
/// A store changes a record on `complete`, `abort` or `renew` only while it still carries the
/// claim's token, so a worker whose lease was taken over can never overwrite the new owner.
///
/// A token must be unique, not secret. In a library it leaves the process only into the store,
/// and whoever can read the store can write it too. idem-server's fenced mode hands it to the
/// client that made the claim; every request that uses it is authenticated as the caller, and
/// names a key in that caller's own key space. So a client that guessed another's token could
/// act only on keys it may already complete or evict itself. So the token comes from a
/// per-thread generator (`fastrand`, seeded at random once per thread), not from the operating
/// system: a `getrandom` system call per claim cost about a fifth of the memory store's whole
/// claim.
///
/// ```
/// use idem::Token;
/// assert_ne!(Token::random(), Token::random());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Token(u128);

impl Token {
    /// A fresh random token, with no system call.
    pub fn random() -> Token {
        Token(fastrand::u128(..))
    }

    /// Rebuilds a token from its 16 stored bytes.
    ///
    /// ```
    /// # use idem::Token;
    /// let t = Token::random();
    /// assert_eq!(Token::from_bytes(t.to_bytes()), t);
    /// ```
    pub const fn from_bytes(bytes: [u8; 16]) -> Token {
        Token(u128::from_be_bytes(bytes))
    }

    /// The 16 bytes stores keep.
    pub const fn to_bytes(self) -> [u8; 16] {
        self.0.to_be_bytes()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({:08x}…)", (self.0 >> 96) as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_prefixes_separate_parts() {
        let a = Key::derive("a:b", "", "c").unwrap();
        let b = Key::derive("a", "", "b:c").unwrap();
        let c = Key::derive("a", "b", "c").unwrap();
        assert_ne!(a, b);
        assert_ne!(b, c);
    }

    #[test]
    fn callers_are_separate() {
        assert_ne!(
            Key::derive("s", "alice", "k").unwrap(),
            Key::derive("s", "bob", "k").unwrap()
        );
    }

    /// One alphabet for every way in: printable ASCII, the space included.
    #[test]
    fn client_keys_are_printable_ascii_space_included() {
        for byte in 0..=0x7f_u8 {
            let key = format!("a{}b", char::from(byte));
            let printable = (0x20..=0x7e).contains(&byte);
            assert_eq!(validate_client_key(&key).is_ok(), printable, "{byte:#x}");
        }
        assert!(Key::derive("charge", "", " order 42 ").is_ok());
    }

    #[test]
    fn bad_client_keys_are_typed() {
        assert_eq!(
            validate_client_key(""),
            Err(KeyError::Empty { part: "client key" })
        );
        assert_eq!(
            validate_client_key(&"x".repeat(256)),
            Err(KeyError::TooLong {
                part: "client key",
                len: 256
            })
        );
        assert!(validate_client_key(&"x".repeat(255)).is_ok());
        assert_eq!(
            validate_client_key("ab\u{7f}"),
            Err(KeyError::NotPrintable {
                part: "client key",
                byte: 0x7f,
                offset: 2
            })
        );
        assert!(matches!(
            validate_client_key("é"),
            Err(KeyError::NotPrintable { .. })
        ));
        assert!(Key::derive("", "", "k").is_err());
    }

    #[test]
    fn fingerprint_is_canonical() {
        let a = Fingerprint::of_json(&serde_json::json!({"a": 1, "b": {"y": 2, "x": 1}})).unwrap();
        let v: serde_json::Value =
            serde_json::from_str(r#"{ "b": {"x":1,"y":2}, "a":1 }"#).unwrap();
        assert_eq!(a, Fingerprint::of_json(&v).unwrap());
        assert_ne!(
            a,
            Fingerprint::of_json(&serde_json::json!({"a": 2})).unwrap()
        );
    }
}

/// A value that can be part of a key: what `key = …` and `caller = …` of `#[idempotent]` take.
///
/// Text in every form users hold it (`str`, `String`, `Box<str>`, `Arc<str>`, `Rc<str>`,
/// `Cow<str>`), the integer types (as decimal text) and `uuid::Uuid` (hyphenated, lower case)
/// are key parts, and so are references to them and an `Option` of one: `None` means "no key"
/// (the call runs without deduplication) or "no caller" (the caller is empty).
///
/// A function generic over its key bounds it by `KeyPart` (with `#[idempotent]`:
/// `async fn ship<K: idem::KeyPart>(engine: &Idempotency, id: K)` and `key = id`):
///
/// ```
/// use idem::{Key, KeyError, KeyPart};
///
/// fn key_of<K: KeyPart>(id: K) -> Result<Option<Key>, KeyError> {
///     id.key_part().map(|id| Key::derive("ship", "", &id)).transpose()
/// }
///
/// let by_str = key_of("order-1")?;
/// assert_eq!(by_str, key_of(String::from("order-1"))?);
/// assert_eq!(by_str, key_of(std::sync::Arc::<str>::from("order-1"))?);
/// assert_eq!(key_of(42_u64)?, key_of("42")?);
/// assert_eq!(key_of(None::<&str>)?, None);
/// # Ok::<(), KeyError>(())
/// ```
///
/// `K: Into<String>` is not enough: the key is read from a borrow before the body runs (so the
/// body may still move the argument), and `Into<String>` can only consume its value. Every type
/// that is `Into<String>` and holds text (`&str`, `String`, `Box<str>`, `Cow<str>`) is a
/// `KeyPart`; for another type, implement `KeyPart` or format it into a `String` first.
///
/// ```
/// use std::borrow::Cow;
/// use idem::KeyPart;
///
/// struct OrderNo(u64);
///
/// impl KeyPart for OrderNo {
///     fn key_part(&self) -> Option<Cow<'_, str>> {
///         Some(Cow::Owned(format!("order-{}", self.0)))
///     }
/// }
///
/// assert_eq!(OrderNo(7).key_part().as_deref(), Some("order-7"));
/// assert_eq!(Some(7_u8).key_part().as_deref(), Some("7"));
/// assert_eq!(None::<&str>.key_part(), None);
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be part of an idempotency key",
    label = "not text, an integer or a UUID",
    note = "`key` and `caller` take an `idem::KeyPart`: `&str`, `String`, `Box<str>`, `Arc<str>`, `Cow<str>`, an integer, a `uuid::Uuid`, or an `Option` of one; implement `idem::KeyPart` for your type or format it into a `String` first"
)]
pub trait KeyPart {
    /// The text of the part, or `None` for no part.
    fn key_part(&self) -> Option<Cow<'_, str>>;
}

/// Text lends itself, in whatever form it is held.
macro_rules! key_part_str {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn key_part(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Borrowed(self))
            }
        }
    )*};
}
key_part_str!(str, String, Box<str>, Arc<str>, Rc<str>, Cow<'_, str>);

impl KeyPart for uuid::Uuid {
    fn key_part(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Owned(self.hyphenated().to_string()))
    }
}

macro_rules! key_part_display {
    ($($t:ty),*) => {$(
        impl KeyPart for $t {
            fn key_part(&self) -> Option<Cow<'_, str>> {
                Some(Cow::Owned(self.to_string()))
            }
        }
    )*};
}
key_part_display!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize);

impl<T: KeyPart + ?Sized> KeyPart for &T {
    fn key_part(&self) -> Option<Cow<'_, str>> {
        (**self).key_part()
    }
}

impl<T: KeyPart> KeyPart for Option<T> {
    fn key_part(&self) -> Option<Cow<'_, str>> {
        self.as_ref().and_then(KeyPart::key_part)
    }
}
