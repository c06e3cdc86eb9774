//! User-space delaying proxies: emulated wide-area links for real processes.
//!
//! This machine's kernel has no `netem` qdisc, so a link's delay is made here: a proxy listens
//! on one address and forwards to another, holding every byte (TCP) or datagram (UDP) for the
//! link's one-way delay in each direction. A cluster is put on an emulated topology by pointing
//! each replica's peer addresses, and the client, at proxies (docs/LATENCY.md). TLS passes
//! through untouched: the proxy forwards bytes and never looks at them.
//!
//! - [`Shape`]: one link's one-way delay, jitter and loss, and the seeded generator that draws
//!   them ([`Rng`]), so a run can be repeated.
//! - [`line`]: the delay line shared by both protocols: chunks stamped with their delivery time
//!   in a FIFO bounded by a byte budget, so a proxy never buffers without bound.
//! - [`tcp`]: a TCP link; each direction's bytes are delayed in order. A slow receiver fills the
//!   budget and the proxy stops reading from the sender (TCP's own back-pressure).
//! - [`udp`]: a UDP link; one upstream socket per client address, datagrams past the budget are
//!   dropped, as a router's full queue drops them.
//! - [`spec`]: the links file `netdelay` reads (one link per line).
//!
//! Jitter never reorders: a chunk's delivery time is at least its predecessor's (real TCP
//! delivers in order; for UDP this is a simplification). Loss on UDP drops the datagram. TCP
//! cannot lose bytes, so loss on a TCP link is emulated as what it costs the receiver: a chunk
//! "lost" waits one more retransmission timeout ([`Shape::retransmit`], 200 ms by default,
//! Linux's minimum RTO) and holds up everything behind it; loss 1.0 is a cut link (every byte is
//! discarded and the connection stays open but silent, as during a partition).
#![forbid(unsafe_code)]

pub mod line;
pub mod spec;
pub mod tcp;
pub mod udp;

use std::time::Duration;

/// One direction's impairments.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// One-way delay added to every chunk or datagram.
    pub delay: Duration,
    /// Extra delay drawn uniformly from `0..=jitter` per chunk (never reorders).
    pub jitter: Duration,
    /// Probability in `0.0..=1.0` that a datagram is dropped (UDP) or a chunk waits one more
    /// retransmission timeout (TCP); 1.0 cuts the link.
    pub loss: f64,
    /// What a lost TCP chunk costs (added to its delay).
    pub retransmit: Duration,
}

impl Shape {
    pub fn delay(delay: Duration) -> Self {
        Shape { delay, jitter: Duration::ZERO, loss: 0.0, retransmit: Duration::from_millis(200) }
    }

    /// Whether the link is cut (every byte dropped).
    pub fn cut(&self) -> bool {
        self.loss >= 1.0
    }

    /// The delay of the next chunk: the base delay plus a jitter draw.
    pub fn draw_delay(&self, rng: &mut Rng) -> Duration {
        if self.jitter.is_zero() {
            return self.delay;
        }
        let extra = self.jitter.as_nanos() as f64 * rng.next_f64();
        self.delay + Duration::from_nanos(extra as u64)
    }

    /// Whether the next chunk is lost.
    pub fn draw_loss(&self, rng: &mut Rng) -> bool {
        self.loss > 0.0 && (self.cut() || rng.next_f64() < self.loss)
    }
}

/// SplitMix64: small, seeded, good enough to draw jitter and loss; each direction of each link
/// gets its own stream ([`Rng::derive`]) so runs repeat whatever the task interleaving.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    /// An independent stream for sub-stream `k` (a link, a direction, a connection).
    pub fn derive(&self, k: u64) -> Self {
        let mut r = Rng(self.0 ^ k.wrapping_mul(0xA076_1D64_78BD_642F));
        Rng(r.next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0.0..1.0`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_draws_and_streams_differ() {
        let a: Vec<u64> = (0..4).map(|_| 0).scan(Rng::new(7), |r, _: u64| Some(r.next_u64())).collect();
        let b: Vec<u64> = (0..4).map(|_| 0).scan(Rng::new(7), |r, _: u64| Some(r.next_u64())).collect();
        assert_eq!(a, b);
        let mut d1 = Rng::new(7).derive(1);
        let mut d2 = Rng::new(7).derive(2);
        assert_ne!(d1.next_u64(), d2.next_u64());
    }

    #[test]
    fn jitter_stays_within_bounds_and_loss_extremes_hold() {
        let s = Shape { delay: Duration::from_millis(10), jitter: Duration::from_millis(5), loss: 0.0, retransmit: Duration::from_millis(200) };
        let mut rng = Rng::new(1);
        for _ in 0..1000 {
            let d = s.draw_delay(&mut rng);
            assert!(d >= Duration::from_millis(10) && d <= Duration::from_millis(15), "{d:?}");
            assert!(!s.draw_loss(&mut rng));
        }
        let cut = Shape { loss: 1.0, ..s };
        assert!((0..1000).all(|_| cut.draw_loss(&mut rng)));
        let half = Shape { loss: 0.5, ..s };
        let lost = (0..10_000).filter(|_| half.draw_loss(&mut rng)).count();
        assert!((4000..6000).contains(&lost), "{lost}");
    }
}
