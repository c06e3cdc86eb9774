//! The links file: one link per line, `#` starts a comment.
//!
//! ```text
//! # proto  listen            target            delay_ms  [jitter_ms  [loss]]
//! tcp      127.0.0.1:41012   127.0.0.1:31012   45
//! udp      127.0.0.1:41100   127.0.0.1:31000   0.25      0.1        0.01
//! ```
//!
//! The delay is one way and applies to both directions of the link.

use std::net::SocketAddr;
use std::time::Duration;

use crate::Shape;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LinkSpec {
    pub proto: Proto,
    pub listen: SocketAddr,
    pub target: SocketAddr,
    pub shape: Shape,
}

fn millis(field: &str, what: &str) -> Result<Duration, String> {
    let ms: f64 = field.parse().map_err(|_| format!("{what} {field:?} is not a number of milliseconds"))?;
    if !ms.is_finite() || !(0.0..=3_600_000.0).contains(&ms) {
        return Err(format!("{what} {ms} ms is out of range (0 to one hour)"));
    }
    Ok(Duration::from_secs_f64(ms / 1000.0))
}

/// Parses one line; Ok(None) for blank and comment lines.
pub fn parse_line(line: &str) -> Result<Option<LinkSpec>, String> {
    let line = line.split('#').next().unwrap_or("").trim();
    if line.is_empty() {
        return Ok(None);
    }
    let f: Vec<&str> = line.split_whitespace().collect();
    if !(4..=6).contains(&f.len()) {
        return Err(format!("expected `proto listen target delay_ms [jitter_ms [loss]]`, got {} fields", f.len()));
    }
    let proto = match f[0] {
        "tcp" => Proto::Tcp,
        "udp" => Proto::Udp,
        other => return Err(format!("protocol {other:?} is neither tcp nor udp")),
    };
    let addr = |s: &str| s.parse::<SocketAddr>().map_err(|e| format!("address {s:?}: {e}"));
    let mut shape = Shape::delay(millis(f[3], "delay")?);
    if let Some(j) = f.get(4) {
        shape.jitter = millis(j, "jitter")?;
    }
    if let Some(l) = f.get(5) {
        let loss: f64 = l.parse().map_err(|_| format!("loss {l:?} is not a number"))?;
        if !(0.0..=1.0).contains(&loss) {
            return Err(format!("loss {loss} is not within 0..1"));
        }
        shape.loss = loss;
    }
    Ok(Some(LinkSpec { proto, listen: addr(f[1])?, target: addr(f[2])?, shape }))
}

/// Parses a whole file; errors name the line.
pub fn parse(text: &str) -> Result<Vec<LinkSpec>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if let Some(l) = parse_line(line).map_err(|e| format!("line {}: {e}", i + 1))? {
            out.push(l);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_links_and_rejects_nonsense() {
        let links = parse("# topology\n\ntcp 127.0.0.1:1 127.0.0.1:2 45 # NY\nudp 127.0.0.1:3 127.0.0.1:4 0.25 1.5 0.1\n").unwrap();
        assert_eq!(links.len(), 2);
        assert_eq!(links[0].proto, Proto::Tcp);
        assert_eq!(links[0].shape.delay, Duration::from_millis(45));
        assert_eq!(links[1].shape.delay, Duration::from_micros(250));
        assert_eq!(links[1].shape.jitter, Duration::from_micros(1500));
        assert_eq!(links[1].shape.loss, 0.1);
        for bad in [
            "sctp 127.0.0.1:1 127.0.0.1:2 1",
            "tcp 127.0.0.1:1 127.0.0.1:2",
            "tcp x 127.0.0.1:2 1",
            "tcp 127.0.0.1:1 127.0.0.1:2 -1",
            "udp 127.0.0.1:1 127.0.0.1:2 1 0 1.5",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert!(parse("tcp 127.0.0.1:1 127.0.0.1:2 1\nbogus").unwrap_err().starts_with("line 2"));
    }
}
