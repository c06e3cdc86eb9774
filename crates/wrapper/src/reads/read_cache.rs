//! A replica-local cache of named's answers to reads, keyed by the request's bytes (id
//! aside) and its transport.
//!
//! Why a cached answer is the one named would give now: named's answer to a plain query
//! depends only on the request's bytes, the transport (UDP truncation) and the zone, and
//! only three things change the zone, all ordered: a write, a re-signing slice that
//! re-signs something, and a whole-zone signing (or the install of a transferred state).
//! The executor brackets each with [`ReadCache::begin_change`] (before named is asked) and
//! [`ChangeGuard`]'s drop (after named answered), which empty the cache and advance its
//! epoch. An answer is kept only if no change began or was running between the moment
//! its read was sent to named and the moment it came back ([`Fill`] carries the epoch),
//! so every entry reflects the zone as it has been since the last change ended. Ordered
//! reads are issued only with no change running (the core's barrier), so they stay
//! linearizable; local reads are as fresh as named itself.
//!
//! Bypassed (always asked of named): anything but a plain QUERY with one question;
//! transfers and TKEY; TSIG- or SIG(0)-signed requests (their answers carry a time and a
//! MAC); additional records other than one OPT; an EDNS COOKIE option (a server cookie
//! carries a time). SERVFAIL answers are not kept (they can be transient).
//!
//! Bounded by bytes; once full, new answers are simply not kept until the next change
//! empties it. The cache is local and decides nothing replicated.

use std::collections::HashMap;
use std::sync::Mutex;

use named_glue::rrwire::{RawHeader, RawMessage, TYPE_AXFR, TYPE_IXFR, TYPE_OPT, TYPE_TSIG};

/// Bytes of keys and answers kept at most.
pub const DEFAULT_MAX_BYTES: usize = 32 << 20;

const TYPE_SIG: u16 = 24;
const TYPE_TKEY: u16 = 249;
const OPTION_COOKIE: u16 = 10;
const RCODE_SERVFAIL: u8 = 2;

pub struct ReadCache {
    inner: Mutex<Inner>,
    max_bytes: usize,
}

#[derive(Default)]
struct Inner {
    /// Advances at the start and at the end of every change.
    epoch: u64,
    /// Changes begun and not yet ended.
    changing: u32,
    answers: HashMap<Vec<u8>, Entry>,
    bytes: usize,
    hits: u64,
    misses: u64,
}

/// named's answer as kept.
struct Entry {
    answer: Vec<u8>,
}

/// What [`ReadCache::lookup_keyed`] has for a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Keyed {
    /// named's answer with the request's id.
    Hit(Vec<u8>),
    Miss(Option<Fill>),
}

/// What the cache has for a request.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup {
    /// named's answer, with the request's id.
    Hit(Vec<u8>),
    /// Ask named; `Some`: its answer may be kept with [`ReadCache::fill`].
    Miss(Option<Fill>),
}

/// Permission to keep one answer, valid while no change begins.
#[derive(Debug, PartialEq, Eq)]
pub struct Fill {
    key: Vec<u8>,
    epoch: u64,
}

impl Default for ReadCache {
    fn default() -> Self {
        ReadCache::new(DEFAULT_MAX_BYTES)
    }
}

impl ReadCache {
    pub fn new(max_bytes: usize) -> Self {
        ReadCache { inner: Mutex::new(Inner::default()), max_bytes }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The map is consistent after any panic between statements; keep serving.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn lookup(&self, request: &[u8], tcp: bool) -> Lookup {
        let Some(key) = key(request, tcp) else { return Lookup::Miss(None) };
        match self.get(&key, [request[0], request[1]]) {
            Ok(answer) => Lookup::Hit(answer),
            Err(epoch) => Lookup::Miss(epoch.map(|epoch| Fill { key, epoch })),
        }
    }

    /// [`Self::lookup`] for a request whose [`key`] the caller has (`id`: the request's id).
    pub fn lookup_keyed(&self, key: &[u8], id: [u8; 2]) -> Keyed {
        match self.get(key, id) {
            Ok(answer) => Keyed::Hit(answer),
            Err(epoch) => Keyed::Miss(epoch.map(|epoch| Fill { key: key.to_vec(), epoch })),
        }
    }

    /// A hit (the answer with `id`), or the epoch a fill would need (`None` while a change
    /// runs).
    fn get(&self, key: &[u8], id: [u8; 2]) -> Result<Vec<u8>, Option<u64>> {
        let mut inner = self.inner();
        if let Some(entry) = inner.answers.get(key) {
            let mut answer = entry.answer.clone();
            answer[..2].copy_from_slice(&id);
            inner.hits += 1;
            return Ok(answer);
        }
        inner.misses += 1;
        Err((inner.changing == 0).then_some(inner.epoch))
    }

    /// Keeps named's `answer` if no change began since `fill` was handed out (and it fits).
    pub fn fill(&self, fill: Fill, answer: &[u8]) {
        let Ok(header) = RawHeader::parse(answer) else { return };
        // The id must be the request's (key bytes are the request without its id): a
        // forwarder hands back only such answers, but keep the invariant local.
        if !header.is_response() || header.rcode() == RCODE_SERVFAIL {
            return;
        }
        let mut inner = self.inner();
        if inner.changing > 0 || inner.epoch != fill.epoch {
            return;
        }
        let size = fill.key.len() + answer.len();
        if inner.bytes + size > self.max_bytes {
            return;
        }
        if let Some(old) = inner.answers.insert(fill.key, Entry { answer: answer.to_vec() }) {
            inner.bytes -= old.answer.len();
            inner.bytes += answer.len();
        } else {
            inner.bytes += size;
        }
    }

    /// A change of the zone is about to be sent to named: nothing is answered from the
    /// cache or kept until the returned guard is dropped (after named answered).
    #[must_use = "the change ends when the guard is dropped"]
    pub fn begin_change(self: &std::sync::Arc<Self>) -> ChangeGuard {
        let mut inner = self.inner();
        inner.epoch += 1;
        inner.changing += 1;
        inner.answers.clear();
        inner.bytes = 0;
        ChangeGuard { cache: self.clone() }
    }

    fn end_change(&self) {
        let mut inner = self.inner();
        inner.epoch += 1;
        inner.changing = inner.changing.saturating_sub(1);
        inner.answers.clear();
        inner.bytes = 0;
    }

    /// The current epoch when no change is running: equal epochs mean the zone did not
    /// change in between (the checkpoint digest is reused on that ground).
    pub fn quiet_epoch(&self) -> Option<u64> {
        let inner = self.inner();
        (inner.changing == 0).then_some(inner.epoch)
    }

    /// (hits, misses) so far.
    pub fn counts(&self) -> (u64, u64) {
        let inner = self.inner();
        (inner.hits, inner.misses)
    }
}

/// Ends a change of the zone when dropped.
pub struct ChangeGuard {
    cache: std::sync::Arc<ReadCache>,
}

impl Drop for ChangeGuard {
    fn drop(&mut self) {
        self.cache.end_change();
    }
}

/// The cache key of a request, or `None` when it must go to named every time.
pub fn key(request: &[u8], tcp: bool) -> Option<Vec<u8>> {
    let m = RawMessage::parse(request).ok()?;
    if m.header.is_response() || m.header.opcode() != 0 || m.questions.len() != 1 {
        return None;
    }
    if matches!(m.questions[0].qtype, TYPE_AXFR | TYPE_IXFR | TYPE_TKEY) {
        return None;
    }
    if !m.answers.is_empty() || !m.authorities.is_empty() || m.additionals.len() > 1 {
        return None;
    }
    if let Some(extra) = m.additionals.first() {
        if matches!(extra.rtype, TYPE_TSIG | TYPE_SIG) || extra.rtype != TYPE_OPT || has_option(&extra.rdata, OPTION_COOKIE) {
            return None;
        }
    }
    let mut key = Vec::with_capacity(request.len() - 1);
    key.push(u8::from(tcp));
    key.extend_from_slice(&request[2..]);
    Some(key)
}

/// Whether an OPT record's options include `code`; a malformed option list counts as yes
/// (named may answer it in ways that are not worth keeping).
fn has_option(rdata: &[u8], code: u16) -> bool {
    let mut rest = rdata;
    while !rest.is_empty() {
        let Some(head) = rest.get(..4) else { return true };
        let (c, len) = (u16::from_be_bytes([head[0], head[1]]), usize::from(u16::from_be_bytes([head[2], head[3]])));
        if c == code {
            return true;
        }
        let Some(next) = rest.get(4 + len..) else { return true };
        rest = next;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A query for www.example.test/A with `id`, RD as given, and these additional bytes.
    fn query(id: u16, rd: bool, additional: &[&[u8]]) -> Vec<u8> {
        let mut q = id.to_be_bytes().to_vec();
        q.extend_from_slice(&[if rd { 1 } else { 0 }, 0, 0, 1, 0, 0, 0, 0, 0, additional.len() as u8]);
        q.extend_from_slice(b"\x03www\x07example\x04test\x00\x00\x01\x00\x01");
        for a in additional {
            q.extend_from_slice(a);
        }
        q
    }

    fn opt(do_bit: bool, size: u16, options: &[u8]) -> Vec<u8> {
        let mut r = vec![0, 0, 41];
        r.extend_from_slice(&size.to_be_bytes());
        r.extend_from_slice(&[0, 0, if do_bit { 0x80 } else { 0 }, 0]);
        r.extend_from_slice(&(options.len() as u16).to_be_bytes());
        r.extend_from_slice(options);
        r
    }

    fn answer_to(request: &[u8], rcode: u8) -> Vec<u8> {
        let mut a = request.to_vec();
        a[2] |= 0x84;
        a[3] = (a[3] & 0xf0) | rcode;
        a.extend_from_slice(b"named's bytes");
        a
    }

    fn fill_from_named(cache: &ReadCache, request: &[u8], tcp: bool) -> Vec<u8> {
        let Lookup::Miss(Some(fill)) = cache.lookup(request, tcp) else { panic!("expected a fillable miss") };
        let answer = answer_to(request, 0);
        cache.fill(fill, &answer);
        answer
    }

    #[test]
    fn key_ignores_the_id_only() {
        let o = opt(true, 1232, &[]);
        let a = query(1, true, &[&o]);
        assert_eq!(key(&a, false), key(&query(2, true, &[&o]), false));
        assert_ne!(key(&a, false), key(&a, true), "transport is part of the key");
        assert_ne!(key(&a, false), key(&query(1, false, &[&o]), false), "flags are part of the key");
        assert_ne!(key(&a, false), key(&query(1, true, &[&opt(false, 1232, &[])]), false), "DO bit");
        assert_ne!(key(&a, false), key(&query(1, true, &[&opt(true, 512, &[])]), false), "UDP size");
        assert_ne!(key(&a, false), key(&query(1, true, &[]), false), "EDNS or not");
        // Other options keep their own entries (NSID here).
        assert!(key(&query(1, true, &[&opt(true, 1232, &[0, 3, 0, 0])]), false).is_some());
    }

    #[test]
    fn bypass_rules() {
        // TSIG and SIG(0) signed.
        let tsig = b"\x03key\x00\x00\xfa\x00\xff\x00\x00\x00\x00\x00\x00";
        assert_eq!(key(&query(1, false, &[tsig]), false), None);
        let sig0 = b"\x00\x00\x18\x00\xff\x00\x00\x00\x00\x00\x00";
        assert_eq!(key(&query(1, false, &[sig0]), false), None);
        // OPT plus TSIG.
        assert_eq!(key(&query(1, false, &[&opt(false, 1232, &[]), tsig]), false), None);
        // Cookie option; a malformed option list.
        let cookie = [0, 10, 0, 8, 1, 2, 3, 4, 5, 6, 7, 8];
        assert_eq!(key(&query(1, false, &[&opt(false, 1232, &cookie)]), false), None);
        assert_eq!(key(&query(1, false, &[&opt(false, 1232, &[0, 3, 0, 9])]), false), None);
        // Transfers, other opcodes, responses, runts.
        let mut axfr = query(1, false, &[]);
        let at = axfr.len() - 4;
        axfr[at..at + 2].copy_from_slice(&252u16.to_be_bytes());
        assert_eq!(key(&axfr, true), None);
        axfr[at..at + 2].copy_from_slice(&251u16.to_be_bytes());
        assert_eq!(key(&axfr, false), None);
        let mut update = query(1, false, &[]);
        update[2] |= 5 << 3;
        assert_eq!(key(&update, false), None);
        let mut response = query(1, false, &[]);
        response[2] |= 0x80;
        assert_eq!(key(&response, false), None);
        for len in 0..12 {
            assert_eq!(key(&query(1, false, &[])[..len], false), None);
        }
        // Bypassed requests are never answered from the cache.
        let cache = ReadCache::default();
        assert_eq!(cache.lookup(&query(1, false, &[tsig]), false), Lookup::Miss(None));
    }

    #[test]
    fn hit_carries_the_requests_id_and_named_bytes() {
        let cache = ReadCache::default();
        let answer = fill_from_named(&cache, &query(1, true, &[]), false);
        let Lookup::Hit(hit) = cache.lookup(&query(0xbeef, true, &[]), false) else { panic!("expected a hit") };
        assert_eq!(&hit[..2], &0xbeefu16.to_be_bytes());
        assert_eq!(hit[2..], answer[2..]);
        assert!(matches!(cache.lookup(&query(1, true, &[]), true), Lookup::Miss(Some(_))), "TCP is another entry");
        assert_eq!(cache.counts(), (1, 2));
    }

    /// The keyed lookup agrees with the plain lookup.
    #[test]
    fn keyed_lookups_agree_with_plain_ones() {
        let cache = ReadCache::default();
        let q = query(1, true, &[]);
        let k = key(&q, false).unwrap();
        assert!(matches!(cache.lookup_keyed(&k, [0, 1]), Keyed::Miss(Some(_))));
        let answer = fill_from_named(&cache, &q, false);
        let Keyed::Hit(hit) = cache.lookup_keyed(&k, [0xab, 0xcd]) else { panic!("expected a hit") };
        assert_eq!((&hit[..2], &hit[2..]), (&[0xab, 0xcd][..], &answer[2..]));
        assert_eq!(cache.lookup(&query(0xabcd, true, &[]), false), Lookup::Hit(hit));
        let cache = std::sync::Arc::new(cache);
        let change = cache.begin_change();
        assert_eq!(cache.lookup_keyed(&k, [0, 1]), Keyed::Miss(None), "nothing kept while it runs");
        drop(change);
    }

    #[test]
    fn every_change_empties_it_and_answers_across_a_change_are_not_kept() {
        let cache = Arc::new(ReadCache::default());
        let q = query(1, false, &[]);
        fill_from_named(&cache, &q, false);
        // A read sent to named before a change and back after it began is not kept.
        let Lookup::Miss(Some(early)) = cache.lookup(&query(1, true, &[]), false) else { panic!() };
        let change = cache.begin_change();
        assert_eq!(cache.quiet_epoch(), None);
        assert_eq!(cache.lookup(&q, false), Lookup::Miss(None), "emptied; nothing kept while the change runs");
        cache.fill(early, &answer_to(&query(1, true, &[]), 0));
        drop(change);
        assert!(matches!(cache.lookup(&query(1, true, &[]), false), Lookup::Miss(Some(_))));
        // Nor one that began before the change ended.
        let Lookup::Miss(Some(during)) = cache.lookup(&q, false) else { panic!() };
        let epoch = cache.quiet_epoch().unwrap();
        drop(cache.begin_change());
        assert!(cache.quiet_epoch().unwrap() > epoch);
        cache.fill(during, &answer_to(&q, 0));
        assert!(matches!(cache.lookup(&q, false), Lookup::Miss(Some(_))));
        // After the change, answers are kept again.
        fill_from_named(&cache, &q, false);
        assert!(matches!(cache.lookup(&q, false), Lookup::Hit(_)));
    }

    #[test]
    fn servfail_and_non_answers_are_not_kept() {
        let cache = ReadCache::default();
        let q = query(1, false, &[]);
        let Lookup::Miss(Some(fill)) = cache.lookup(&q, false) else { panic!() };
        cache.fill(fill, &answer_to(&q, RCODE_SERVFAIL));
        let Lookup::Miss(Some(fill)) = cache.lookup(&q, false) else { panic!("SERVFAIL was kept") };
        cache.fill(fill, &q);
        assert!(matches!(cache.lookup(&q, false), Lookup::Miss(Some(_))), "a request is not an answer");
        let Lookup::Miss(Some(fill)) = cache.lookup(&q, false) else { panic!() };
        cache.fill(fill, &answer_to(&q, 3));
        assert!(matches!(cache.lookup(&q, false), Lookup::Hit(_)), "NXDOMAIN is an answer like any");
    }

    #[test]
    fn bounded_by_bytes() {
        let one = key(&query(1, false, &[]), false).unwrap().len() + answer_to(&query(1, false, &[]), 0).len();
        let cache = ReadCache::new(one + one / 2);
        fill_from_named(&cache, &query(1, false, &[]), false);
        fill_from_named(&cache, &query(1, true, &[]), false);
        assert!(matches!(cache.lookup(&query(1, false, &[]), false), Lookup::Hit(_)));
        assert!(matches!(cache.lookup(&query(1, true, &[]), false), Lookup::Miss(Some(_))), "no room: not kept");
    }
}
