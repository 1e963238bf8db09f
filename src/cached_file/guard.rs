//! [`WritablePage`]: a guard over pages being written in place, from
//! [`PagedCachedFile::write`](crate::PagedCachedFile::write) or
//! [`overwrite`](crate::PagedCachedFile::overwrite). Part of the write
//! buffer's guard latches (`WriteBuffer::latch`): while it lives its pages
//! are latched; its drop buffers them and ends its write call
//! (`Lifecycle`).

use std::ops::{Deref, DerefMut};

use super::parts::Parts;
use crate::buffer::UniqueBuf;

/// Write access to one or more pages, from
/// [`PagedCachedFile::write`](crate::PagedCachedFile::write) or
/// [`PagedCachedFile::overwrite`](crate::PagedCachedFile::overwrite).
/// Derefs to the page bytes; dropping it puts them into the write buffer
/// (newest wins over anything written to those pages before the drop).
///
/// Component: write buffer (its guard latches, `cached_file/write_buffer.rs`).
pub struct WritablePage<'a> {
    parts: Parts<'a>,
    offset: u64,
    buf: Option<UniqueBuf>,
    /// For a guard over several pages: the pages it is split into when
    /// dropped, taken with the guard so the drop cannot fail.
    pages: Vec<UniqueBuf>,
    /// A [`Writer`](crate::Writer)'s scope: the guard's page numbers go
    /// there when it is dropped (buffered).
    scope: Option<&'a mut Vec<u64>>,
}

impl<'a> WritablePage<'a> {
    /// A guard over the pages at byte `offset` that `buf` holds, already
    /// latched and counted as a write call; `pages` as the split memory.
    pub(crate) fn new(
        parts: Parts<'a>,
        offset: u64,
        buf: UniqueBuf,
        pages: Vec<UniqueBuf>,
        scope: Option<&'a mut Vec<u64>>,
    ) -> Self {
        Self {
            parts,
            offset,
            buf: Some(buf),
            pages,
            scope,
        }
    }

    /// Byte offset of the first page.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// Drops the guard without writing its pages.
    pub(crate) fn abandon(mut self) {
        if let Some(buf) = self.buf.take() {
            let buffer = self.parts.buffer;
            let first = buffer.page_no(self.offset);
            let pages = (buf.len() / self.parts.config.page_size) as u64;
            buffer.unlatch(first..first + pages, buf, std::mem::take(&mut self.pages));
            self.parts.life.end_kept_write();
        }
    }
}

impl Deref for WritablePage<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.buf {
            Some(b) => b,
            None => &[],
        }
    }
}

impl DerefMut for WritablePage<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut self.buf {
            Some(b) => b,
            None => &mut [],
        }
    }
}

impl Drop for WritablePage<'_> {
    fn drop(&mut self) {
        if let Some(buf) = self.buf.take() {
            let pages = std::mem::take(&mut self.pages);
            let p = &self.parts;
            let first = p.buffer.page_no(self.offset);
            let count = (buf.len() / p.config.page_size) as u64;
            p.buffer
                .insert_guarded(self.offset, buf, pages, p.length, p.counters);
            if let Some(scope) = self.scope.as_mut() {
                scope.extend(first..first + count);
            }
            p.life.end_kept_write();
        }
    }
}
