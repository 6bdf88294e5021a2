//! The hour an object's retention ends in, as the object's name carries it (`2026-11-29T13`, UTC)
//! and the pruner reads it back.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// An hour, UTC, as whole hours since the Unix epoch.
pub(crate) type Hour = i64;

/// The hour `t` falls in.
pub(crate) fn hour_of(t: SystemTime) -> Hour {
    match t.duration_since(UNIX_EPOCH) {
        Ok(since) => (since.as_secs() / 3600) as Hour,
        // Before 1970: only a clock set absurdly wrong; rounded down as well.
        Err(e) => -(e.duration().as_secs().div_ceil(3600) as Hour),
    }
}

/// When `hour` ends.
pub(crate) fn end_of(hour: Hour) -> SystemTime {
    let end = hour.saturating_add(1).saturating_mul(3600);
    if end >= 0 {
        UNIX_EPOCH + Duration::from_secs(end as u64)
    } else {
        UNIX_EPOCH - Duration::from_secs(end.unsigned_abs())
    }
}

/// `hour` as an object name's part: `YYYY-MM-DDTHH`.
pub(crate) fn name(hour: Hour) -> String {
    let (days, hour) = (hour.div_euclid(24), hour.rem_euclid(24));
    let (year, month, day) = civil_from_days(days);
    format!("{year:04}-{month:02}-{day:02}T{hour:02}")
}

/// The hour a name part written by [`name`] stands for; `None` for anything else (a name
/// another tool put under the prefix is left alone).
pub(crate) fn parse(part: &str) -> Option<Hour> {
    let b = part.as_bytes();
    let shaped = b.len() == 13
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && [0, 1, 2, 3, 5, 6, 8, 9, 11, 12]
            .iter()
            .all(|&i| b[i].is_ascii_digit());
    if !shaped {
        return None;
    }
    let number = |range: std::ops::Range<usize>| part[range].parse::<u32>().ok();
    let (year, month, day, hour) = (
        number(0..4)?,
        number(5..7)?,
        number(8..10)?,
        number(11..13)?,
    );
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 {
        return None;
    }
    let found = days_from_civil(i64::from(year), month, day) * 24 + i64::from(hour);
    // A day past its month's end (`02-31`) reads back as another name: not one of ours.
    (name(found) == part).then_some(found)
}

/// (year, month, day) of the day `days` after 1970-01-01, in the proleptic Gregorian calendar
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The day number (since 1970-01-01) of a date: the inverse of [`civil_from_days`].
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = year - i64::from(month <= 2);
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_utc_hours_and_read_back() {
        assert_eq!(name(0), "1970-01-01T00");
        // 2026-11-29T13:00:00Z is 1,795,957,200 s after the epoch.
        let t = UNIX_EPOCH + Duration::from_secs(1_795_957_200 + 59 * 60);
        assert_eq!(name(hour_of(t)), "2026-11-29T13");
        assert_eq!(
            end_of(hour_of(t)),
            UNIX_EPOCH + Duration::from_secs(1_795_960_800)
        );
        assert_eq!(name(parse("2024-02-29T23").unwrap()), "2024-02-29T23");
        // Every hour of four years, leap days and year ends included, reads back.
        let start = hour_of(UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        for hour in start..start + 4 * 366 * 24 {
            assert_eq!(parse(&name(hour)), Some(hour));
        }
    }

    #[test]
    fn other_names_are_not_hours() {
        for part in [
            "2026-02-30T10",
            "2026-13-01T00",
            "2026-11-29T24",
            "2026-11-29",
            "2026-11-29T1",
            "2026-11-29X13",
            "+026-11-29T13",
            "lifecycle",
        ] {
            assert_eq!(parse(part), None, "{part}");
        }
    }
}
