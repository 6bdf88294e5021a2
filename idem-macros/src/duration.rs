//! Compile-time parsing of duration literals: `"250ms"`, `"30s"`, `"5m"`, `"24h"`, `"7d"`, and
//! combinations from the largest unit to the smallest, such as `"1h30m"`.

use syn::LitStr;

/// The units, largest first, with their length in milliseconds.
const UNITS: [(&str, u64); 5] = [
    ("d", 24 * 3_600_000),
    ("h", 3_600_000),
    ("m", 60_000),
    ("s", 1_000),
    ("ms", 1),
];

/// The longest duration the stores accept (see `idem_core::store::check_duration`).
const MAX_MS: u64 = 10 * 365 * 24 * 3_600_000;

const UNIT_LIST: &str = "`ms`, `s`, `m`, `h` or `d`";

/// A duration literal and its value in milliseconds.
pub(crate) struct DurationLit {
    pub(crate) lit: LitStr,
    pub(crate) millis: u64,
}

impl DurationLit {
    /// Parses `lit`; every error is spanned on the literal.
    pub(crate) fn parse(lit: LitStr) -> syn::Result<DurationLit> {
        match parse_millis(&lit.value()) {
            Ok(millis) => Ok(DurationLit { lit, millis }),
            Err(msg) => Err(syn::Error::new(lit.span(), msg)),
        }
    }
}

/// The value of `text` in milliseconds, or why it is not a duration.
fn parse_millis(text: &str) -> Result<u64, String> {
    if text.is_empty() {
        return Err(format!(
            "empty duration: write a number and a unit ({UNIT_LIST}), such as \"30s\""
        ));
    }
    let mut rest = text;
    let mut total: u64 = 0;
    // Index into UNITS of the last unit seen: each unit may follow only larger ones.
    let mut last_unit: Option<usize> = None;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!(
                "malformed duration \"{text}\": expected a number at `{rest}`; write numbers and units ({UNIT_LIST}), such as \"1h30m\""
            ));
        }
        let (number, after) = rest.split_at(digits);
        let unit_len = after.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, after) = after.split_at(unit_len);
        if unit.is_empty() {
            return Err(format!(
                "`{number}` in \"{text}\" has no unit: add one of {UNIT_LIST}, such as \"{number}s\""
            ));
        }
        let Some(index) = UNITS.iter().position(|(name, _)| *name == unit) else {
            return Err(format!(
                "unknown unit `{unit}` in \"{text}\": use {UNIT_LIST}"
            ));
        };
        if last_unit.is_some_and(|last| index <= last) {
            return Err(format!(
                "units in \"{text}\" must go from the largest to the smallest, each once, such as \"1h30m\""
            ));
        }
        last_unit = Some(index);
        let too_long =
            || format!("duration \"{text}\" is longer than the 10 years a store accepts");
        let value: u64 = number.parse().map_err(|_| too_long())?;
        total = value
            .checked_mul(UNITS[index].1)
            .and_then(|ms| total.checked_add(ms))
            .filter(|ms| *ms <= MAX_MS)
            .ok_or_else(too_long)?;
        rest = after;
    }
    if total == 0 {
        return Err(format!(
            "duration \"{text}\" is zero: a lease or ttl must be at least 1ms"
        ));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::parse_millis;

    #[test]
    fn parses_single_units() {
        assert_eq!(parse_millis("250ms"), Ok(250));
        assert_eq!(parse_millis("30s"), Ok(30_000));
        assert_eq!(parse_millis("5m"), Ok(300_000));
        assert_eq!(parse_millis("24h"), Ok(86_400_000));
        assert_eq!(parse_millis("7d"), Ok(604_800_000));
    }

    #[test]
    fn parses_combinations() {
        assert_eq!(parse_millis("1h30m"), Ok(5_400_000));
        assert_eq!(parse_millis("1d2h3m4s5ms"), Ok(93_784_005));
        assert_eq!(parse_millis("0s250ms"), Ok(250));
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in [
            "", "30", "s", "30 s", "30sec", "1.5s", "-1s", "30s30s", "30m1h", "1ms1s", "1h 30m",
            "30S",
        ] {
            assert!(parse_millis(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn rejects_zero_and_too_long() {
        assert!(parse_millis("0s").is_err());
        assert!(parse_millis("0h0m").is_err());
        assert!(parse_millis("3651d").is_err());
        assert!(parse_millis("99999999999999999999999d").is_err());
        assert_eq!(parse_millis("3650d"), Ok(315_360_000_000));
    }
}
