//! UTC calendar formatting for BIND's `YYYYMMDDHHMMSS` timestamps.

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Howard Hinnant's days_from_civil inverse, in 400-year eras.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Seconds since the epoch as UTC (year, month, day, hour, minute, second).
fn utc(secs: u64) -> (i64, u32, u32, u64, u64, u64) {
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    (y, m, d, rem / 3600, rem % 3600 / 60, rem % 60)
}

/// `YYYYMMDDHHMMSS` in UTC for seconds since the epoch.
pub fn format_timestamp(secs: u64) -> String {
    let (y, m, d, h, mi, s) = utc(secs);
    format!("{y:04}{m:02}{d:02}{h:02}{mi:02}{s:02}")
}

/// RFC 3339 in UTC (`2026-11-27T22:34:05Z`) for seconds since the epoch: what operators read
/// in status output and logs, where an epoch count says nothing at a glance.
pub fn format_rfc3339(secs: u64) -> String {
    let (y, m, d, h, mi, s) = utc(secs);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// Seconds since the epoch now (0 if the clock is before 1970).
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(format_timestamp(0), "19700101000000");
        assert_eq!(format_timestamp(951_782_400), "20000229000000");
        assert_eq!(format_timestamp(1_700_000_000), "20231114221320");
        assert_eq!(format_timestamp(4_102_444_799), "20991231235959");
        assert_eq!(format_rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(format_rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(format_rfc3339(1_795_798_923), "2026-11-27T17:02:03Z");
    }
}
