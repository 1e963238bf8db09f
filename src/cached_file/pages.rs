//! Pages as the cached file holds them: shared, immutable page memory
//! ([`PageRef`]) and the maps from page number to page that the write
//! buffer's stripes and the in-flight generations are made of.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use crate::buffer::AlignedBuf;

/// A page (or a range of pages) as returned by [`PagedCachedFile::read`](crate::PagedCachedFile::read):
/// shared, immutable, aligned to [`Config::page_align`](crate::Config::page_align). Derefs to `[u8]`.
///
/// Held by the write buffer, the in-flight generations and the read cache (`cached_file/pages.rs`).
pub type PageRef = Arc<AlignedBuf>;

/// Hash for page numbers: Fibonacci multiply, enough for keys that are
/// dense integers (the default SipHash costs more than it buys here).
#[derive(Default)]
pub(crate) struct PageHasher(u64);

impl Hasher for PageHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u64(&mut self, n: u64) {
        let h = n.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ (h >> 29);
    }
}

pub(crate) type PageMap = HashMap<u64, PageRef, BuildHasherDefault<PageHasher>>;
