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

/// Four xorshift128+ streams (Vigna, "Further scramblings of Marsaglia's
/// xorshift generators", 2017) side by side: 32 bytes per step from shifts,
/// xors and adds on four independent lanes, which the compiler turns into
/// SSE2 vector code on the x86-64 baseline (no multiply, unlike wyrand's
/// 64x64->128-bit one with its fixed registers). Filling 4 KiB blocks of a
/// 32 MiB buffer ran 1.4-1.6x faster than four interleaved wyrand
/// streams, near a `memset` of the same buffer (this project's Xeon, one
/// binary, interleaved; `.project/datagen.md`). Each lane's 128-bit state
/// is expanded from the seed by splitmix64, so neighbouring seeds give
/// unrelated streams. Used for the bulk random bytes of synthetic data;
/// its low bits are linear (it fails some BigCrush tests), which no
/// compressor or dedup engine can use.
#[derive(Debug, Clone)]
pub struct XorShift4 {
    a: [u64; 4],
    b: [u64; 4],
}

impl XorShift4 {
    /// Four streams from `seed`: lane `l`'s two state words are splitmix64
    /// of `seed ^ 2l` and `seed ^ (2l + 1)` (never both zero).
    #[inline]
    pub fn new(seed: u64) -> Self {
        let word = |k: u64| splitmix64(seed ^ k);
        Self {
            a: [0u64, 1, 2, 3].map(|l| word(2 * l)),
            b: [0u64, 1, 2, 3].map(|l| word(2 * l + 1) | 1),
        }
    }

    /// The next 32 random bytes, as four words.
    #[inline]
    fn step(&mut self) -> [u64; 4] {
        let mut out = [0u64; 4];
        for ((a, b), o) in self.a.iter_mut().zip(&mut self.b).zip(&mut out) {
            let mut s1 = *a;
            let s0 = *b;
            *o = s0.wrapping_add(s1);
            *a = s0;
            s1 ^= s1 << 23;
            *b = s1 ^ s0 ^ (s1 >> 18) ^ (s0 >> 5);
        }
        out
    }

    /// Fills `buf` with random bytes, 32 at a time (a tail of fewer takes
    /// the front of one more step).
    #[inline]
    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(32);
        for c in &mut chunks {
            let w = self.step();
            for (d, w) in c.chunks_exact_mut(8).zip(w) {
                d.copy_from_slice(&w.to_le_bytes());
            }
        }
        let rest = chunks.into_remainder();
        if !rest.is_empty() {
            let w = self.step();
            for (d, w) in rest.chunks_mut(8).zip(w) {
                d.copy_from_slice(&w.to_le_bytes()[..d.len()]);
            }
        }
    }
}

/// splitmix64 (Steele, Lea and Flood 2014): a golden-ratio step, then
/// [`mix`]. Used to expand seeds.
#[inline]
fn splitmix64(z: u64) -> u64 {
    mix(z.wrapping_add(0x9E37_79B9_7F4A_7C15))
}

/// splitmix64's finalizer: a bijective 64-bit mix (also the round function
/// of the data generator's block permutation).
#[inline]
pub(crate) fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
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
    fn four_streams_fill_any_length_without_repeats() {
        for len in [0, 1, 7, 31, 32, 33, 100, 4096] {
            let mut a = vec![0u8; len];
            XorShift4::new(3).fill(&mut a);
            let mut b = vec![0u8; len];
            XorShift4::new(3).fill(&mut b);
            assert_eq!(a, b, "same seed, same bytes ({len})");
            if len >= 32 {
                assert!(a.iter().filter(|&&x| x == 0).count() < len / 64 + 2);
            }
        }
        // No lane repeats another: the 8-byte words of 4 KiB are distinct.
        let mut a = vec![0u8; 4096];
        XorShift4::new(0).fill(&mut a);
        let mut words: Vec<&[u8]> = a.chunks(8).collect();
        words.sort();
        words.dedup();
        assert_eq!(words.len(), 512);
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
