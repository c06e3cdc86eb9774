//! Update authentication the replicas decide from the log alone.
//!
//! Every ordered update is authenticated here, by every replica, against the batch's
//! agreed time: TSIG (RFC 8945) with the configured keys, or SIG(0) (RFC 2931) with the
//! configured public KEYs. One that passes goes to named re-signed with a replica-local
//! TSIG key standing for the same identity (a per-replica secret made at start-up that
//! never leaves the replica), signed with the local clock so named's own time check
//! cannot disagree; named.conf grants each local key exactly what its identity may do.
//! One that fails gets the answer named would give, built from the request and the
//! agreed time only, so it is the same on every honest replica.
//!
//! Before ordering, the same check runs against the local clock as a filter only
//! ([`Authenticator::precheck`]); zone transfers are allowed only with a transfer key.
//! A cluster serving several zones has one authenticator per zone ([`zones::ZoneAuth`]).

pub mod keyfile;
pub mod sig0;
pub mod wire;
pub mod zones;
pub use dnswire::tsig;

use serde::{Deserialize, Serialize};

use self::sig0::Sig0Key;
use self::wire::{Layout, TYPE_TSIG};

// The execution core owns the question (crate::gate); this module answers it.
pub use crate::gate::{UpdateDecision, UpdateGate};
pub use keyfile::TsigKey;

/// Which signatures may authorize an update (the same names in the configuration and on
/// the command line, which parses them with `FromStr` and shows [`Mode::help`], so no clap
/// here).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Shared TSIG keys (see [`Mode::help`] for each).
    #[default]
    Tsig,
    /// SIG(0) KEYs.
    Sig0,
    /// Either.
    Both,
}

impl Mode {
    /// Every mode, in the order the command line lists them.
    pub const ALL: [Mode; 3] = [Mode::Tsig, Mode::Sig0, Mode::Both];

    /// What the mode trusts, in one line (the command line's help).
    pub fn help(self) -> &'static str {
        match self {
            Mode::Tsig => "Shared TSIG keys: every replica holds the secret, so one corrupted replica can order validly signed updates",
            Mode::Sig0 => "SIG(0) KEYs: replicas hold only public keys; none can forge an update",
            Mode::Both => "Either",
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Tsig => "tsig",
            Mode::Sig0 => "sig0",
            Mode::Both => "both",
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let names = || Mode::ALL.map(Mode::as_str).join(", ");
        Mode::ALL.into_iter().find(|m| m.as_str() == s).ok_or_else(|| format!("invalid update authentication {s:?} (possible values: {})", names()))
    }
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The local clock, seconds since the epoch: what the update authentication signs towards
/// named with, so that named's own time check agrees. The wrapper supplies it; this crate
/// reads no clock.
pub type Clock = fn() -> u64;

pub const RCODE_FORMERR: u16 = 1;
pub const RCODE_REFUSED: u16 = 5;
pub const RCODE_NOTAUTH: u16 = 9;

/// A key named.conf must hold: a local key (granted updates) or a transfer key.
#[derive(Clone)]
pub struct NamedKey {
    pub name: String,
    pub algorithm: &'static str,
    pub secret: Vec<u8>,
}

impl std::fmt::Debug for NamedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NamedKey").field("name", &self.name).finish_non_exhaustive()
    }
}

/// A TSIG key as configured: name, algorithm and secret.
#[derive(Clone)]
pub struct TsigSecret {
    pub name: String,
    pub algorithm: tsig::Algorithm,
    pub secret: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("TSIG key name {0:?} is not a domain name")]
    BadKeyName(String),
    #[error("no OS randomness for the local keys: {0}")]
    Random(String),
    #[error("zone name {0:?} is not a domain name")]
    BadZoneName(String),
    #[error("no zone to authenticate updates for")]
    NoZone,
}

/// An identity that may update: its local key for named.
struct Identity {
    local: tsig::Key,
    local_secret: Vec<u8>,
}

/// How a request authenticated (or why not), before anything is signed.
enum Outcome {
    /// Passed as this identity (index into `identities`); `body` is the request
    /// without its signature record.
    Pass {
        identity: usize,
        body: Vec<u8>,
    },
    Refuse {
        rcode: u16,
        answer: Vec<u8>,
    },
}

pub struct Authenticator {
    mode: Mode,
    /// Keys that may update (TSIG identities 0..n), then transfer-only keys.
    tsig: Vec<tsig::Key>,
    update_tsig: usize,
    sig0: Vec<Sig0Key>,
    /// TSIG identities first (same order as `tsig[..update_tsig]`), then SIG(0) ones.
    identities: Vec<Identity>,
    /// Names of the keys that allow AXFR/IXFR.
    transfer: Vec<Vec<u8>>,
    /// Time source for signing towards named (the local clock, the caller's).
    clock: Clock,
    /// The longest validity (s) a SIG(0) may carry (`[auth] sig0_max_validity_s`).
    sig0_max_span_s: u64,
}

/// Default of `[auth] sig0_max_validity_s`: nsupdate signs for 10 minutes around its clock.
pub const SIG0_MAX_VALIDITY_S: u64 = 3600;

impl Authenticator {
    /// `update_keys` authorize updates in tsig/both modes; `transfer_keys` allow
    /// transfers (a key may be in both); `sig0_keys` authorize updates in sig0/both; `clock`
    /// signs what goes to named.
    pub fn new(mode: Mode, update_keys: &[TsigSecret], transfer_keys: &[TsigSecret], sig0_keys: Vec<Sig0Key>, clock: Clock) -> Result<Self, AuthError> {
        Self::build(mode, update_keys, transfer_keys, sig0_keys, None, clock)
    }

    /// As [`Authenticator::new`], for the zone with this index in a cluster serving several:
    /// its local keys are `tsig-<index>-<i>.sdns-local` (named's keys are global, so an
    /// identity of one zone has a name no other zone's update-policy grants).
    pub fn for_zone(
        index: u16,
        mode: Mode,
        update_keys: &[TsigSecret],
        transfer_keys: &[TsigSecret],
        sig0_keys: Vec<Sig0Key>,
        clock: Clock,
    ) -> Result<Self, AuthError> {
        Self::build(mode, update_keys, transfer_keys, sig0_keys, Some(index), clock)
    }

    fn build(
        mode: Mode,
        update_keys: &[TsigSecret],
        transfer_keys: &[TsigSecret],
        sig0_keys: Vec<Sig0Key>,
        zone: Option<u16>,
        clock: Clock,
    ) -> Result<Self, AuthError> {
        let to_key = |k: &TsigSecret| tsig::Key::new(&k.name, k.algorithm, &k.secret).ok_or_else(|| AuthError::BadKeyName(k.name.clone()));
        let mut keys = update_keys.iter().map(to_key).collect::<Result<Vec<_>, _>>()?;
        let update_tsig = keys.len();
        let mut transfer = Vec::new();
        for k in transfer_keys {
            let key = to_key(k)?;
            transfer.push(key.name_wire.clone());
            if !keys.iter().any(|x| x.name_wire == key.name_wire) {
                keys.push(key);
            }
        }
        let tsig_ids = if mode == Mode::Sig0 { 0 } else { update_tsig };
        let sig0 = if mode == Mode::Tsig { Vec::new() } else { sig0_keys };
        let mut identities = Vec::new();
        for (kind, i) in (0..tsig_ids).map(|i| ("tsig", i)).chain((0..sig0.len()).map(|i| ("sig0", i))) {
            let mut secret = vec![0u8; 32];
            getrandom::fill(&mut secret).map_err(|e| AuthError::Random(e.to_string()))?;
            let name = match zone {
                None => format!("{kind}-{i}.sdns-local."),
                Some(z) => format!("{kind}-{z}-{i}.sdns-local."),
            };
            let local = tsig::Key::new(&name, tsig::Algorithm::HmacSha256, &secret).ok_or(AuthError::BadKeyName(name))?;
            identities.push(Identity { local, local_secret: secret });
        }
        Ok(Authenticator { mode, tsig: keys, update_tsig: tsig_ids, sig0, identities, transfer, clock, sig0_max_span_s: SIG0_MAX_VALIDITY_S })
    }

    /// Refuses SIG(0) updates valid (expiration less inception) for longer than `span_s`:
    /// each is remembered until it expires, against its replay.
    pub fn with_sig0_max_validity(mut self, span_s: u64) -> Self {
        self.sig0_max_span_s = span_s;
        self
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// The local keys named.conf grants updates to (one per identity), and the
    /// transfer keys named must know to sign transfers (never granted updates).
    pub fn named_keys(&self, transfer_keys: &[TsigSecret]) -> (Vec<NamedKey>, Vec<NamedKey>) {
        let local = self.identities.iter().map(|i| NamedKey { name: i.local.name.clone(), algorithm: "hmac-sha256", secret: i.local_secret.clone() }).collect();
        let transfer = transfer_keys
            .iter()
            .map(|k| NamedKey { name: k.name.trim_end_matches('.').to_ascii_lowercase(), algorithm: k.algorithm.name(), secret: k.secret.clone() })
            .collect();
        (local, transfer)
    }

    /// The local keys that stand for the update key `name` in named's update-policy (`*`:
    /// every identity, as BIND reads it). `None`: no configured update key has that name.
    /// Empty: the key is configured but authorizes nothing in this mode (sig0).
    pub fn local_names(&self, name: &str) -> Option<Vec<String>> {
        if name == "*" {
            return Some(self.identities.iter().map(|i| i.local.name.clone()).collect());
        }
        let wanted = name.trim_end_matches('.').to_ascii_lowercase();
        let index = self.tsig.iter().take(self.update_tsig).position(|k| k.name == wanted);
        match index {
            Some(i) => Some(vec![self.identities[i].local.name.clone()]),
            None if self.mode == Mode::Sig0 && self.tsig.iter().any(|k| k.name == wanted) => Some(Vec::new()),
            None => None,
        }
    }

    /// Who each local key stands for, for the log at start-up.
    pub fn describe(&self) -> Vec<String> {
        let tsig = self.tsig[..self.update_tsig].iter().map(|k| format!("TSIG {}", k.name));
        let sig0 = self.sig0.iter().map(|k| format!("SIG(0) {} alg {} tag {}", k.name, k.algorithm, k.tag));
        tsig.chain(sig0).zip(&self.identities).map(|(who, id)| format!("{who} -> {}", id.local.name)).collect()
    }

    fn authenticate(&self, msg: &[u8], now_s: u64) -> Outcome {
        let layout = match wire::layout(msg) {
            Ok(l) => l,
            Err(_) => return Outcome::Refuse { rcode: RCODE_FORMERR, answer: header_only(msg, RCODE_FORMERR) },
        };
        let Some(rec) = layout.signature.clone() else {
            // Unsigned: named's update-policy matches no rule.
            return refuse_plain(msg, &layout, RCODE_REFUSED);
        };
        if rec.rtype == TYPE_TSIG {
            let t = match tsig::Tsig::parse(msg, &rec) {
                Ok(t) => t,
                Err(_) => return refuse_plain(msg, &layout, RCODE_FORMERR),
            };
            let Some(index) = self.tsig.iter().position(|k| k.name_wire == t.key_name) else {
                return tsig_error(msg, &layout, &t, tsig::BADKEY, now_s);
            };
            let key = &self.tsig[index];
            match tsig::verify(msg, &rec, &t, key, now_s) {
                Ok(()) => {}
                Err(tsig::Failure::FormErr) => return refuse_plain(msg, &layout, RCODE_FORMERR),
                Err(tsig::Failure::BadKey) => return tsig_error(msg, &layout, &t, tsig::BADKEY, now_s),
                Err(tsig::Failure::BadSig) => return tsig_error(msg, &layout, &t, tsig::BADSIG, now_s),
                Err(tsig::Failure::BadTrunc) => return tsig_error(msg, &layout, &t, tsig::BADTRUNC, now_s),
                Err(tsig::Failure::BadTime) => {
                    // RFC 8945 5.2.3: signed, the request's time, our time in other data.
                    let other = now_s.to_be_bytes()[2..].to_vec();
                    let answer =
                        tsig::sign(&answer_header(msg, &layout, RCODE_NOTAUTH), key, t.time_signed, tsig::ANSWER_FUDGE, tsig::BADTIME, other, Some(&t.mac));
                    return Outcome::Refuse { rcode: RCODE_NOTAUTH, answer };
                }
            }
            if index >= self.update_tsig {
                // A key named knows but update-policy does not grant: REFUSED, signed.
                let answer = tsig::sign(&answer_header(msg, &layout, RCODE_REFUSED), key, now_s, tsig::ANSWER_FUDGE, 0, Vec::new(), Some(&t.mac));
                return Outcome::Refuse { rcode: RCODE_REFUSED, answer };
            }
            return Outcome::Pass { identity: index, body: tsig::strip(msg, rec.start, layout.id) };
        }
        // SIG(0). Any failure is REFUSED: what named (9.18.28 on, which treats SIG(0)
        // requests as unsigned) answers them, and the update-policy outcome of an
        // unverifiable signer in older versions.
        match sig0::verify(msg, &rec, &self.sig0, now_s, self.sig0_max_span_s) {
            Ok(key) => {
                let index = self.sig0.iter().position(|k| k == key).unwrap_or(0);
                Outcome::Pass { identity: self.update_tsig + index, body: tsig::strip(msg, rec.start, layout.id) }
            }
            Err(_) => refuse_plain(msg, &layout, RCODE_REFUSED),
        }
    }

    /// `rcode` for a request that names no zone this cluster serves, TSIG-signed when the
    /// request's TSIG key is one of this zone's and verifies at `now_s` (named signs its
    /// answers to requests with a valid key); `None` otherwise.
    fn signed_refusal(&self, msg: &[u8], layout: &Layout, rcode: u16, now_s: u64) -> Option<Vec<u8>> {
        let rec = layout.signature.clone().filter(|r| r.rtype == TYPE_TSIG)?;
        let t = tsig::Tsig::parse(msg, &rec).ok()?;
        let key = self.tsig.iter().find(|k| k.name_wire == t.key_name)?;
        tsig::verify(msg, &rec, &t, key, now_s).ok()?;
        Some(tsig::sign(&answer_header(msg, layout, rcode), key, now_s, tsig::ANSWER_FUDGE, 0, Vec::new(), Some(&t.mac)))
    }

    /// Before ordering, against the local clock: the answer for an update that cannot
    /// succeed (unreadable, unsigned, unknown key, bad signature, or too long for named once
    /// re-signed), or for a transfer without a valid transfer key. `None`: order it. The
    /// answer is the one execution would give (`decide`), so an honest gateway never orders
    /// what every replica would refuse.
    pub fn precheck(&self, msg: &[u8], is_transfer: bool, now_s: u64) -> Option<Vec<u8>> {
        if is_transfer {
            return self.check_transfer(msg, now_s);
        }
        match self.authenticate(msg, now_s) {
            Outcome::Pass { identity, body } => {
                let forwarded = self.resign(identity, body);
                (!crate::gate::forwardable(&forwarded)).then(|| self.answer_without_named(msg, RCODE_FORMERR, now_s))
            }
            Outcome::Refuse { answer, .. } => Some(answer),
        }
    }

    /// `body` (a request that passed as `identity`, its signature removed) signed with that
    /// identity's local key, for named.
    fn resign(&self, identity: usize, body: Vec<u8>) -> Vec<u8> {
        // The identity index always comes from `identities`' own ranges.
        let local = &self.identities[identity].local;
        tsig::sign(&body, local, (self.clock)(), tsig::ANSWER_FUDGE, 0, Vec::new(), None)
    }

    /// AXFR/IXFR only with a TSIG key configured for transfers. named checks the
    /// MAC and signs the answer itself (a transfer is executed by one replica only).
    fn check_transfer(&self, msg: &[u8], now_s: u64) -> Option<Vec<u8>> {
        let layout = match wire::layout(msg) {
            Ok(l) => l,
            Err(_) => return Some(header_only(msg, RCODE_FORMERR)),
        };
        let Some(rec) = layout.signature.clone().filter(|r| r.rtype == TYPE_TSIG) else {
            return Some(answer_of(refuse_plain(msg, &layout, RCODE_REFUSED)));
        };
        let Ok(t) = tsig::Tsig::parse(msg, &rec) else {
            return Some(answer_of(refuse_plain(msg, &layout, RCODE_FORMERR)));
        };
        let Some(key) = self.tsig.iter().find(|k| k.name_wire == t.key_name) else {
            return Some(answer_of(tsig_error(msg, &layout, &t, tsig::BADKEY, now_s)));
        };
        if let Err(e) = tsig::verify(msg, &rec, &t, key, now_s) {
            let code = match e {
                tsig::Failure::BadSig => tsig::BADSIG,
                tsig::Failure::BadTime => tsig::BADTIME,
                tsig::Failure::BadTrunc => tsig::BADTRUNC,
                _ => tsig::BADKEY,
            };
            return Some(answer_of(tsig_error(msg, &layout, &t, code, now_s)));
        }
        if !self.transfer.contains(&t.key_name) {
            let answer = tsig::sign(&answer_header(msg, &layout, RCODE_REFUSED), key, now_s, tsig::ANSWER_FUDGE, 0, Vec::new(), Some(&t.mac));
            return Some(answer);
        }
        None
    }
}

fn answer_of(o: Outcome) -> Vec<u8> {
    match o {
        Outcome::Refuse { answer, .. } => answer,
        Outcome::Pass { body, .. } => body,
    }
}

impl UpdateGate for Authenticator {
    fn decide(&self, message: &[u8], agreed_time_s: u64) -> UpdateDecision {
        // An unreadable message is refused like an unsigned one, FORMERR as named answers
        // it, without named: it carries no signature, so it can authorize nothing.
        match self.authenticate(message, agreed_time_s) {
            Outcome::Refuse { rcode, answer } => UpdateDecision::Refuse { rcode, answer },
            Outcome::Pass { identity, body } => UpdateDecision::Forward(self.resign(identity, body)),
        }
    }

    fn answer_without_named(&self, request: &[u8], rcode: u16, agreed_time_s: u64) -> Vec<u8> {
        // Signed with the request's TSIG key when that verifies, as named signs its answers.
        match wire::layout(request) {
            Ok(layout) => self.signed_refusal(request, &layout, rcode, agreed_time_s).unwrap_or_else(|| answer_header(request, &layout, rcode)),
            Err(_) => header_only(request, rcode),
        }
    }

    fn answer_for_client(&self, request: &[u8], named_answer: &[u8]) -> Vec<u8> {
        // named's answer, without the local key's TSIG.
        let (answer, named_time) = match wire::layout(named_answer) {
            Ok(Layout { signature: Some(rec), id, .. }) if rec.rtype == TYPE_TSIG => {
                let time = tsig::Tsig::parse(named_answer, &rec).map(|t| t.time_signed).ok();
                (tsig::strip(named_answer, rec.start, id), time)
            }
            // named did not sign its answer (a FORMERR, say): neither does the wrapper.
            _ => return named_answer.to_vec(),
        };
        // A TSIG request gets the answer signed with its key over its MAC; a SIG(0)
        // request an unsigned one (named never signs those answers either).
        let Ok(Layout { signature: Some(rec), .. }) = wire::layout(request) else { return answer };
        if rec.rtype != TYPE_TSIG {
            return answer;
        }
        let Ok(t) = tsig::Tsig::parse(request, &rec) else { return answer };
        let Some(key) = self.tsig.iter().find(|k| k.name_wire == t.key_name) else { return answer };
        let time = named_time.unwrap_or_else(self.clock);
        tsig::sign(&answer, key, time, tsig::ANSWER_FUDGE, 0, Vec::new(), Some(&t.mac))
    }
}

/// The answer's header and zone section: the request's id, opcode, RD and CD; QR set.
fn answer_header(msg: &[u8], layout: &Layout, rcode: u16) -> Vec<u8> {
    let flags = 0x8000 | (layout.flags & (0x7800 | 0x0100 | 0x0010)) | (rcode & 0xf);
    let mut out = Vec::with_capacity(layout.question_end);
    out.extend_from_slice(&layout.id.to_be_bytes());
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&layout.qdcount.to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    // Copied at the same offset, so compression pointers inside still hold.
    out.extend_from_slice(msg.get(wire::HEADER_LEN..layout.question_end).unwrap_or_default());
    out
}

/// An answer for a message too broken to walk: its id and opcode only.
fn header_only(msg: &[u8], rcode: u16) -> Vec<u8> {
    // named's own shape for a message it cannot read: the question kept when that much parses
    // (an update cut short after its zone section gets it back), else the header alone.
    if crate::answer::parses(msg) {
        if let Some(answer) = u8::try_from(rcode).ok().and_then(|r| crate::answer::error_answer(msg, r)) {
            return answer;
        }
    }
    if let Some(end) = question_end(msg) {
        let flags = 0x8000 | (wire::u16_at(msg, 2).unwrap_or(0) & (0x7800 | 0x0100 | 0x0010)) | (rcode & 0xf);
        let mut out = msg[..2].to_vec();
        out.extend_from_slice(&flags.to_be_bytes());
        out.extend_from_slice(&msg[4..6]);
        out.extend_from_slice(&[0; 6]);
        out.extend_from_slice(&msg[wire::HEADER_LEN..end]);
        return out;
    }
    if let Some(answer) = u8::try_from(rcode).ok().and_then(|r| crate::answer::error_answer(msg, r)) {
        return answer;
    }
    let id = wire::u16_at(msg, 0).unwrap_or(0);
    let flags = 0x8000 | (wire::u16_at(msg, 2).unwrap_or(0) & 0x7800) | rcode;
    let mut out = id.to_be_bytes().to_vec();
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&[0; 8]);
    out
}

/// Where the question section ends, when the header and every question parse.
fn question_end(msg: &[u8]) -> Option<usize> {
    let qdcount = wire::u16_at(msg, 4)?;
    let mut pos = wire::HEADER_LEN;
    for _ in 0..qdcount {
        let (_, end) = wire::read_name(msg, pos).ok()?;
        pos = end + 4;
        if pos > msg.len() {
            return None;
        }
    }
    Some(pos)
}

fn refuse_plain(msg: &[u8], layout: &Layout, rcode: u16) -> Outcome {
    Outcome::Refuse { rcode, answer: answer_header(msg, layout, rcode) }
}

/// NOTAUTH with an unsigned TSIG carrying `error` (RFC 8945 5.3.2), as named sends
/// for BADKEY, BADSIG and BADTRUNC.
fn tsig_error(msg: &[u8], layout: &Layout, t: &tsig::Tsig, error: u16, now_s: u64) -> Outcome {
    let reply = tsig::Tsig {
        key_name: t.key_name.clone(),
        algorithm: t.algorithm.clone(),
        time_signed: now_s & 0xffff_ffff_ffff,
        fudge: tsig::ANSWER_FUDGE,
        mac: Vec::new(),
        original_id: t.original_id,
        error,
        other: Vec::new(),
    };
    Outcome::Refuse { rcode: RCODE_NOTAUTH, answer: tsig::append(&answer_header(msg, layout, RCODE_NOTAUTH), &reply) }
}

#[cfg(test)]
mod tests;
