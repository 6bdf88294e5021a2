//! [`ReplayHeaders`]: which response headers the HTTP layer stores and replays.

use http::HeaderName;

use crate::capture::stored::{is_hop_by_hop, HeaderRule};
use idem_core::Error;

/// Which end-to-end headers of a handler's response the HTTP layer stores with it, and so which
/// a replay carries: all but a deny list ([`deny`](Self::deny)), or only an allow list
/// ([`allow`](Self::allow)), set with
/// [`LayerBuilder::replay_headers`](super::LayerBuilder::replay_headers). Header names are
/// case-insensitive; [`build`](super::LayerBuilder::build) refuses one that is not a header
/// name with [`Error::InvalidConfig`].
///
/// The default ([`Default`]) is the deny list [`DEFAULT_DENIED`](Self::DEFAULT_DENIED): the
/// headers that describe the first exchange rather than its result, which the client that
/// retries should not get again: `Set-Cookie` (a session minted for the first request),
/// `Date` and `Age` (its moment), the rate-limit headers and `Retry-After` (the quota at that
/// moment), the ids that name the first request in traces (`X-Request-Id`, `traceparent`,
/// `tracestate`) and `Server-Timing` (its timings). Everything else is replayed as it came:
/// `Content-Type`, `Location`, `ETag`, your own headers, every value of a repeated one, in
/// order, byte for byte.
///
/// Whatever the rule:
///
/// - the first client gets the handler's response with every header; the rule decides only
///   what is stored, and so what a retry gets;
/// - hop-by-hop headers (`Connection` and those it names, `Keep-Alive`, `Transfer-Encoding`,
///   …) are never stored;
/// - a replay carries `idempotent-replayed: true`, which the layer adds;
/// - the rule applies again when a stored response is replayed, so a rule narrowed in a deploy
///   also holds for the responses stored before it (a header a wider rule dropped cannot come
///   back: it was never stored);
/// - a header the rule drops is simply absent from the replay: nothing fails, nothing is
///   logged. An allow list that leaves out `Content-Type` (or `Content-Encoding`, behind a
///   compression layer inside this one) replays the same body bytes without what says how to
///   read them.
///
/// The trailers of a response are stored as they came; the rule is about its headers.
///
/// ```
/// use idem::http::{IdempotencyLayer, ReplayHeaders};
/// use idem::{Idempotency, MemoryStore};
///
/// // The default: all but the headers of the first exchange.
/// let default = ReplayHeaders::default();
/// assert!(!default.keeps("Set-Cookie") && !default.keeps("x-ratelimit-remaining"));
/// assert!(default.keeps("location") && default.keeps("x-payment-status"));
///
/// // The default and one header more.
/// let more = ReplayHeaders::deny(ReplayHeaders::DEFAULT_DENIED.into_iter().chain(["X-Debug"]));
/// assert!(!more.keeps("x-debug") && !more.keeps("set-cookie"));
///
/// // Only what the API documents.
/// let only = ReplayHeaders::allow(["Content-Type", "Location", "ETag"]);
/// assert!(only.keeps("etag") && !only.keeps("x-internal"));
///
/// let layer = IdempotencyLayer::builder(Idempotency::new(MemoryStore::new()))
///     .caller(|parts| Some(parts.headers.get("x-api-key")?.to_str().ok()?.to_owned()))
///     .replay_headers(only)
///     .build()?;
/// # let _ = layer;
/// # Ok::<(), idem::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayHeaders {
    list: List,
    /// The names as given; checked (and lowercased) by [`check`](Self::check).
    names: Vec<String>,
}

/// What [`ReplayHeaders`]' names are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum List {
    /// The only headers stored.
    Allow,
    /// The headers not stored.
    Deny,
}

impl ReplayHeaders {
    /// The headers the default rule does not store, in lowercase: those that describe the first
    /// exchange rather than its result.
    ///
    /// | headers | why a retry should not get them again |
    /// |---|---|
    /// | `set-cookie` | a session or credential minted for the first request: replayed, it hands that session to whoever retries with the key, or restores one the client has since replaced or ended |
    /// | `date`, `age` | the moment of the first response; the server writes the replay's own `Date` |
    /// | `retry-after`, `ratelimit`, `ratelimit-policy`, `ratelimit-limit`, `ratelimit-remaining`, `ratelimit-reset`, `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset` | the client's quota at the first response, which a replay would report wrong (a rate-limit layer outside this one sets the replay's own) |
    /// | `x-request-id`, `traceparent`, `tracestate`, `server-timing` | the first request's id and timings: a replay is another request, and the first one's id would send whoever looks it up to the wrong exchange |
    ///
    /// ```
    /// use idem::http::ReplayHeaders;
    /// assert!(ReplayHeaders::DEFAULT_DENIED.contains(&"set-cookie"));
    /// assert_eq!(ReplayHeaders::default(), ReplayHeaders::deny(ReplayHeaders::DEFAULT_DENIED));
    /// ```
    pub const DEFAULT_DENIED: [&'static str; 16] = [
        "set-cookie",
        "date",
        "age",
        "retry-after",
        "ratelimit",
        "ratelimit-policy",
        "ratelimit-limit",
        "ratelimit-remaining",
        "ratelimit-reset",
        "x-ratelimit-limit",
        "x-ratelimit-remaining",
        "x-ratelimit-reset",
        "x-request-id",
        "traceparent",
        "tracestate",
        "server-timing",
    ];

    /// Stores only these headers (names in any case), and so replays only them: an allow list.
    /// An empty list stores none: a replay carries the status, the body, the trailers and
    /// `idempotent-replayed: true`. [`build`](super::LayerBuilder::build) refuses a name that
    /// is not a header name, and a hop-by-hop header (`Connection`, `Transfer-Encoding`, …),
    /// which is never stored.
    ///
    /// ```
    /// use idem::http::ReplayHeaders;
    /// use http::header::{CONTENT_TYPE, LOCATION};
    /// let rule = ReplayHeaders::allow([CONTENT_TYPE, LOCATION]);
    /// assert!(rule.keeps("Location") && !rule.keeps("set-cookie"));
    /// ```
    pub fn allow<I>(names: I) -> ReplayHeaders
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        ReplayHeaders::list(List::Allow, names)
    }

    /// Stores every end-to-end header but these (names in any case): a deny list, which takes
    /// the place of the default one ([`DEFAULT_DENIED`](Self::DEFAULT_DENIED); chain it in to
    /// extend it). [`build`](super::LayerBuilder::build) refuses a name that is not a header
    /// name.
    ///
    /// ```
    /// use idem::http::ReplayHeaders;
    /// let rule = ReplayHeaders::deny(["Set-Cookie", "X-Internal-Trace"]);
    /// assert!(!rule.keeps("x-internal-trace") && rule.keeps("date"));
    /// ```
    pub fn deny<I>(names: I) -> ReplayHeaders
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        ReplayHeaders::list(List::Deny, names)
    }

    /// Stores every end-to-end header, `Set-Cookie` and the others of
    /// [`DEFAULT_DENIED`](Self::DEFAULT_DENIED) included: the layer's behaviour before this
    /// rule existed. Only for an API whose retries may get the first exchange's cookies and
    /// rate-limit figures.
    ///
    /// ```
    /// use idem::http::ReplayHeaders;
    /// assert!(ReplayHeaders::all().keeps("set-cookie"));
    /// assert!(!ReplayHeaders::all().keeps("transfer-encoding")); // hop-by-hop: never stored
    /// ```
    pub fn all() -> ReplayHeaders {
        ReplayHeaders {
            list: List::Deny,
            names: Vec::new(),
        }
    }

    /// Whether a response's header `name` (in any case) is stored and replayed under this
    /// rule: never for a hop-by-hop header.
    ///
    /// ```
    /// use idem::http::ReplayHeaders;
    /// let rule = ReplayHeaders::allow(["x-payment-status"]);
    /// assert!(rule.keeps("X-Payment-Status"));
    /// assert!(!rule.keeps("content-type"));
    /// ```
    pub fn keeps(&self, name: &str) -> bool {
        if is_hop_by_hop(name) {
            return false;
        }
        let listed = self.names.iter().any(|n| n.eq_ignore_ascii_case(name));
        match self.list {
            List::Allow => listed,
            List::Deny => !listed,
        }
    }

    fn list<I>(list: List, names: I) -> ReplayHeaders
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        ReplayHeaders {
            list,
            names: names.into_iter().map(|n| n.as_ref().to_owned()).collect(),
        }
    }

    /// The rule the layer applies, once every name is checked: a header name (lowercased), and
    /// in an allow list not a hop-by-hop one.
    pub(crate) fn check(&self) -> Result<HeaderRule, Error> {
        let mut names: Vec<HeaderName> = Vec::with_capacity(self.names.len());
        for given in &self.names {
            let name = HeaderName::from_bytes(given.as_bytes()).map_err(|_| {
                Error::InvalidConfig(format!(
                    "HTTP layer replay_headers: {given:?} is not a header name; give each \
                     name alone, such as \"set-cookie\" or \"x-request-id\" (letters, digits \
                     and !#$%&'*+-.^_`|~, without spaces, a colon or a value)"
                ))
            })?;
            if self.list == List::Allow && is_hop_by_hop(name.as_str()) {
                return Err(Error::InvalidConfig(format!(
                    "HTTP layer replay_headers: the allow list names {given:?}, a hop-by-hop \
                     header, which describes one connection and is never stored; remove it"
                )));
            }
            if !names.contains(&name) {
                names.push(name);
            }
        }
        Ok(match self.list {
            List::Allow => HeaderRule::Allow(names),
            List::Deny => HeaderRule::Deny(names),
        })
    }
}

/// The deny list [`DEFAULT_DENIED`](ReplayHeaders::DEFAULT_DENIED).
impl Default for ReplayHeaders {
    fn default() -> ReplayHeaders {
        ReplayHeaders::deny(ReplayHeaders::DEFAULT_DENIED)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_and_lowercased() {
        let rule = ReplayHeaders::allow(["Content-Type", "X-Custom", "x-custom"]);
        assert_eq!(
            rule.check().unwrap(),
            HeaderRule::Allow(vec![
                HeaderName::from_static("content-type"),
                HeaderName::from_static("x-custom"),
            ])
        );
        let Ok(HeaderRule::Deny(default)) = ReplayHeaders::default().check() else {
            panic!("the default is a deny list");
        };
        assert_eq!(default.len(), ReplayHeaders::DEFAULT_DENIED.len());
        assert_eq!(
            ReplayHeaders::all().check().unwrap(),
            HeaderRule::Deny(vec![])
        );
        // A hop-by-hop header in a deny list changes nothing, and is taken.
        assert!(ReplayHeaders::deny(["Connection"]).check().is_ok());
    }

    #[test]
    fn a_bad_name_is_refused_naming_it() {
        for bad in ["", "x custom", "set-cookie: a=1", "x-é", "x\n"] {
            for rule in [ReplayHeaders::allow([bad]), ReplayHeaders::deny([bad])] {
                let Err(Error::InvalidConfig(message)) = rule.check() else {
                    panic!("{rule:?} is taken");
                };
                assert!(message.contains("replay_headers"), "{message}");
                assert!(message.contains(&format!("{bad:?}")), "{message}");
            }
        }
        for hop in ["Connection", "transfer-encoding", "Upgrade"] {
            let rule = ReplayHeaders::allow(["content-type", hop]);
            let Err(Error::InvalidConfig(message)) = rule.check() else {
                panic!("{rule:?} is taken");
            };
            assert!(message.contains("hop-by-hop"), "{message}");
            assert!(message.contains(hop), "{message}");
        }
    }

    #[test]
    fn keeps_reads_names_in_any_case() {
        let deny = ReplayHeaders::deny(["X-Secret"]);
        assert!(!deny.keeps("x-secret") && !deny.keeps("X-SECRET") && deny.keeps("x-other"));
        let allow = ReplayHeaders::allow(["location"]);
        assert!(allow.keeps("LOCATION") && !allow.keeps("content-type"));
        assert!(!ReplayHeaders::allow(["te"]).keeps("te"));
        for name in ReplayHeaders::DEFAULT_DENIED {
            assert!(!ReplayHeaders::default().keeps(&name.to_ascii_uppercase()));
        }
    }
}
