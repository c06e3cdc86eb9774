//! Zone names as the configuration, the sign-zone claims and the rollover marker spell them.
//!
//! Here, below both the runtime (zone maintenance keeps the marker's records while it signs)
//! and the operator's tools (adoption writes the marker and its update-policy grant), so
//! neither reaches into the other for them.

/// A domain name in lower case with its trailing dot.
pub fn absolute_name(name: &str) -> String {
    let lower = name.to_ascii_lowercase();
    if lower.ends_with('.') {
        lower
    } else {
        format!("{lower}.")
    }
}

/// The marker's first label: while `_sdns-rollover.<zone> TXT` is in the zone, a
/// whole-zone signing keeps the operator's KSK and its signature.
pub const MARKER_LABEL: &str = "_sdns-rollover";

/// The marker's owner name for `zone` (absolute, lower case).
pub fn marker_name(zone: &str) -> String {
    format!("{MARKER_LABEL}.{}", absolute_name(zone))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marker_sits_below_the_absolute_lower_case_apex() {
        assert_eq!(absolute_name("Example.TEST"), "example.test.");
        assert_eq!(absolute_name("example.test."), "example.test.");
        assert_eq!(marker_name("Example.Test"), "_sdns-rollover.example.test.");
    }
}
