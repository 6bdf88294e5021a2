/// The claim order of a SQL store's harness, as a const generic (an enum cannot be one):
/// 0 adaptive (the default), 1 claim first, 2 read first. Each SQL store runs the suite in all
/// three, so both statement orders keep every rule whatever the adaptive order picks.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub fn claim_order(order: u8) -> idem_sql::ClaimOrder {
    match order {
        1 => idem_sql::ClaimOrder::ClaimFirst,
        2 => idem_sql::ClaimOrder::ReadFirst,
        _ => idem_sql::ClaimOrder::Adaptive,
    }
}
