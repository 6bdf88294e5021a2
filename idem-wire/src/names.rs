//! Diom's names, checked as Diom checks them: a key (Diom's `EntityKey`) is 1 to 256 bytes of
//! `[a-zA-Z0-9-/_.=+:]`, a namespace name (`NamespaceName`) the same without `:`. The request
//! types check their `key`, `namespace` and `name` fields with these rules while decoding, with
//! Diom's words, so a refused name fails at its field.
//!
//! ```
//! use idem_wire::names::{key_refusal, namespace_refusal};
//! assert_eq!(key_refusal("orders/1:charge"), None);
//! assert_eq!(key_refusal("").as_deref(), Some("String too short"));
//! assert!(namespace_refusal("a:b").is_some());
//! ```

use serde::de::Error as _;
use serde::{Deserialize, Deserializer};

/// The longest key and namespace name Diom takes, in bytes.
pub const MAX_NAME_LEN: usize = 256;

/// The pattern of a key, as the OpenAPI document states it.
pub const KEY_PATTERN: &str = r"^[a-zA-Z0-9\-/_.=+:]+$";

/// The pattern of a namespace name, as the OpenAPI document states it.
pub const NAMESPACE_PATTERN: &str = r"^[a-zA-Z0-9\-/_.=+]+$";

/// What Diom says of a name its type `kind` refuses (its `string_wrapper!` in
/// crates/diom-core/src/types/mod.rs): too short, too long, or out of its alphabet, where
/// Diom's message shows the key's pattern for both kinds. Lengths are in bytes.
fn refusal(value: &str, kind: &str, extra: &[u8]) -> Option<String> {
    if value.is_empty() {
        return Some("String too short".to_owned());
    }
    if value.len() > MAX_NAME_LEN {
        return Some("String too long".to_owned());
    }
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-/_.=+".contains(&b) || extra.contains(&b);
    (!value.bytes().all(allowed))
        .then(|| format!("{kind} must match the following pattern: {KEY_PATTERN}."))
}

/// Why Diom refuses `key` as a key, in its words; `None` when it takes it.
///
/// ```
/// assert_eq!(idem_wire::names::key_refusal(&"k".repeat(257)).as_deref(), Some("String too long"));
/// ```
pub fn key_refusal(key: &str) -> Option<String> {
    refusal(key, "EntityKey", b":")
}

/// Why Diom refuses `name` as a namespace name, in its words; `None` when it takes it.
///
/// ```
/// assert_eq!(
///     idem_wire::names::namespace_refusal("a:b").as_deref(),
///     Some(r"NamespaceName must match the following pattern: ^[a-zA-Z0-9\-/_.=+:]+$.")
/// );
/// ```
pub fn namespace_refusal(name: &str) -> Option<String> {
    refusal(name, "NamespaceName", b"")
}

/// A key field as Diom's `EntityKey` decodes it.
pub(crate) fn entity_key<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let key = String::deserialize(d)?;
    match key_refusal(&key) {
        Some(why) => Err(D::Error::custom(why)),
        None => Ok(key),
    }
}

/// An optional key field (`null` or absent: none), each key as Diom's `EntityKey` decodes it.
pub(crate) fn optional_entity_key<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<String>, D::Error> {
    let key = Option::<String>::deserialize(d)?;
    match key.as_deref().and_then(key_refusal) {
        Some(why) => Err(D::Error::custom(why)),
        None => Ok(key),
    }
}

/// A namespace name field as Diom's `NamespaceName` decodes it.
pub(crate) fn namespace_name<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let name = String::deserialize(d)?;
    match namespace_refusal(&name) {
        Some(why) => Err(D::Error::custom(why)),
        None => Ok(name),
    }
}

/// An optional namespace name (`null` or absent: none), as Diom's `Option<NamespaceName>`.
pub(crate) fn optional_namespace_name<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<String>, D::Error> {
    let name = Option::<String>::deserialize(d)?;
    match name.as_deref().and_then(namespace_refusal) {
        Some(why) => Err(D::Error::custom(why)),
        None => Ok(name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diom_keys_and_names_are_checked_as_diom_does() {
        for ok in ["foo", "foo/bar:baz", ":baz", "foo/+==", &"k".repeat(256)] {
            assert_eq!(key_refusal(ok), None, "{ok}");
        }
        for bad in ["", "foo bar", "foo&bar", "foo\\bar", "é", &"k".repeat(257)] {
            assert!(key_refusal(bad).is_some(), "{bad}");
        }
        assert_eq!(namespace_refusal("a/b.c"), None);
        assert!(namespace_refusal("a:b").is_some());
    }
}
