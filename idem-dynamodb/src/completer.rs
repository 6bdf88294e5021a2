//! [`Store::find_abandoned`](idem_core::Store::find_abandoned) for DynamoDB: a consistent `Scan` of
//! the steps items that keep a live input, then a consistent read of each candidate's record,
//! in key order, until the page is full.

use aws_sdk_dynamodb::types::AttributeValue;

use idem_core::store::support::{failed_step, key_from_hex};
use idem_core::{Abandoned, AbandonedQuery, Error, Key, INPUT_STEP};

use crate::admin::Attrs;
use crate::item::{corrupt, number, State, EXPIRES, PK};
use crate::store::Inner;

/// The attempts counted on a steps item (as `steps.rs` writes it).
const ATTEMPT: &str = "attempt_n";

impl Inner {
    /// See [`Store::find_abandoned`](idem_core::Store::find_abandoned): the whole table is scanned
    /// for steps items with an input (what the filter keeps is returned, and what it drops is
    /// still read), then each candidate after `after`, smallest key first, costs one
    /// `GetItem` until `limit` are found. An operation is abandoned when its record is gone, or
    /// in progress past its lease and the clock-skew margin (when a claim may take it over) and
    /// not uncertain.
    pub(crate) async fn find_abandoned(
        &self,
        query: AbandonedQuery<'_>,
    ) -> Result<Vec<Abandoned>, Error> {
        let input_attr = format!("f:{INPUT_STEP}");
        let mut candidates: Vec<(Key, Vec<u8>)> = Vec::new();
        self.scan_pages(
            |scan| {
                scan.filter_expression("attribute_exists(#input) AND #e > :now")
                    .expression_attribute_names("#input", &input_attr)
                    .expression_attribute_names("#e", EXPIRES)
                    .expression_attribute_values(":now", number(self.now_ms()))
            },
            |items| {
                for item in &items {
                    candidates.extend(candidate(item, &input_attr, query.after)?);
                }
                Ok(())
            },
        )
        .await?;
        candidates.sort_unstable_by_key(|(k, _)| *k);
        let limit = usize::try_from(query.limit).unwrap_or(usize::MAX);
        let mut found = Vec::new();
        for (key, input) in candidates {
            if found.len() >= limit {
                break;
            }
            // An uncertain operation always holds its key: it is for its resolution, never run
            // again by a completer.
            let unheld = match self.read(&key).await? {
                None => true,
                Some(item) => {
                    matches!(item.state, State::InProgress { .. })
                        && !self.holds_key(&item, self.now_ms())
                }
            };
            if unheld {
                found.push(Abandoned::decode(key, &input)?);
            }
        }
        Ok(found)
    }
}

/// The key and stored input of a steps `item` found by the scan, if it is one `find_abandoned`
/// may return: a steps item of this store's layout, after `after`, whose latest attempt did not
/// fail.
fn candidate(
    item: &Attrs,
    input_attr: &str,
    after: Option<&Key>,
) -> Result<Option<(Key, Vec<u8>)>, Error> {
    let Some(key) = (match item.get(PK) {
        Some(AttributeValue::S(pk)) => pk.strip_suffix(":steps").and_then(key_from_hex),
        _ => None,
    }) else {
        // Not a steps item of this store's layout: nothing to complete.
        return Ok(None);
    };
    if after.is_some_and(|a| key <= *a) {
        return Ok(None);
    }
    let attempt = match item.get(ATTEMPT) {
        Some(AttributeValue::N(n)) => n.parse::<u32>().ok(),
        _ => None,
    }
    .ok_or_else(|| corrupt(&key, "its steps count no attempts"))?;
    if item.contains_key(&format!("f:{}", failed_step(attempt))) {
        return Ok(None);
    }
    let Some(AttributeValue::B(input)) = item.get(input_attr) else {
        return Err(corrupt(&key, "its stored input is not binary"));
    };
    Ok(Some((key, input.as_ref().to_vec())))
}
