//! Dirtying pages for flush measurements (criterion `benches/flush.rs`).

use crate::error::Result;
use crate::rng::WyRand;
use pagewriter::PagedCachedFile;

/// Which pages a flush benchmark dirties.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Pages `0..n`: one run per `max_write_bytes`.
    Sequential,
    /// Every other page `0, 2, 4, ...`: no two pages contiguous, so every
    /// engine makes one write per page.
    Strided,
    /// `n` pages as runs of 8 contiguous pages with a one-page gap between
    /// runs: what a B-tree commit of several leaves looks like.
    Clustered,
}

impl Layout {
    /// Page number of the `i`-th dirtied page.
    pub fn page(self, i: u64) -> u64 {
        match self {
            Layout::Sequential => i,
            Layout::Strided => 2 * i,
            Layout::Clustered => i / 8 * 9 + i % 8,
        }
    }
}

/// Writes `n` pages of random bytes in `layout` into the write buffer
/// (no flush).
///
/// Errors: those of [`PagedCachedFile::overwrite`].
pub fn dirty(file: &PagedCachedFile, layout: Layout, n: u64, rng: &mut WyRand) -> Result<()> {
    let ps = file.page_size();
    for i in 0..n {
        let mut page = file.overwrite(layout.page(i) * ps as u64, ps)?;
        rng.fill(&mut page);
    }
    Ok(())
}
