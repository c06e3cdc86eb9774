//! What the runtime shares with `sdns adopt` (crates/sdns): the rollover marker's name.
//! The runtime never depends on the operator's CLI, so the one definition lives here.

pub mod rollover {
    /// The marker's first label: while `_sdns-rollover.<zone> TXT` is in the zone, a
    /// whole-zone signing keeps the operator's KSK and its signature.
    pub const MARKER_LABEL: &str = "_sdns-rollover";

    /// The marker's owner name for `zone` (absolute, lower case).
    pub fn marker_name(zone: &str) -> String {
        let zone = zone.to_ascii_lowercase();
        let dot = if zone.ends_with('.') { "" } else { "." };
        format!("{MARKER_LABEL}.{zone}{dot}")
    }
}
