//! Reading: the read cache of clean pages ([`ReadCache`]), the components
//! borrowed together ([`Parts`]), and the read path, which finds a page's
//! newest bytes in the write buffer, the in-flight generations, the read
//! cache, the disk, in that order.
//!
//! The cache is striped as the write buffer is, each stripe evicted by
//! CLOCK (second chance; Corbató 1968): a hit sets a page's referenced
//! bit; the hand clears set bits and evicts the first page without one,
//! so an engine's hot pages stay while once-written pages pass through.
//!
//! Owns: the cache stripes (each a lock, taken last; no I/O under it).
//! The read path takes a stripe lock, then a cache stripe lock, one at a
//! time, and reads the disk with no lock held. Invariant: every change a
//! flush makes to a cache stripe bumps its `seq`; a copy read from disk is
//! kept only if `seq` did not move since before the read (a slow reader
//! never caches bytes older than a completed write).

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::io::IoSliceMut;

use super::config::{Config, Counters, add};
use super::durability::Durability;
use super::length::Length;
use super::torn::TornProtection;
use super::write_buffer::{PageHasher, PageRef, WriteBuffer};
use crate::backend::{IOV_MAX, StorageBackend};
use crate::buffer::{BufferPool, UniqueBuf};
use crate::error::Result;
use crate::sync::Mutex;

/// The read cache of one file (see the module docs); empty (every call a
/// miss, nothing kept) when `Config::read_cache_bytes` is 0.
pub(crate) struct ReadCache {
    stripes: Box<[Mutex<CacheStripe>]>,
    /// Page `n` is in stripe `n & mask`.
    mask: u64,
    /// Bytes per stripe.
    budget: usize,
}

impl ReadCache {
    /// A cache of `bytes` in `stripes` stripes (a power of two), none if
    /// `bytes` is 0.
    pub(crate) fn new(stripes: usize, bytes: usize) -> Self {
        let n = if bytes > 0 { stripes } else { 0 };
        Self {
            stripes: (0..n).map(|_| Mutex::new(CacheStripe::default())).collect(),
            mask: stripes as u64 - 1,
            budget: bytes / stripes,
        }
    }

    /// Whether pages are kept at all.
    #[inline]
    pub(crate) fn is_enabled(&self) -> bool {
        !self.stripes.is_empty()
    }

    fn stripe(&self, page_no: u64) -> Option<&Mutex<CacheStripe>> {
        self.stripes.get((page_no & self.mask) as usize)
    }

    /// The cached page `page_no` (marked referenced), or on a miss the
    /// stripe's `seq` to [`offer`](Self::offer) a copy read from disk
    /// with (`None` with the cache off).
    pub(crate) fn lookup(&self, page_no: u64) -> std::result::Result<PageRef, Option<u64>> {
        let Some(c) = self.stripe(page_no) else {
            return Err(None);
        };
        let mut c = c.lock();
        match c.get(page_no) {
            Some(page) => Ok(page.clone()),
            None => Err(Some(c.seq)),
        }
    }

    /// The cached page `page_no`, marked referenced.
    pub(crate) fn get(&self, page_no: u64) -> Option<PageRef> {
        self.stripe(page_no)?.lock().get(page_no).cloned()
    }

    /// Copies bytes `within..` of the cached page `page_no` into `dst`
    /// (under the stripe's lock, no reference taken); `false` on a miss.
    pub(crate) fn copy_into(&self, page_no: u64, within: usize, dst: &mut [u8]) -> bool {
        let Some(c) = self.stripe(page_no) else {
            return false;
        };
        match c.lock().get(page_no) {
            Some(page) => {
                dst.copy_from_slice(&page[within..within + dst.len()]);
                true
            }
            None => false,
        }
    }

    /// The `seq` of page `page_no`'s stripe, to [`offer`](Self::offer) a
    /// copy read from disk with; `None` with the cache off.
    pub(crate) fn seq(&self, page_no: u64) -> Option<u64> {
        self.stripe(page_no).map(|c| c.lock().seq)
    }

    /// Caches `page`, read from disk after the stripe showed `seq`, unless
    /// a flush changed the stripe since (then the copy may be older than a
    /// completed write, and is dropped). Evicted pages go to `pool`.
    pub(crate) fn offer(&self, page_no: u64, seq: u64, page: PageRef, pool: &BufferPool) {
        if let Some(c) = self.stripe(page_no) {
            let mut c = c.lock();
            if c.seq == seq {
                self.insert(&mut c, page_no, page, pool);
            }
        }
    }

    /// Caches `page`, just written, as the newest version of `page_no`
    /// (a flush's retire): the stripe's `seq` moves, so a read of the
    /// older bytes racing with it is not cached.
    pub(crate) fn update(&self, page_no: u64, page: PageRef, pool: &BufferPool) {
        if let Some(c) = self.stripe(page_no) {
            let mut c = c.lock();
            c.seq += 1;
            self.insert(&mut c, page_no, page, pool);
        }
    }

    /// Drops the cached pages whose number `gone` selects (a discard, a
    /// cut, a refresh); their memory goes to `pool`.
    pub(crate) fn remove_where(&self, gone: impl Fn(u64) -> bool, pool: &BufferPool) {
        for c in self.stripes.iter() {
            let mut c = c.lock();
            c.seq += 1;
            c.remove_where(&gone, &mut |old| pool.put_all([old]));
        }
    }

    /// Inserts a clean page into stripe `c` (CLOCK eviction within the
    /// budget); evicted pages go back to `pool`.
    fn insert(&self, c: &mut CacheStripe, page_no: u64, page: PageRef, pool: &BufferPool) {
        c.insert(page_no, page, self.budget, &mut |old| pool.put_all([old]));
    }
}

/// A slot of the ring that holds no page.
const EMPTY: u64 = u64::MAX;

struct Entry {
    page: PageRef,
    referenced: bool,
    slot: usize,
}

/// One read-cache stripe (see the module docs).
#[derive(Default)]
struct CacheStripe {
    pages: HashMap<u64, Entry, BuildHasherDefault<PageHasher>>,
    /// Page numbers in clock order; `EMPTY` where a page was removed.
    ring: Vec<u64>,
    free_slots: Vec<usize>,
    hand: usize,
    /// Bytes of the cached pages.
    pub(crate) bytes: usize,
    /// Bumped whenever a flush updates this stripe (see the module docs).
    pub(crate) seq: u64,
}

impl CacheStripe {
    /// The cached page `page_no`, marked referenced.
    pub(crate) fn get(&mut self, page_no: u64) -> Option<&PageRef> {
        let e = self.pages.get_mut(&page_no)?;
        e.referenced = true;
        Some(&e.page)
    }

    /// Caches `page` as `page_no`, then evicts (never `page_no`) down to
    /// `budget` bytes; a page larger than the budget is not cached. Every
    /// page that leaves goes to `dropped`.
    pub(crate) fn insert(
        &mut self,
        page_no: u64,
        page: PageRef,
        budget: usize,
        dropped: &mut dyn FnMut(PageRef),
    ) {
        let bytes = page.len();
        if bytes > budget {
            if let Some(old) = self.remove(page_no) {
                dropped(old);
            }
            return;
        }
        match self.pages.get_mut(&page_no) {
            Some(e) => {
                let old = std::mem::replace(&mut e.page, page);
                e.referenced = true;
                self.bytes = self.bytes - old.len() + bytes;
                dropped(old);
            }
            None => {
                let slot = match self.free_slots.pop() {
                    Some(s) => {
                        self.ring[s] = page_no;
                        s
                    }
                    None => {
                        self.ring.push(page_no);
                        self.ring.len() - 1
                    }
                };
                // New pages start unreferenced: a page read once goes first.
                self.pages.insert(
                    page_no,
                    Entry {
                        page,
                        referenced: false,
                        slot,
                    },
                );
                self.bytes += bytes;
            }
        }
        while self.bytes > budget {
            match self.victim(page_no) {
                Some(v) => {
                    if let Some(old) = self.remove(v) {
                        dropped(old);
                    }
                }
                None => break,
            }
        }
        debug_assert!(self.bytes <= budget || self.pages.len() == 1);
    }

    /// Removes `page_no`; returns its page.
    pub(crate) fn remove(&mut self, page_no: u64) -> Option<PageRef> {
        let e = self.pages.remove(&page_no)?;
        self.ring[e.slot] = EMPTY;
        self.free_slots.push(e.slot);
        self.bytes -= e.page.len();
        Some(e.page)
    }

    /// Removes every page `gone` selects; each goes to `dropped`.
    pub(crate) fn remove_where(
        &mut self,
        gone: impl Fn(u64) -> bool,
        dropped: &mut dyn FnMut(PageRef),
    ) {
        let hit: Vec<u64> = self.pages.keys().copied().filter(|&p| gone(p)).collect();
        for p in hit {
            if let Some(old) = self.remove(p) {
                dropped(old);
            }
        }
    }

    /// The next unreferenced page under the hand other than `keep`,
    /// clearing referenced bits on the way; at most two sweeps.
    fn victim(&mut self, keep: u64) -> Option<u64> {
        let n = self.ring.len();
        for _ in 0..2 * n {
            let p = self.ring[self.hand];
            self.hand = (self.hand + 1) % n;
            if p == EMPTY || p == keep {
                continue;
            }
            let e = self.pages.get_mut(&p).expect("ring and map agree");
            if e.referenced {
                e.referenced = false;
            } else {
                return Some(p);
            }
        }
        None
    }
}

/// The file's components below the flush pipeline, borrowed together for
/// one call (no lock, no state): what the read path, a batch, a flush and
/// a size change act on.
#[derive(Clone, Copy)]
pub(crate) struct Parts<'a> {
    pub(crate) backend: &'a dyn StorageBackend,
    pub(crate) config: &'a Config,
    pub(crate) counters: &'a Counters,
    pub(crate) buffer: &'a WriteBuffer,
    pub(crate) cache: &'a ReadCache,
    pub(crate) length: &'a Length,
    pub(crate) durability: &'a Durability,
    pub(crate) torn: &'a TornProtection,
    /// The backend does `O_DIRECT`.
    pub(crate) direct: bool,
}

/// The newest version of page `page_no`.
///
/// Errors: [`Error::NoMemory`](crate::Error::NoMemory); `Error::Io` from
/// `pread`.
pub(crate) fn read_page(p: &Parts<'_>, page_no: u64) -> Result<PageRef> {
    if let Some(page) = p.buffer.find(page_no) {
        add(&p.counters.buffer_hits, 1);
        return Ok(page);
    }
    let seq = match p.cache.lookup(page_no) {
        Ok(page) => {
            add(&p.counters.cache_hits, 1);
            return Ok(page);
        }
        Err(seq) => seq,
    };
    let mut buf = p.buffer.page_buf()?;
    read_disk_page(p, page_no, &mut buf)?;
    let page = buf.share();
    if let Some(seq) = seq {
        p.cache.offer(page_no, seq, page.clone(), p.buffer.pool());
    }
    Ok(page)
}

/// Reads page `page_no` from disk into `buf` (one page): the part the
/// backend holds; past it, zeros.
///
/// Errors: `Error::Io` with op "pread".
pub(crate) fn read_disk_page(p: &Parts<'_>, page_no: u64, buf: &mut [u8]) -> Result<()> {
    let ps = p.config.page_size;
    let offset = p.buffer.offset_of(page_no);
    p.length.read_disk("pread", offset, |disk_len| {
        buf.fill(0);
        if offset < disk_len {
            let n = (disk_len - offset).min(ps as u64) as usize;
            p.backend.read_exact_at(offset, &mut buf[..n])?;
            add(&p.counters.disk_reads, 1);
            p.length.hide_kept(offset, &mut buf[..n]);
        }
        Ok(())
    })
}

/// Fills `buf` with the newest bytes from byte `offset` (the caller checked
/// the range): buffered, in-flight and cached pages are copied in, and
/// every stretch of pages in none of them is read with one call.
///
/// Errors: `Error::Io` from the read; [`Error::NoMemory`](crate::Error::NoMemory).
pub(crate) fn read_into(p: &Parts<'_>, offset: u64, buf: &mut [u8]) -> Result<()> {
    let end = offset + buf.len() as u64;
    let first = p.buffer.page_no(offset);
    let last = p.buffer.page_no(end - 1);
    let mut stretch: Option<u64> = None;
    for n in first..=last {
        let (lo, hi) = clip(p, n, offset, end);
        let page_start = p.buffer.offset_of(n);
        let dst = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
        if copy_newest(p, n, (lo - page_start) as usize, dst) {
            if let Some(a) = stretch.take() {
                read_stretch(p, a..n, offset, buf)?;
            }
        } else if stretch.is_none() {
            stretch = Some(n);
        }
    }
    if let Some(a) = stretch {
        read_stretch(p, a..last + 1, offset, buf)?;
    }
    Ok(())
}

/// Copies bytes `within..` of page `n` into `dst` from its newest
/// buffered, in-flight or cached version; `false` if it is in none.
fn copy_newest(p: &Parts<'_>, n: u64, within: usize, dst: &mut [u8]) -> bool {
    if p.buffer.copy_newest(n, within, dst) {
        add(&p.counters.buffer_hits, 1);
        return true;
    }
    if p.cache.copy_into(n, within, dst) {
        add(&p.counters.cache_hits, 1);
        return true;
    }
    false
}

/// Reads pages `pages` from disk into the part of `buf` (which starts at
/// byte `offset`) they cover. Past the disk length: zeros. A buffered file
/// without a read cache is read straight into `buf` with one `pread`;
/// otherwise whole pages are read into pool pages (aligned for `O_DIRECT`,
/// and what the cache keeps).
fn read_stretch(
    p: &Parts<'_>,
    pages: std::ops::Range<u64>,
    offset: u64,
    buf: &mut [u8],
) -> Result<()> {
    let end = offset + buf.len() as u64;
    let lo = p.buffer.offset_of(pages.start).max(offset);
    let hi = p.buffer.offset_of(pages.end).min(end);
    if !p.direct && !p.cache.is_enabled() {
        let dst = &mut buf[(lo - offset) as usize..(hi - offset) as usize];
        return p.length.read_disk("pread", lo, |disk_len| {
            let disk = disk_len.clamp(lo, hi);
            let (on_disk, past) = dst.split_at_mut((disk - lo) as usize);
            past.fill(0);
            if !on_disk.is_empty() {
                p.backend.read_exact_at(lo, on_disk)?;
                add(&p.counters.disk_reads, 1);
                p.length.hide_kept(lo, on_disk);
            }
            Ok(())
        });
    }
    let mut n = pages.start;
    while n < pages.end {
        let k = ((pages.end - n) as usize).min(IOV_MAX);
        read_pages(p, n, k, offset, buf)?;
        n += k as u64;
    }
    Ok(())
}

/// Reads `count` whole pages from page `first` with one `preadv` into pool
/// pages, copies what `buf` (starting at byte `offset`) covers, and
/// offers the pages to the read cache.
fn read_pages(p: &Parts<'_>, first: u64, count: usize, offset: u64, buf: &mut [u8]) -> Result<()> {
    let ps = p.config.page_size;
    let end = offset + buf.len() as u64;
    // Cache sequence numbers before the read: a flush that updates a
    // page's cache stripe meanwhile makes this read's copy too old to keep.
    let seqs: Vec<Option<u64>> = (first..first + count as u64)
        .map(|n| p.cache.seq(n))
        .collect();
    let mut pages: Vec<UniqueBuf> = (0..count)
        .map(|_| p.buffer.page_buf())
        .collect::<Result<_>>()?;
    let start = p.buffer.offset_of(first);
    p.length.read_disk("preadv", start, |disk| {
        let on_disk = disk.saturating_sub(start).min((count * ps) as u64) as usize;
        let mut left = on_disk;
        let mut iov: Vec<IoSliceMut<'_>> = Vec::with_capacity(on_disk.div_ceil(ps));
        for page in pages.iter_mut() {
            page.fill(0);
            if left == 0 {
                continue;
            }
            let k = left.min(ps);
            iov.push(IoSliceMut::new(&mut page[..k]));
            left -= k;
        }
        if on_disk > 0 {
            p.backend.read_vectored_exact_at(start, &mut iov)?;
            add(&p.counters.disk_reads, 1);
            for (i, page) in pages.iter_mut().enumerate() {
                p.length.hide_kept(start + (i * ps) as u64, page);
            }
        }
        Ok(())
    })?;
    for (i, page) in pages.into_iter().enumerate() {
        let n = first + i as u64;
        let (lo, hi) = clip(p, n, offset, end);
        let within = (lo - p.buffer.offset_of(n)) as usize;
        buf[(lo - offset) as usize..(hi - offset) as usize]
            .copy_from_slice(&page[within..within + (hi - lo) as usize]);
        match seqs[i] {
            Some(seq) => p.cache.offer(n, seq, page.share(), p.buffer.pool()),
            None => p.buffer.pool().put_all([page.share()]),
        }
    }
    Ok(())
}

/// The byte range of page `n` inside `[offset, end)`.
fn clip(p: &Parts<'_>, n: u64, offset: u64, end: u64) -> (u64, u64) {
    let start = p.buffer.offset_of(n);
    let stop = start + p.config.page_size as u64;
    (start.max(offset), stop.min(end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buffer::AlignedBuf;
    use std::sync::Arc;

    fn page() -> PageRef {
        Arc::new(AlignedBuf::zeroed(4096, 4096).unwrap())
    }

    #[test]
    fn a_page_hit_between_sweeps_survives_a_stream_of_new_pages() {
        let mut c = CacheStripe::default();
        let budget = 4 * 4096;
        let mut dropped = 0;
        c.insert(0, page(), budget, &mut |_| dropped += 1);
        for p in 1..1000u64 {
            assert!(c.get(0).is_some(), "hot page evicted before page {p}");
            c.insert(p, page(), budget, &mut |_| dropped += 1);
            assert!(c.bytes <= budget);
        }
        assert_eq!(dropped, 1000 - 4);
        assert_eq!(c.pages.len(), 4);
    }

    #[test]
    fn removal_frees_slots_and_bytes() {
        let mut c = CacheStripe::default();
        for p in 0..8u64 {
            c.insert(p, page(), 1 << 20, &mut |_| {});
        }
        c.remove_where(|p| p % 2 == 0, &mut |_| {});
        assert_eq!((c.pages.len(), c.bytes), (4, 4 * 4096));
        for p in 100..104u64 {
            c.insert(p, page(), 1 << 20, &mut |_| {});
        }
        assert_eq!(c.ring.len(), 8, "freed slots are reused");
        assert!(c.get(2).is_none() && c.get(3).is_some());
        // Too big for the budget: not cached, older copy dropped.
        c.insert(3, page(), 100, &mut |_| {});
        assert!(c.get(3).is_none());
    }
}
