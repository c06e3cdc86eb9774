//! Seeded noise: garbage that replays from its seed.

/// A seeded stream of noise for tests (xorshift64): the same seed gives the same bytes on every
/// machine. Not for anything secret.
#[derive(Clone, Debug)]
pub struct Noise(u64);

impl Noise {
    /// The stream of `seed` (0 is mapped to a fixed non-zero state: xorshift has no zero state).
    pub fn new(seed: u64) -> Noise {
        Noise(if seed == 0 { 0x9e37_79b9_7f4a_7c15 } else { seed })
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A number in `0..bound` (`bound` > 0; the slight bias of a modulus is harmless here).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound.max(1)
    }

    /// `len` bytes of noise.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }

    /// The behaviours of `n` replicas of which 1 to t = (n-1)/3, at drawn positions (never only
    /// the lowest ids), take a behaviour drawn from `faulty`; the rest are `honest`.
    pub fn place_faults<B: Copy + PartialEq>(&mut self, n: u16, honest: B, faulty: &[B]) -> Vec<B> {
        let t = u64::from((n - 1) / 3);
        let mut b = vec![honest; usize::from(n)];
        let count = 1 + self.below(t) as usize;
        let mut placed = 0;
        while placed < count {
            let k = self.below(u64::from(n)) as usize;
            if b[k] == honest {
                b[k] = faulty[self.below(faulty.len() as u64) as usize];
                placed += 1;
            }
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_are_one_to_t_and_replay_from_the_seed() {
        for n in [4u16, 7, 10] {
            for seed in 0..50 {
                let placed = Noise::new(seed).place_faults(n, 0u8, &[1, 2]);
                let faulty = placed.iter().filter(|&&b| b != 0).count();
                assert!((1..=usize::from((n - 1) / 3)).contains(&faulty), "n {n} seed {seed}: {placed:?}");
                assert_eq!(placed, Noise::new(seed).place_faults(n, 0u8, &[1, 2]));
            }
        }
    }

    #[test]
    fn noise_replays_from_its_seed_and_differs_between_seeds() {
        let (mut a, mut b, mut c) = (Noise::new(7), Noise::new(7), Noise::new(8));
        let first = a.bytes(64);
        assert_eq!(first, b.bytes(64));
        assert_ne!(first, c.bytes(64));
        assert!(first.iter().any(|&x| x != first[0]), "noise is not constant");
        assert!((0..1000).all(|_| a.below(10) < 10));
        assert_ne!(Noise::new(0).next_u64(), 0, "seed 0 still makes noise");
    }
}
