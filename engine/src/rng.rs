//! A small deterministic random generator (SplitMix64), identical on every platform, used
//! for seeded weight initialisation and random inputs. Not for cryptography.

/// SplitMix64: fast, well distributed, and reproducible from a 64-bit seed.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    /// A generator from a seed and a name: the same (seed, name) always gives the same stream,
    /// so each weight gets its own stream however many others the graph has.
    pub fn for_name(seed: u64, name: &str) -> Self {
        // FNV-1a over the name, mixed with the seed.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in name.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        Rng::new(seed ^ h.rotate_left(17))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A float uniform in [0, 1).
    pub fn next_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// A float uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        lo + (hi - lo) * self.next_f32()
    }

    /// An integer uniform in [0, n) (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_range() {
        let a: Vec<f32> = (0..100)
            .scan(Rng::new(7), |r, _| Some(r.next_f32()))
            .collect();
        let b: Vec<f32> = (0..100)
            .scan(Rng::new(7), |r, _| Some(r.next_f32()))
            .collect();
        assert_eq!(a, b);
        assert!(a.iter().all(|v| (0.0..1.0).contains(v)));
        assert_ne!(
            Rng::for_name(1, "a").next_u64(),
            Rng::for_name(1, "b").next_u64()
        );
    }
}
