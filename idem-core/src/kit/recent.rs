//! A bounded set of the most recent request ids, kept inside an aggregate.

use std::collections::VecDeque;
use std::num::NonZeroUsize;

use serde::{Deserialize, Serialize};

use super::Recorded;

/// The last `capacity` request ids an aggregate has applied, oldest first.
///
/// For stores without transactions: keep it in the aggregate's own row or document, and save it
/// together with the change it guards, with a versioned update. A concurrent duplicate then
/// conflicts, reloads, and finds its id. Only the last `capacity` ids are remembered; a
/// duplicate arriving after that many newer requests is applied again, so size it to the
/// retry window of your clients. Lookups scan the set: keep it to hundreds, not millions.
///
/// It serialises as `{"capacity": N, "ids": [...]}`; deserialising checks that the ids are
/// distinct and fit the capacity.
///
/// ```
/// use std::num::NonZeroUsize;
/// use idem::kit::{RecentIds, Recorded};
/// let mut recent = RecentIds::new(NonZeroUsize::new(2).unwrap());
/// assert_eq!(recent.insert("a"), Recorded::New);
/// assert_eq!(recent.insert("b"), Recorded::New);
/// assert_eq!(recent.insert("a"), Recorded::Duplicate);
/// assert_eq!(recent.insert("c"), Recorded::New); // evicts "a", the oldest
/// assert!(!recent.contains("a"));
///
/// let json = serde_json::to_string(&recent)?;
/// assert_eq!(json, r#"{"capacity":2,"ids":["b","c"]}"#);
/// assert_eq!(serde_json::from_str::<RecentIds>(&json)?, recent);
/// # Ok::<(), serde_json::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Stored")]
pub struct RecentIds {
    capacity: NonZeroUsize,
    ids: VecDeque<String>,
}

/// The serialised shape, checked before it becomes a [`RecentIds`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Stored {
    capacity: NonZeroUsize,
    ids: VecDeque<String>,
}

impl TryFrom<Stored> for RecentIds {
    type Error = String;

    fn try_from(stored: Stored) -> Result<RecentIds, String> {
        if stored.ids.len() > stored.capacity.get() {
            return Err(format!(
                "{} recent ids stored for a capacity of {}",
                stored.ids.len(),
                stored.capacity
            ));
        }
        for (i, id) in stored.ids.iter().enumerate() {
            if stored.ids.iter().skip(i + 1).any(|other| other == id) {
                return Err(format!("recent id {id:?} is stored twice"));
            }
        }
        Ok(RecentIds {
            capacity: stored.capacity,
            ids: stored.ids,
        })
    }
}

impl Default for RecentIds {
    /// Remembers the last 100 ids.
    fn default() -> RecentIds {
        RecentIds::new(NonZeroUsize::MIN.saturating_add(99))
    }
}

impl RecentIds {
    /// An empty set remembering at most `capacity` ids.
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// let recent = idem::kit::RecentIds::new(NonZeroUsize::new(10).unwrap());
    /// assert!(recent.is_empty());
    /// assert_eq!(recent.capacity(), 10);
    /// ```
    pub fn new(capacity: NonZeroUsize) -> RecentIds {
        RecentIds {
            capacity,
            ids: VecDeque::with_capacity(capacity.get().min(1024)),
        }
    }

    /// Records `id`: [`Recorded::New`] when it was not among the recent ids (it is added, and
    /// the oldest id is evicted when the set is full), [`Recorded::Duplicate`] when it was (the
    /// set is unchanged).
    ///
    /// ```
    /// use idem::kit::{RecentIds, Recorded};
    /// let mut recent = RecentIds::default();
    /// assert_eq!(recent.insert("req-1"), Recorded::New);
    /// assert_eq!(recent.insert("req-1"), Recorded::Duplicate);
    /// ```
    pub fn insert(&mut self, id: &str) -> Recorded {
        if self.contains(id) {
            return Recorded::Duplicate;
        }
        if self.ids.len() == self.capacity.get() {
            self.ids.pop_front();
        }
        self.ids.push_back(id.to_owned());
        Recorded::New
    }

    /// Whether `id` is among the recent ids.
    ///
    /// ```
    /// let mut recent = idem::kit::RecentIds::default();
    /// let _ = recent.insert("x");
    /// assert!(recent.contains("x") && !recent.contains("y"));
    /// ```
    pub fn contains(&self, id: &str) -> bool {
        self.ids.iter().any(|seen| seen == id)
    }

    /// How many ids it remembers at most.
    ///
    /// ```
    /// assert_eq!(idem::kit::RecentIds::default().capacity(), 100);
    /// ```
    pub fn capacity(&self) -> usize {
        self.capacity.get()
    }

    /// How many ids it holds now.
    ///
    /// ```
    /// let mut recent = idem::kit::RecentIds::default();
    /// let _ = recent.insert("x");
    /// assert_eq!(recent.len(), 1);
    /// ```
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether it holds no id.
    ///
    /// ```
    /// assert!(idem::kit::RecentIds::default().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The ids, oldest first.
    ///
    /// ```
    /// let mut recent = idem::kit::RecentIds::default();
    /// let _ = recent.insert("a");
    /// let _ = recent.insert("b");
    /// assert_eq!(recent.iter().collect::<Vec<_>>(), ["a", "b"]);
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = &str> + '_ {
        self.ids.iter().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap()
    }

    #[test]
    fn evicts_the_oldest_and_keeps_the_bound() {
        let mut recent = RecentIds::new(cap(3));
        for i in 0..10 {
            assert_eq!(recent.insert(&i.to_string()), Recorded::New);
            assert!(recent.len() <= 3);
        }
        assert_eq!(recent.iter().collect::<Vec<_>>(), ["7", "8", "9"]);
        assert_eq!(recent.insert("8"), Recorded::Duplicate);
        assert_eq!(
            recent.insert("6"),
            Recorded::New,
            "evicted ids are forgotten"
        );
        assert_eq!(recent.iter().collect::<Vec<_>>(), ["8", "9", "6"]);
    }

    #[test]
    fn a_duplicate_does_not_reorder() {
        let mut recent = RecentIds::new(cap(2));
        let _ = recent.insert("a");
        let _ = recent.insert("b");
        assert_eq!(recent.insert("a"), Recorded::Duplicate);
        let _ = recent.insert("c");
        assert!(!recent.contains("a"), "eviction is by first insertion");
    }

    #[test]
    fn deserialising_checks_the_invariants() {
        assert!(serde_json::from_str::<RecentIds>(r#"{"capacity":1,"ids":["a","b"]}"#).is_err());
        assert!(serde_json::from_str::<RecentIds>(r#"{"capacity":3,"ids":["a","a"]}"#).is_err());
        assert!(serde_json::from_str::<RecentIds>(r#"{"capacity":0,"ids":[]}"#).is_err());
        assert!(serde_json::from_str::<RecentIds>(r#"{"capacity":2,"ids":[],"x":1}"#).is_err());
        let ok: RecentIds = serde_json::from_str(r#"{"capacity":2,"ids":["a"]}"#).unwrap();
        assert!(ok.contains("a"));
    }
}
