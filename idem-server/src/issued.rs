//! The tokens of the claims this node made for token-less starts.
//!
//! Diom's clients send no token back: their `complete` and `abort` act on whichever claim holds
//! the key, which the server would find by reading the record first (`Idempotency::holder`) and
//! then completing or releasing that claim under its token. A node that made the claim itself
//! (the common case: the client's `start` and `complete` reach the same node) keeps its token
//! here, and acts under it at once: one store operation instead of two (docs/server.md, "Round
//! trips"). Whatever the token finds is what the read would have found, so the answers do not
//! change: if the claim changed hands since (its lease ran out and another caller started the
//! key, or it was completed or released), the store refuses the token (`LeaseLost`) and the
//! request goes on as before, from the read.
//!
//! Only claims that are released when their lease runs out are kept: a token-less `complete` or
//! `abort` must not end an uncertain key, and a claim made with `on_lapse: uncertain` may become
//! one. The map is bounded; past its bound, tokens whose lease has ended are dropped, and a node
//! that still has no room keeps none (its requests then read first, as without the map).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use idem_core::{Key, Token};

/// How many tokens a node keeps at most: about 7 MiB.
pub(crate) const MAX_ISSUED: usize = 65_536;

/// The tokens of this node's live token-less claims, by key.
pub(crate) struct Issued {
    tokens: Mutex<HashMap<[u8; 32], (Token, Instant)>>,
    max: usize,
}

impl Issued {
    /// An empty map that keeps at most `max` tokens.
    pub(crate) fn new(max: usize) -> Issued {
        Issued {
            tokens: Mutex::new(HashMap::new()),
            max,
        }
    }

    /// Keeps `token`, which claimed `key` for `lease`.
    pub(crate) fn remember(&self, key: &Key, token: Token, lease: Duration) {
        let now = Instant::now();
        let until = now.checked_add(lease).unwrap_or(now);
        let mut tokens = self.lock();
        if tokens.len() >= self.max && !tokens.contains_key(key.as_bytes()) {
            tokens.retain(|_, (_, until)| *until > now);
            if tokens.len() >= self.max {
                return;
            }
        }
        tokens.insert(*key.as_bytes(), (token, until));
    }

    /// The token this node claimed `key` with, if it kept one; taken out, since the request
    /// that asks ends the claim or finds it changed hands.
    pub(crate) fn take(&self, key: &Key) -> Option<Token> {
        self.lock().remove(key.as_bytes()).map(|(token, _)| token)
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<[u8; 32], (Token, Instant)>> {
        // A panic while the lock was held cannot leave the map half-changed (each change is
        // one call on it): use it as it is.
        self.tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> Key {
        Key::derive("issued", "", &format!("k{n}")).unwrap()
    }

    #[test]
    fn a_token_is_taken_once() {
        let issued = Issued::new(8);
        let token = Token::random();
        issued.remember(&key(1), token, Duration::from_secs(30));
        assert_eq!(issued.take(&key(2)), None);
        assert_eq!(issued.take(&key(1)), Some(token));
        assert_eq!(issued.take(&key(1)), None);
    }

    #[test]
    fn a_claim_made_again_replaces_the_token() {
        let issued = Issued::new(1);
        let (first, second) = (Token::random(), Token::random());
        issued.remember(&key(1), first, Duration::from_secs(30));
        issued.remember(&key(1), second, Duration::from_secs(30));
        assert_eq!(issued.take(&key(1)), Some(second));
    }

    #[test]
    fn past_the_bound_ended_leases_make_room_and_live_ones_are_kept() {
        let issued = Issued::new(2);
        let live = Token::random();
        issued.remember(&key(1), live, Duration::from_secs(30));
        // A lease of zero has ended by the next call.
        issued.remember(&key(2), Token::random(), Duration::ZERO);
        let third = Token::random();
        issued.remember(&key(3), third, Duration::from_secs(30));
        assert_eq!(issued.take(&key(2)), None, "the ended lease made room");
        assert_eq!(issued.take(&key(3)), Some(third));

        // Full of live leases: the new token is not kept, the old ones are.
        issued.remember(&key(3), third, Duration::from_secs(30));
        issued.remember(&key(4), Token::random(), Duration::from_secs(30));
        assert_eq!(issued.take(&key(4)), None);
        assert_eq!(issued.take(&key(1)), Some(live));
        assert_eq!(issued.take(&key(3)), Some(third));
    }
}
