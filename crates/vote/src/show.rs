//! dig-like text for an outcome: the accepted answer as dig prints it, then how the vote went.

use std::fmt::Write as _;

use hickory_proto::op::Message;
use hickory_proto::rr::Record;

use crate::client::{Outcome, ReplicaResult, Verdict};
use crate::tally::Decision;

/// The accepted answer's records' data, one per line (dig +short).
pub fn short(outcome: &Outcome) -> String {
    let mut s = String::new();
    if let Some(m) = outcome.answer() {
        for r in &m.answers {
            let _ = writeln!(s, "{}", r.data);
        }
    }
    s
}

/// The full report: header, sections, and one line per replica that did not agree.
pub fn full(outcome: &Outcome, question: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "; <<>> sdns (voting client) <<>> {question}");
    let n = outcome.replicas.len();
    for round in &outcome.rounds {
        let agreed = round.results.iter().filter(|r| matches!(r, ReplicaResult::Agreed)).count();
        let answered = round.results.iter().filter(|r| matches!(r, ReplicaResult::Agreed | ReplicaResult::Disagreed(_))).count();
        let verdict = match &round.decision {
            Decision::Accept { .. } => format!("accepted: {agreed} of {n} replicas gave this answer"),
            Decision::NoQuorum => "NO QUORUM: the replicas' answers disagree".to_string(),
            Decision::TooFewAnswers | Decision::Wait => "TIMEOUT: too few replicas answered".to_string(),
        };
        let _ = writeln!(s, ";; {}: {answered} of {n} replicas answered, quorum {} (n = {n}, t = {}); {verdict}", round.kind, round.quorum, outcome.faults);
    }
    if let Some(m) = outcome.answer() {
        s += &message(m);
    }
    if let Some(round) = outcome.last() {
        for (i, r) in round.results.iter().enumerate() {
            let addr = outcome.replicas.get(i).map(ToString::to_string).unwrap_or_default();
            match r {
                ReplicaResult::Agreed => {}
                ReplicaResult::Disagreed(m) => {
                    let _ = writeln!(s, ";; DISAGREED: replica {i} ({addr}) answered {}", summary(m));
                }
                ReplicaResult::Failed(e) => {
                    let _ = writeln!(s, ";; SILENT: replica {i} ({addr}): {e}");
                }
                ReplicaResult::Silent => {
                    let _ = writeln!(s, ";; SILENT: replica {i} ({addr}): no answer before the vote ended");
                }
            }
        }
    }
    let _ = writeln!(
        s,
        ";; verdict: {}",
        match outcome.verdict() {
            Verdict::Accepted => "accepted",
            Verdict::NoQuorum => "no quorum",
            Verdict::Timeout => "timeout",
        }
    );
    s
}

/// A message as dig prints it (header, flags, sections).
pub fn message(m: &Message) -> String {
    let mut s = String::new();
    let meta = &m.metadata;
    let _ = writeln!(s, ";; ->>HEADER<<- opcode: {}, status: {}", format!("{}", meta.op_code).to_uppercase(), rcode(m));
    let mut flags = vec!["qr"];
    for (on, name) in [
        (meta.authoritative, "aa"),
        (meta.truncation, "tc"),
        (meta.recursion_desired, "rd"),
        (meta.recursion_available, "ra"),
        (meta.authentic_data, "ad"),
        (meta.checking_disabled, "cd"),
    ] {
        if on {
            flags.push(name);
        }
    }
    let _ = writeln!(
        s,
        ";; flags: {}; QUERY: {}, ANSWER: {}, AUTHORITY: {}, ADDITIONAL: {}",
        flags.join(" "),
        m.queries.len(),
        m.answers.len(),
        m.authorities.len(),
        m.additionals.len()
    );
    let _ = writeln!(s, "\n;; QUESTION SECTION:");
    for q in &m.queries {
        let _ = writeln!(s, ";{}\t\t{}\t{}", q.name(), q.query_class(), q.query_type());
    }
    for (title, records) in [("ANSWER", &m.answers), ("AUTHORITY", &m.authorities), ("ADDITIONAL", &m.additionals)] {
        if records.is_empty() {
            continue;
        }
        let _ = writeln!(s, "\n;; {title} SECTION:");
        for r in records {
            let _ = writeln!(s, "{}", record(r));
        }
    }
    s.push('\n');
    s
}

/// The response code as dig names it.
pub fn rcode(m: &Message) -> String {
    let code = u16::from(m.metadata.response_code);
    let names = ["NOERROR", "FORMERR", "SERVFAIL", "NXDOMAIN", "NOTIMP", "REFUSED", "YXDOMAIN", "YXRRSET", "NXRRSET", "NOTAUTH", "NOTZONE"];
    names.get(usize::from(code)).map_or_else(|| format!("RCODE{code}"), |n| (*n).to_string())
}

fn record(r: &Record) -> String {
    format!("{}\t{}\t{}\t{}\t{}", r.name, r.ttl, r.dns_class, r.record_type(), r.data)
}

/// One line about a disagreeing answer: its status and answer records.
fn summary(m: &Message) -> String {
    let records: Vec<String> = m.answers.iter().map(|r| format!("{} {} {}", r.name, r.record_type(), r.data)).collect();
    format!("status {}, {} answer record(s){}{}", rcode(m), m.answers.len(), if records.is_empty() { "" } else { ": " }, records.join("; "))
}
