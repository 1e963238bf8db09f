//! The tools' random numbers: offsets, page fill, data generation.

/// A small, fast PRNG (wyrand, Wang Yi's public-domain generator): one
/// multiply and one xor-fold per 64 bits. Used for offsets and page fill; not
/// for anything that needs statistical quality beyond that.
#[derive(Debug, Clone)]
pub struct WyRand(u64);

impl WyRand {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        (t as u64) ^ ((t >> 64) as u64)
    }

    /// A value in `0..n` (`n` > 0), by multiply-shift (Lemire), with a bias
    /// below 2^-32 for the ranges used here.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Fills `buf` with random bytes; no byte pattern repeats across pages.
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_stays_in_range_and_spreads() {
        let mut r = WyRand::new(1);
        let mut seen = [0u32; 10];
        for _ in 0..10_000 {
            let v = r.below(10);
            assert!(v < 10);
            seen[v as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 800), "{seen:?}");
    }

    #[test]
    fn fill_is_not_constant() {
        let mut r = WyRand::new(7);
        let mut a = [0u8; 4096];
        let mut b = [0u8; 4096];
        r.fill(&mut a);
        r.fill(&mut b);
        assert_ne!(a, b);
        assert!(a.iter().filter(|&&x| x == 0).count() < 100);
    }
}
