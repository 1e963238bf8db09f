//! The read path: the newest bytes of a page, searched where the module
//! docs of `cached_file` say a page lives (write buffer, in-flight
//! generations, read cache, disk), in that order.
//!
//! Owns: nothing; functions over [`Parts`]. Takes a stripe lock, then a
//! cache stripe lock, one at a time; reads the disk with no lock held and
//! offers what it read to the read cache with the stripe's `seq` seen
//! before the read (`ReadCache::offer`), so a read racing a flush never
//! caches bytes older than a completed write.

use std::io::IoSliceMut;

use super::pages::PageRef;
use super::parts::Parts;
use super::stats::add;
use crate::backend::IOV_MAX;
use crate::buffer::UniqueBuf;
use crate::error::Result;

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
