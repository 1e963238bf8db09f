//! Synthetic data with known dedup and compression ratios.
//!
//! A file of `size` bytes is `N` logical blocks of `block_size` bytes. Block
//! `i` holds the bytes of unique block `P(i) mod U`, where `U = round(N /
//! dedup_ratio)` and `P` is a seeded pseudo-random permutation of `0..N`
//! (a Feistel network with cycle walking): every unique block appears
//! `floor(N/U)` or `ceil(N/U)` times, spread over the whole file, so any
//! large window shows about the same dedup ratio, and the whole file shows
//! it exactly (up to the rounding of `U`).
//!
//! A unique block's bytes are a pure function of (seed, unique id): the
//! same whatever buffer size, offset or thread count streams them. Inside a
//! block, every chunk (of [`CHUNK`] bytes, or the block if smaller) is some
//! random bytes followed by zeros; the number of random bytes is dithered
//! from chunk to chunk so that fractional compression ratios hold on
//! average. Every chunk keeps random bytes, so no block and no 4 KiB region
//! is all zeros: compressibility does not leak into dedup. The zeros of a
//! chunk are one `memset` of up to a few KiB, so compressible data is made
//! faster than incompressible.
//!
//! The random bytes come from [`XorShift4`] (four xorshift128+ streams side
//! by side, vector code without multiplies); blocks are filled in parallel by
//! [`Generator::fill_at_parallel`] on a persistent pool of fill threads.

use crate::error::{CoreError, Error, Result};
use crate::rng::{XorShift4, mix};

/// Compression grain in bytes (at most; a smaller block is one chunk): each
/// chunk is random bytes then zeros.
pub const CHUNK: usize = 4096;

/// LZ4's cost of a chunk of `c` bytes, `r` random then zeros, is about
/// `a * r + b + (c - r) / 255` bytes: the literals with their length bytes,
/// the token and match offset, and one length byte per 255 bytes of the
/// zero run. `(a, b)` fitted to `lz4_flex` block output on 64 KiB pieces at
/// ratios 1.5, 5 and 16: (1.008, 3.93) for 512-byte chunks, (1.0045, 7.2)
/// for 4 KiB chunks, and interpolated on log2(c) between them.
fn lz4_cost_fit(c: usize) -> (f64, f64) {
    let t = ((c.ilog2() as f64 - 9.0) / 3.0).clamp(0.0, 1.0);
    (1.008 + (1.0045 - 1.008) * t, 3.93 + (7.2 - 3.93) * t)
}

/// 1.0 in the fixed point of the random bytes per chunk (32 fraction bits).
const FIXED_ONE: u64 = 1 << 32;

/// Highest compression ratio supported: each chunk keeps at least ~9
/// random bytes.
pub const MAX_COMPRESS_RATIO: f64 = 32.0;

/// What to generate.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GenConfig {
    /// Bytes in the file; at least 1.
    pub size: u64,
    /// Logical bytes / unique bytes at `block_size`; finite, >= 1.
    pub dedup_ratio: f64,
    /// Logical bytes / LZ4-compressed bytes; finite, in 1..=32.
    pub compress_ratio: f64,
    /// Dedup unit in bytes: a power of two, 512..=1 MiB. Default 4096.
    pub block_size: usize,
    /// Seed: the same seed gives the same bytes.
    pub seed: u64,
}

impl Default for GenConfig {
    fn default() -> Self {
        Self {
            size: 1 << 30,
            dedup_ratio: 1.0,
            compress_ratio: 1.0,
            block_size: 4096,
            seed: 0,
        }
    }
}

/// A seeded permutation of `0..n`: a balanced Feistel network over the
/// next even power of two, cycle-walked back into range. Used for dedup
/// here and for random offsets that visit every block once
/// ([`workload::io`](crate::workload::io)).
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl Permutation {
    /// The permutation of `0..n` for `seed`.
    pub fn new(n: u64, seed: u64) -> Self {
        let bits = 64 - n.saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let keys = [1u64, 2, 3, 4].map(|r| mix(seed ^ r.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
        Self { n, half_bits, keys }
    }

    fn round(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let (mut l, mut r) = (x >> self.half_bits, x & mask);
        for k in self.keys {
            let next = l ^ (mix(r ^ k) & mask);
            l = r;
            r = next;
        }
        (l << self.half_bits) | r
    }

    /// The image of `x` (`x < n`); 0 when `n <= 1`.
    pub fn apply(&self, mut x: u64) -> u64 {
        if self.n <= 1 {
            return 0;
        }
        // The domain is at most 4n, so this takes a few rounds on average.
        loop {
            x = self.round(x);
            if x < self.n {
                return x;
            }
        }
    }
}

/// Generates the bytes of a [`GenConfig`].
#[derive(Debug, Clone)]
pub struct Generator {
    cfg: GenConfig,
    blocks: u64,
    unique: u64,
    perm: Permutation,
    /// Bytes per compression chunk: [`CHUNK`] or the block if smaller.
    chunk: usize,
    /// Random bytes per chunk (fractional; dithered), in 1/2^32 bytes.
    random_per_chunk: u64,
}

/// Bytes [`Generator::write_to`] makes and writes at a time: 8 MiB.
pub const WRITE_CHUNK: usize = 8 << 20;

impl Generator {
    /// Checks `cfg` and prepares the block mapping.
    ///
    /// Errors: [`CoreError::InvalidConfig`] for size 0, a ratio that is NaN,
    /// infinite, below 1 (or a compression ratio above 32), or a block size
    /// that is not a power of two in 512..=1 MiB.
    pub fn new(cfg: GenConfig) -> Result<Self> {
        let bad = |m: String| Err(Error::Core(CoreError::InvalidConfig(m)));
        if cfg.size == 0 {
            return bad("size is 0".into());
        }
        if !(cfg.dedup_ratio.is_finite() && cfg.dedup_ratio >= 1.0) {
            return bad(format!(
                "dedup ratio {} is not a finite number >= 1",
                cfg.dedup_ratio
            ));
        }
        if !(cfg.compress_ratio.is_finite()
            && (1.0..=MAX_COMPRESS_RATIO).contains(&cfg.compress_ratio))
        {
            return bad(format!(
                "compress ratio {} is not in 1..={MAX_COMPRESS_RATIO}",
                cfg.compress_ratio
            ));
        }
        check_block_size(cfg.block_size)?;
        let blocks = cfg.size.div_ceil(cfg.block_size as u64);
        let unique = ((blocks as f64 / cfg.dedup_ratio).round() as u64).clamp(1, blocks);
        let chunk = CHUNK.min(cfg.block_size);
        let c = chunk as f64;
        let random_per_chunk = if cfg.compress_ratio == 1.0 {
            c
        } else {
            let (a, b) = lz4_cost_fit(chunk);
            ((c / cfg.compress_ratio - b - c / 255.0) / (a - 1.0 / 255.0)).clamp(1.0, c)
        };
        // Fixed point: the dithering below is exact integer arithmetic.
        let random_per_chunk = (random_per_chunk * FIXED_ONE as f64).round() as u64;
        Ok(Self {
            perm: Permutation::new(blocks, cfg.seed),
            cfg,
            blocks,
            unique,
            chunk,
            random_per_chunk,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &GenConfig {
        &self.cfg
    }

    /// Logical blocks in the file (the last one may be partial).
    pub fn logical_blocks(&self) -> u64 {
        self.blocks
    }

    /// Distinct blocks in the file.
    pub fn unique_blocks(&self) -> u64 {
        self.unique
    }

    /// The unique block that logical block `block` holds.
    pub fn unique_id(&self, block: u64) -> u64 {
        self.perm.apply(block) % self.unique
    }

    /// Fills `out` (exactly `block_size` bytes) with unique block `id`.
    pub fn fill_block(&self, id: u64, out: &mut [u8]) {
        debug_assert_eq!(out.len(), self.cfg.block_size);
        let mut rng = XorShift4::new(mix(self.cfg.seed ^ mix(id.wrapping_add(0x5EED))));
        let chunk_len = self.chunk;
        if self.random_per_chunk >= chunk_len as u64 * FIXED_ONE {
            rng.fill(out);
            return;
        }
        // Chunk `g` (global index) gets floor((g+1)x) - floor(gx) random
        // bytes, so the average over any run of chunks is x up to one byte:
        // fractional ratios hold across blocks.
        let x = u128::from(self.random_per_chunk);
        let chunks_per_block = (self.cfg.block_size / chunk_len) as u128;
        let mut acc = u128::from(id) * chunks_per_block * x;
        for chunk in out.chunks_exact_mut(chunk_len) {
            let next = acc + x;
            let r = (((next >> 32) - (acc >> 32)) as usize).clamp(1, chunk_len);
            acc = next;
            // Whole 32-byte steps (no partial copy), then the zeros.
            rng.fill(&mut chunk[..r.next_multiple_of(32)]);
            chunk[r..].fill(0);
        }
    }

    /// The end of `len` bytes at `offset`, if inside the file.
    fn check_range(&self, offset: u64, len: usize) -> Result<u64> {
        offset
            .checked_add(len as u64)
            .filter(|&e| e <= self.cfg.size)
            .ok_or(Error::Core(CoreError::OutOfBounds {
                offset,
                len,
                file_len: self.cfg.size,
            }))
    }

    /// Fills `buf` with the file's bytes from byte `offset`.
    ///
    /// Errors: [`CoreError::OutOfBounds`] if the range passes the end.
    pub fn fill_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let end = self.check_range(offset, buf.len())?;
        let bs = self.cfg.block_size as u64;
        let mut scratch: Option<Vec<u8>> = None;
        let mut at = offset;
        while at < end {
            let block = at / bs;
            let start = (at - block * bs) as usize;
            let take = ((bs - start as u64).min(end - at)) as usize;
            let dst = &mut buf[(at - offset) as usize..(at - offset) as usize + take];
            let id = self.unique_id(block);
            if start == 0 && take == bs as usize {
                self.fill_block(id, dst);
            } else {
                let s = scratch.get_or_insert_with(|| vec![0u8; bs as usize]);
                self.fill_block(id, s);
                dst.copy_from_slice(&s[start..start + take]);
            }
            at += take as u64;
        }
        Ok(())
    }

    /// Writes the whole stream to `out`, in chunks of [`WRITE_CHUNK`] bytes
    /// each made by `threads` threads, storing the bytes written so far in
    /// `written` after every chunk (so that a Ctrl-C handler can cut a
    /// partial output to what is complete). Returns the bytes written.
    ///
    /// Errors: `out`'s write error ([`CoreError::Io`], op `"write"`, at the
    /// chunk's offset).
    pub fn write_to(
        &self,
        out: &mut dyn std::io::Write,
        threads: usize,
        written: &std::sync::atomic::AtomicU64,
    ) -> Result<u64> {
        let size = self.config().size;
        let mut buf = vec![0u8; (WRITE_CHUNK as u64).min(size) as usize];
        let mut at = 0u64;
        while at < size {
            let n = (buf.len() as u64).min(size - at) as usize;
            self.fill_at_parallel(at, &mut buf[..n], threads)?;
            out.write_all(&buf[..n])
                .map_err(|e| Error::io("write", Some(at), e))?;
            at += n as u64;
            written.store(at, std::sync::atomic::Ordering::Release);
        }
        out.flush().map_err(|e| Error::io("write", Some(at), e))?;
        Ok(at)
    }

    /// [`fill_at`](Self::fill_at) with `threads` threads from a persistent
    /// pool (one rayon pool per thread count, built on first use and kept
    /// for the process), in [`PAR_PIECE`]-byte pieces aligned to the
    /// stream (so only the ends of `buf` can start or stop inside a block).
    /// The bytes are the same for any thread count. The calling thread
    /// waits while the pool fills.
    ///
    /// Errors: [`CoreError::OutOfBounds`] if the range passes the end;
    /// [`CoreError::InvalidConfig`] if the pool's threads cannot be started.
    pub fn fill_at_parallel(&self, offset: u64, buf: &mut [u8], threads: usize) -> Result<()> {
        use rayon::prelude::*;
        let threads = threads.max(1);
        let piece = PAR_PIECE.max(self.cfg.block_size);
        if threads == 1 || buf.len() <= piece {
            return self.fill_at(offset, buf);
        }
        // Bounds first, so no thread starts on a bad range.
        self.check_range(offset, buf.len())?;
        let head = ((piece as u64 - offset % piece as u64) % piece as u64) as usize;
        let (first, rest) = buf.split_at_mut(head.min(buf.len()));
        let at = offset + first.len() as u64;
        let mut pieces = vec![(offset, first)];
        pieces.extend(
            rest.chunks_mut(piece)
                .enumerate()
                .map(|(i, p)| (at + (i * piece) as u64, p)),
        );
        fill_pool(threads)?.install(|| {
            pieces
                .into_par_iter()
                .try_for_each(|(at, p)| self.fill_at(at, p))
        })
    }
}

/// Bytes per task of [`Generator::fill_at_parallel`]: 256 KiB, enough to
/// make a task's overhead small and small enough that two threads share a
/// 32 MiB buffer evenly.
pub const PAR_PIECE: usize = 256 << 10;

/// The persistent fill pool for `threads` threads.
fn fill_pool(threads: usize) -> Result<std::sync::Arc<rayon::ThreadPool>> {
    use std::sync::{Arc, Mutex, OnceLock};
    /// One pool per thread count asked for.
    type Pools = Mutex<Vec<(usize, Arc<rayon::ThreadPool>)>>;
    static POOLS: OnceLock<Pools> = OnceLock::new();
    let mut pools = POOLS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = pools.iter().find(|(n, _)| *n == threads) {
        return Ok(p.clone());
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .thread_name(|i| format!("pagewriter-fill-{i}"))
        .build()
        .map_err(|e| Error::config(format!("cannot start {threads} fill threads: {e}")))?;
    let pool = Arc::new(pool);
    pools.push((threads, pool.clone()));
    Ok(pool)
}

/// Bytes one fill thread of [`fill_cells`] makes at a time: 256 KiB, so
/// that a piece is still in the cache when it is copied out.
pub const CELL_PIECE: usize = 256 << 10;

/// Fills `out` with bytes `offset..offset + out.len()` of `generator`'s
/// stream, where `out` is memory another runtime owns and lends as cells
/// (a Python buffer: written in place, never as `&mut [u8]`). `threads`
/// threads make [`CELL_PIECE`]-byte pieces into their own cache-resident
/// buffers while the calling thread copies finished pieces into `out`
/// (generation overlaps the copy). The bytes are the same as
/// [`Generator::fill_at`]'s for any thread count.
///
/// Errors: the range is outside the stream ([`CoreError::OutOfBounds`]); a
/// fill thread panicked ([`Error::Panicked`]).
pub fn fill_cells(
    generator: &Generator,
    offset: u64,
    out: &[std::cell::Cell<u8>],
    threads: usize,
) -> Result<()> {
    generator.check_range(offset, out.len())?;
    let pieces = out.len().div_ceil(CELL_PIECE);
    let threads = threads.clamp(1, pieces.max(1));
    let copy = |k: usize, bytes: &[u8]| {
        let dst = &out[k * CELL_PIECE..k * CELL_PIECE + bytes.len()];
        for (c, &b) in dst.iter().zip(bytes) {
            c.set(b);
        }
    };
    let total = out.len();
    let piece = |k: usize, buf: &mut Vec<u8>| -> Result<()> {
        let len = CELL_PIECE.min(total - k * CELL_PIECE);
        buf.resize(len, 0);
        generator.fill_at(offset + (k * CELL_PIECE) as u64, buf)
    };
    if threads == 1 {
        let mut buf = Vec::with_capacity(CELL_PIECE);
        for k in 0..pieces {
            piece(k, &mut buf)?;
            copy(k, &buf);
        }
        return Ok(());
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    // Two buffers per thread: one being filled while the other is copied.
    let (free_tx, free_rx) = crossbeam_channel::unbounded::<Vec<u8>>();
    let (done_tx, done_rx) = crossbeam_channel::unbounded::<(usize, Result<Vec<u8>>)>();
    for _ in 0..2 * threads {
        free_tx
            .send(Vec::with_capacity(CELL_PIECE))
            .expect("receiver alive");
    }
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (free_rx, done_tx, next, stop) = (free_rx.clone(), done_tx.clone(), &next, &stop);
            let piece = &piece;
            s.spawn(move || {
                while let Ok(mut buf) = free_rx.recv() {
                    let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    if k >= pieces || stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let r = piece(k, &mut buf).map(|()| buf);
                    if done_tx.send((k, r)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(done_tx);
        let mut result = Ok(());
        for _ in 0..pieces {
            let Ok((k, r)) = done_rx.recv() else {
                result = Err(Error::Panicked {
                    worker: "fill thread",
                });
                break;
            };
            match r {
                Ok(buf) => {
                    copy(k, &buf);
                    let _ = free_tx.send(buf);
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        drop(free_tx);
        result
    })
}

/// Ratios measured on real bytes.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct MeasuredRatios {
    /// Bytes measured.
    pub bytes: u64,
    /// Logical blocks / distinct blocks (XXH3-128 of each block).
    pub dedup_ratio: f64,
    /// Bytes of the distinct blocks / their LZ4 size, compressed in 64 KiB
    /// pieces.
    pub compress_ratio: f64,
}

/// The dedup block sizes the generator and [`measure`] take: powers of two
/// in 512..=1 MiB.
///
/// Errors: [`CoreError::InvalidConfig`] naming the size.
pub fn check_block_size(block_size: usize) -> Result<()> {
    if !block_size.is_power_of_two() || !(512..=1 << 20).contains(&block_size) {
        return Err(Error::config(format!(
            "block size {block_size} is not a power of two in 512..=1MiB"
        )));
    }
    Ok(())
}

/// Measures the dedup ratio at `block_size` and the LZ4 compression ratio
/// (per 64 KiB of unique data) of the bytes `read` yields, in order.
/// A final partial block counts as a block.
///
/// Errors: `InvalidInput` for a block size [`check_block_size`] refuses
/// (before anything is read) and for an empty input (0 blocks measured is
/// no measurement); the reader's errors.
pub fn measure(
    mut read: impl FnMut(&mut [u8]) -> std::io::Result<usize>,
    block_size: usize,
) -> std::io::Result<MeasuredRatios> {
    check_block_size(block_size)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
    use std::collections::HashSet;
    let mut seen: HashSet<u128> = HashSet::new();
    let (mut blocks, mut bytes) = (0u64, 0u64);
    let mut pending: Vec<u8> = Vec::with_capacity(64 << 10);
    let (mut raw, mut packed) = (0u64, 0u64);
    let mut block = vec![0u8; block_size];
    loop {
        let mut filled = 0;
        while filled < block_size {
            let n = read(&mut block[filled..])?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        if filled == 0 {
            break;
        }
        blocks += 1;
        bytes += filled as u64;
        if seen.insert(xxhash_rust::xxh3::xxh3_128(&block[..filled])) {
            pending.extend_from_slice(&block[..filled]);
            while pending.len() >= 64 << 10 {
                let piece: Vec<u8> = pending.drain(..64 << 10).collect();
                raw += piece.len() as u64;
                packed += lz4_flex::block::compress(&piece).len() as u64;
            }
        }
        if filled < block_size {
            break;
        }
    }
    if !pending.is_empty() {
        raw += pending.len() as u64;
        packed += lz4_flex::block::compress(&pending).len() as u64;
    }
    if blocks == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "nothing to measure: the input is empty",
        ));
    }
    Ok(MeasuredRatios {
        bytes,
        dedup_ratio: if seen.is_empty() {
            1.0
        } else {
            blocks as f64 / seen.len() as f64
        },
        compress_ratio: if packed == 0 {
            1.0
        } else {
            raw as f64 / packed as f64
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn generator(size: u64, dedup: f64, compress: f64) -> Generator {
        Generator::new(GenConfig {
            size,
            dedup_ratio: dedup,
            compress_ratio: compress,
            block_size: 4096,
            seed: 42,
        })
        .unwrap()
    }

    fn measure_all(g: &Generator) -> MeasuredRatios {
        let mut buf = vec![0u8; g.config().size as usize];
        g.fill_at_parallel(0, &mut buf, 2).unwrap();
        let mut at = 0;
        measure(
            |out| {
                let n = out.len().min(buf.len() - at);
                out[..n].copy_from_slice(&buf[at..at + n]);
                at += n;
                Ok(n)
            },
            4096,
        )
        .unwrap()
    }

    #[test]
    fn permutation_is_a_bijection() {
        for n in [1u64, 2, 3, 7, 100, 1000, 4097] {
            let p = Permutation::new(n, 9);
            let mut seen: Vec<u64> = (0..n).map(|i| p.apply(i)).collect();
            seen.sort_unstable();
            assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n = {n}");
        }
    }

    #[test]
    fn ratios_hold_within_5_percent() {
        for r in [1.0, 1.5, 2.0, 3.0, 5.0] {
            let m = measure_all(&generator(64 << 20, r, 1.0));
            assert!(
                (m.dedup_ratio / r - 1.0).abs() < 0.05,
                "dedup {r}: measured {m:?}"
            );
            assert!(
                (m.compress_ratio - 1.0).abs() < 0.05,
                "incompressible: {m:?}"
            );
            let m = measure_all(&generator(32 << 20, 1.0, r));
            eprintln!("target {r}: compress measured {:.3}", m.compress_ratio);
            assert!(
                (m.compress_ratio / r - 1.0).abs() < 0.05,
                "compress {r}: measured {m:?}"
            );
            assert!(
                (m.dedup_ratio - 1.0).abs() < 0.01,
                "compressibility leaked into dedup: {m:?}"
            );
        }
        let m = measure_all(&generator(64 << 20, 3.0, 2.0));
        assert!(
            (m.dedup_ratio / 3.0 - 1.0).abs() < 0.05 && (m.compress_ratio / 2.0 - 1.0).abs() < 0.05,
            "{m:?}"
        );
    }

    #[test]
    fn bytes_do_not_depend_on_chunking_offset_or_threads() {
        let g = generator((8 << 20) + 1234, 2.5, 1.7);
        let mut whole = vec![0u8; g.config().size as usize];
        g.fill_at(0, &mut whole).unwrap();
        let mut par = vec![0u8; whole.len()];
        g.fill_at_parallel(0, &mut par, 3).unwrap();
        assert_eq!(par, whole);
        for chunk in [1usize, 100, 4095, 4096, 65537] {
            let mut streamed = Vec::with_capacity(whole.len());
            let mut at = 0u64;
            while (at as usize) < whole.len() {
                let n = chunk.min(whole.len() - at as usize);
                let mut b = vec![0u8; n];
                g.fill_at(at, &mut b).unwrap();
                streamed.extend(b);
                at += n as u64;
            }
            assert_eq!(streamed, whole, "chunk {chunk}");
        }
        let mut b = vec![0u8; 10_000];
        g.fill_at(123_457, &mut b).unwrap();
        assert_eq!(b[..], whole[123_457..133_457]);
    }

    #[test]
    fn duplicates_are_spread_over_the_file() {
        let g = generator(64 << 20, 4.0, 1.0);
        // In every quarter of the file, about 1/4 of the blocks are
        // distinct per quarter... measured as: the ratio of any quarter is
        // well above 1 (duplicates are not all at the start).
        let q = g.logical_blocks() / 4;
        for part in 0..4 {
            let ids: std::collections::HashSet<u64> =
                (part * q..(part + 1) * q).map(|b| g.unique_id(b)).collect();
            let ratio = q as f64 / ids.len() as f64;
            assert!(ratio > 1.05, "quarter {part}: ratio {ratio}");
        }
    }

    #[test]
    fn write_to_streams_the_whole_file_and_reports_progress() {
        // More than one chunk, and a tail shorter than one.
        let size = WRITE_CHUNK as u64 * 2 + 12_345;
        let g = generator(size, 2.0, 2.0);
        let mut want = vec![0u8; size as usize];
        g.fill_at(0, &mut want).unwrap();
        let mut out = Vec::new();
        let written = std::sync::atomic::AtomicU64::new(0);
        assert_eq!(g.write_to(&mut out, 2, &written).unwrap(), size);
        assert_eq!(written.load(std::sync::atomic::Ordering::Acquire), size);
        assert!(out == want, "streamed bytes differ from fill_at's");
        // A writer that fails is an error naming the offset it failed at.
        let mut full = std::io::Cursor::new([0u8; 100]);
        let e = g.write_to(&mut full, 1, &written).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Core(CoreError::Io {
                    op: "write",
                    offset: Some(0),
                    ..
                })
            ),
            "{e:?}"
        );
    }

    #[test]
    fn fill_cells_gives_fill_at_bytes_for_any_thread_count() {
        let g = generator(8 << 20, 2.0, 3.0);
        for (offset, len) in [
            (0u64, 3 * CELL_PIECE + 777),
            (12_345, 1000),
            (1 << 20, 5 << 20),
        ] {
            let mut want = vec![0u8; len];
            g.fill_at(offset, &mut want).unwrap();
            for threads in [1, 2, 3] {
                let mut got = vec![0u8; len];
                let cells = std::cell::Cell::from_mut(&mut got[..]).as_slice_of_cells();
                fill_cells(&g, offset, cells, threads).unwrap();
                assert!(got == want, "offset {offset} len {len} threads {threads}");
            }
        }
        let mut past = [0u8; 10];
        let cells = std::cell::Cell::from_mut(&mut past[..]).as_slice_of_cells();
        assert!(fill_cells(&g, (8 << 20) - 5, cells, 2).is_err());
    }

    #[test]
    fn bad_arguments_are_errors() {
        for (size, d, c, bs) in [
            (0u64, 1.0, 1.0, 4096usize),
            (1, 0.5, 1.0, 4096),
            (1, f64::NAN, 1.0, 4096),
            (1, f64::INFINITY, 1.0, 4096),
            (1, 1.0, 0.9, 4096),
            (1, 1.0, f64::NAN, 4096),
            (1, 1.0, 33.0, 4096),
            (1, 1.0, 1.0, 1000),
            (1, 1.0, 1.0, 256),
        ] {
            let r = Generator::new(GenConfig {
                size,
                dedup_ratio: d,
                compress_ratio: c,
                block_size: bs,
                seed: 0,
            });
            assert!(
                matches!(r, Err(Error::Core(CoreError::InvalidConfig(_)))),
                "{size} {d} {c} {bs}"
            );
        }
        let g = generator(4096, 1.0, 1.0);
        assert!(matches!(
            g.fill_at(4000, &mut [0u8; 200]),
            Err(Error::Core(CoreError::OutOfBounds { .. }))
        ));
        assert!(matches!(
            g.fill_at(u64::MAX, &mut [0u8; 2]),
            Err(Error::Core(CoreError::OutOfBounds { .. }))
        ));
    }
}
