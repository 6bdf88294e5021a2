//! The bodies of Diom's namespace routes and of the health ping: the server's own, which
//! `RemoteStore` does not call.

use serde::{Deserialize, Serialize};

use crate::names::namespace_name;

/// `POST /api/v1.idempotency.namespace.configure`
/// ([`route::NAMESPACE_CONFIGURE`](crate::route::NAMESPACE_CONFIGURE), admin token): create or
/// change a namespace. Answered with [`NamespaceOut`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigureNamespaceIn {
    /// The namespace's name.
    #[serde(deserialize_with = "namespace_name")]
    pub name: String,
    /// Fenced extension: refuse complete and abort without a token in this namespace. Absent:
    /// unchanged (off for a new namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_token: Option<bool>,
}

/// `POST /api/v1.idempotency.namespace.get`
/// ([`route::NAMESPACE_GET`](crate::route::NAMESPACE_GET), admin token). Answered with
/// [`NamespaceOut`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetNamespaceIn {
    /// The namespace's name.
    #[serde(deserialize_with = "namespace_name")]
    pub name: String,
}

/// A namespace as `namespace.configure` and `namespace.get` answer it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespaceOut {
    /// Its name.
    pub name: String,
    /// When it was first configured, in Unix milliseconds.
    pub created: u64,
    /// When it was last configured, in Unix milliseconds.
    pub updated: u64,
    /// Fenced extension: whether complete and abort need a token here.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub require_token: bool,
}

/// `{"ok": true}`: what the health ping answers ([`route::PING`](crate::route::PING)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingOut {
    /// Always true.
    pub ok: bool,
}
