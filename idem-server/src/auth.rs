//! Bearer tokens: the admin's and the callers'. A token is kept only as its SHA-256 digest and
//! compared in constant time with every known one (no early exit, equal-length digests), so
//! neither its bytes nor its length leak through timing; it is never logged or shown.

use std::fmt;

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::wire::ApiError;

/// Who sent a request.
#[derive(Clone, PartialEq, Eq)]
pub enum Caller {
    /// The admin token: configures namespaces; its keys live in the admin's own key space.
    Admin,
    /// A caller token, by the caller's name: its keys live in its own key space.
    Named(String),
}

impl Caller {
    /// The caller part of the keys this caller uses (docs/server.md, "Key spaces"): the admin's
    /// and each named caller's are distinct, whatever the names.
    pub fn key_space(&self) -> String {
        match self {
            Caller::Admin => "admin".to_owned(),
            Caller::Named(name) => format!("caller:{name}"),
        }
    }

    /// Whether this caller may configure and read namespaces.
    pub fn is_admin(&self) -> bool {
        matches!(self, Caller::Admin)
    }
}

impl fmt::Debug for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Caller::Admin => f.write_str("admin"),
            Caller::Named(name) => write!(f, "caller {name}"),
        }
    }
}

/// The tokens the server knows, as digests.
#[derive(Clone)]
pub struct Tokens {
    known: Vec<([u8; 32], Caller)>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokens")
            .field(
                "callers",
                &self.known.iter().map(|(_, c)| c).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// The shortest admin or caller token the server takes, in bytes (`RemoteStore`'s builder
/// refuses a shorter one: `idem::RemoteStoreBuilder::MIN_TOKEN_LEN`).
///
/// ```
/// assert!(idem_server::auth::Tokens::new(&"a".repeat(idem_server::auth::MIN_TOKEN_LEN - 1), &[]).is_err());
/// ```
pub const MIN_TOKEN_LEN: usize = 16;

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A caller token given as `NAME=TOKEN` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadCallerToken(pub String);

impl fmt::Display for BadCallerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadCallerToken {}

impl Tokens {
    /// The admin token and the callers' `NAME=TOKEN` pairs. A caller name is 1 to 64 of
    /// `[A-Za-z0-9_.-]`; a token at least 16 characters; no two tokens alike.
    ///
    /// ```
    /// use idem_server::auth::Tokens;
    /// let tokens = Tokens::new("an-admin-token-of-some-length", &["billing=a-billing-token-0123".into()])?;
    /// # let _ = tokens; Ok::<(), idem_server::auth::BadCallerToken>(())
    /// ```
    pub fn new(admin: &str, callers: &[String]) -> Result<Tokens, BadCallerToken> {
        let mut known = vec![(digest(admin), Caller::Admin)];
        if admin.len() < MIN_TOKEN_LEN {
            return Err(BadCallerToken(format!(
                "the admin token must be at least {MIN_TOKEN_LEN} characters"
            )));
        }
        for pair in callers {
            let Some((name, token)) = pair.split_once('=') else {
                return Err(BadCallerToken(
                    "a caller token is given as NAME=TOKEN".into(),
                ));
            };
            let name_ok = (1..=64).contains(&name.len())
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
            if !name_ok {
                return Err(BadCallerToken(format!(
                    "caller name {name:?}: use 1 to 64 of A-Z a-z 0-9 _ . -"
                )));
            }
            if token.len() < MIN_TOKEN_LEN {
                return Err(BadCallerToken(format!(
                    "the token of caller {name} must be at least {MIN_TOKEN_LEN} characters"
                )));
            }
            let d = digest(token);
            if known.iter().any(|(k, _)| *k == d) {
                return Err(BadCallerToken(format!(
                    "the token of caller {name} is used twice"
                )));
            }
            known.push((d, Caller::Named(name.to_owned())));
        }
        Ok(Tokens { known })
    }

    /// The caller whose token `headers` carry as `Authorization: Bearer TOKEN`: Diom's `401
    /// auth_required` when there is no such header, `401 invalid_token` when the token is
    /// unknown.
    pub fn caller(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.trim().split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            })
            .ok_or_else(ApiError::auth_required)?;
        let presented = digest(presented);
        // Every known digest is compared, whichever matches.
        let mut found = None;
        for (known, caller) in &self.known {
            if bool::from(known.ct_eq(&presented)) {
                found = Some(caller);
            }
        }
        found.cloned().ok_or_else(ApiError::invalid_token)
    }
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn with(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        h
    }

    #[test]
    fn bearer_tokens_name_their_caller() {
        let tokens = Tokens::new(
            "admin-token-0123456789",
            &["billing=billing-token-0123456789".into()],
        )
        .unwrap();
        assert_eq!(
            tokens
                .caller(&with("Bearer admin-token-0123456789"))
                .unwrap(),
            Caller::Admin
        );
        assert_eq!(
            tokens
                .caller(&with("bearer billing-token-0123456789"))
                .unwrap(),
            Caller::Named("billing".into())
        );
        for (refused, code) in [
            (HeaderMap::new(), "auth_required"),
            (with("Bearer admin-token-012345678"), "invalid_token"),
            (with("Basic admin-token-0123456789"), "auth_required"),
            (with("admin-token-0123456789"), "auth_required"),
        ] {
            let e = tokens.caller(&refused).unwrap_err();
            assert_eq!((e.status.as_u16(), e.body.code.as_str()), (401, code));
        }
    }

    #[test]
    fn unusable_tokens_are_refused_at_start() {
        assert!(Tokens::new("short", &[]).is_err());
        let admin = "admin-token-0123456789";
        for bad in [
            "noequals",
            "=token-0123456789abcdef",
            "a b=token-0123456789abcdef",
            "x=short",
        ] {
            assert!(Tokens::new(admin, &[bad.into()]).is_err(), "{bad}");
        }
        assert!(Tokens::new(admin, &[format!("x={admin}")]).is_err());
    }
}
