//! Aligned page memory.
//!
//! Every page the write buffer holds lives in an [`AlignedBuf`], so that the
//! same memory can later be handed to `O_DIRECT` I/O (which needs both the
//! buffer address and the length aligned to the device's logical block size)
//! without a bounce copy.

use std::alloc::{self, Layout};

use parking_lot::Mutex;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::Arc;

/// Default alignment of page memory in bytes: 4096, which satisfies the
/// `O_DIRECT` alignment of every Linux block device in common use.
pub const DEFAULT_ALIGN: usize = 4096;

/// A heap buffer of fixed length whose start address is a multiple of its
/// alignment. Zero-filled on creation.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    align: usize,
    /// Bytes allocated (`len` rounded up for huge pages).
    cap: usize,
    backing: Backing,
}

/// Where an [`AlignedBuf`]'s memory comes from, and so how it is freed.
enum Backing {
    /// The global allocator: `cap` bytes at `align`.
    Heap,
    /// Its own anonymous mapping of `cap` bytes ([`AlignedBuf::huge`]).
    Mapping,
    /// `cap` bytes of a slab shared with the other buffers carved from it
    /// ([`thp_slab`]). Dropping one gives its memory back (`MADV_DONTNEED`,
    /// keeping the mapping whole: unmapping pieces would split it into VMAs
    /// until `vm.max_map_count` refuses); the last one unmaps the slab.
    Slab(Arc<Slab>),
}

/// A slab mapping, unmapped when the last buffer carved from it drops.
struct Slab {
    /// Start address of the mapping (an address only: never read or
    /// written through).
    base: usize,
    /// Its length in bytes.
    len: usize,
}

impl Drop for Slab {
    fn drop(&mut self) {
        // SAFETY: `base..base+len` is the whole mapping left by `thp_slab`;
        // every buffer carved from it held this Slab and has dropped, so
        // nothing uses the range any more.
        unsafe { os::unmap(self.base as *mut u8, self.len) };
    }
}

/// Size of a huge page on x86-64 and arm64 with 4 KiB base pages: 2 MiB.
pub const HUGE_PAGE: usize = 2 << 20;

/// How the memory of a huge-page buffer was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum HugePages {
    /// `mmap(MAP_HUGETLB | MAP_HUGE_2MB)`: reserved 2 MiB huge pages.
    Reserved,
    /// Heap memory aligned to 2 MiB, `madvise(MADV_HUGEPAGE)` on Linux
    /// (elsewhere only aligned; FreeBSD promotes it on its own).
    Transparent,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Box<[u8]>); it has
// no interior mutability, so sharing `&AlignedBuf` across threads is sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// Like [`zeroed`](Self::zeroed) (`len` bytes aligned to `align`
    /// bytes), but memory the allocator refuses is an error, not an abort:
    /// `Ok(None)` for a bad layout (as `zeroed`), `Err(len)` when `len`
    /// bytes cannot be had. Never panics.
    pub fn try_zeroed(len: usize, align: usize) -> Result<Option<Self>, usize> {
        let Ok(layout) = Layout::from_size_align(len, align) else {
            return Ok(None);
        };
        if len == 0 {
            return Ok(Self::zeroed(0, align));
        }
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        match NonNull::new(raw) {
            Some(ptr) => Ok(Some(Self {
                ptr,
                len,
                align,
                cap: len,
                backing: Backing::Heap,
            })),
            None => Err(len),
        }
    }

    /// A zeroed buffer of `len` bytes aligned to `align` bytes.
    ///
    /// Returns `None` if `align` is not a power of two or `len` rounded up to
    /// `align` overflows `isize`. Aborts (like `Vec`) if the allocator fails.
    pub fn zeroed(len: usize, align: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len, align).ok()?;
        if len == 0 {
            // No allocation; a dangling pointer that is still aligned.
            let ptr = NonNull::new(std::ptr::without_provenance_mut::<u8>(align))?;
            return Some(Self {
                ptr,
                len,
                align,
                cap: 0,
                backing: Backing::Heap,
            });
        }
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Some(Self {
            ptr,
            len,
            align,
            cap: len,
            backing: Backing::Heap,
        })
    }

    /// A zeroed buffer of `len` bytes (> 0, mapped rounded up to 2 MiB) on
    /// reserved huge pages (`MAP_HUGETLB`) where enough are free, else
    /// 2 MiB-aligned memory advised for transparent huge pages.
    ///
    /// Errors: `len` is 0 (`InvalidInput`); the `MAP_HUGETLB` error comes
    /// beside the fallback buffer (`Unsupported` off Linux).
    pub fn huge(len: usize) -> std::io::Result<(Self, HugePages, Option<std::io::Error>)> {
        if len == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a huge-page buffer needs a length",
            ));
        }
        let map_len = len.div_ceil(HUGE_PAGE) * HUGE_PAGE;
        let why = match os::map_huge(map_len) {
            Ok(ptr) => {
                let buf = Self {
                    ptr,
                    len,
                    align: HUGE_PAGE,
                    cap: map_len,
                    backing: Backing::Mapping,
                };
                return Ok((buf, HugePages::Reserved, None));
            }
            Err(why) => why,
        };
        let mut buf = Self::zeroed(map_len, HUGE_PAGE).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "length overflows")
        })?;
        // SAFETY: advice on memory this buffer owns, which changes no
        // contents. A failure (THP disabled) only loses the advice.
        unsafe { os::advise_huge(buf.ptr.as_ptr(), map_len) };
        // Expose `len` bytes; `cap` keeps the allocation's size for `Drop`.
        buf.len = len;
        Ok((buf, HugePages::Transparent, Some(why)))
    }

    /// A copy of `bytes` in a buffer aligned to `align` bytes; `None` as for
    /// [`zeroed`](Self::zeroed).
    pub fn copy_from(bytes: &[u8], align: usize) -> Option<Self> {
        let mut buf = Self::zeroed(bytes.len(), align)?;
        buf.copy_from_slice(bytes);
        Some(buf)
    }

    /// Alignment of the start address in bytes.
    pub fn align(&self) -> usize {
        self.align
    }
}

/// The sizes of a slab of `count` buffers of `len` bytes (see
/// [`thp_slab`]).
#[derive(Debug, PartialEq, Eq)]
struct SlabSize {
    /// Bytes from one buffer's start to the next: `len` rounded up to 4 KiB.
    stride: usize,
    /// Bytes the buffers own: `stride * count`, rounded up to 2 MiB unless
    /// under [`SMALL_SLAB`] (the last buffer owns the slack).
    total: usize,
    /// Bytes to map: `total`, plus 2 MiB to align within. Under
    /// [`SMALL_SLAB`] in all, the slab is a plain mapping of its size.
    map_len: usize,
    /// 2 MiB aligned and advised for huge pages (not a small slab).
    huge: bool,
}

/// A slab smaller than this (512 KiB) is a plain mapping of its size, not
/// a 2 MiB huge page: a direct I/O from it needs at most 128 4 KiB
/// segments anyway (a virtio disk takes 254 in one request).
const SMALL_SLAB: usize = HUGE_PAGE / 4;

impl SlabSize {
    fn of(len: usize, count: usize) -> Option<Self> {
        if len == 0 || count == 0 {
            return None;
        }
        let stride = len.checked_next_multiple_of(4096)?;
        let used = stride.checked_mul(count)?;
        if used < SMALL_SLAB {
            return Some(Self {
                stride,
                total: used,
                map_len: used,
                huge: false,
            });
        }
        let total = used.checked_next_multiple_of(HUGE_PAGE)?;
        Some(Self {
            stride,
            total,
            map_len: total.checked_add(HUGE_PAGE)?,
            huge: true,
        })
    }
}

/// `count` buffers of `len` bytes (stride rounded up to 4 KiB) carved from
/// one 2 MiB-aligned anonymous mapping advised for transparent huge pages
/// (under 512 KiB in all: a plain mapping): physically contiguous in
/// 2 MiB pieces where the kernel finds them, so a large direct I/O needs
/// few segments.
/// Dropping a buffer gives its memory back; the last one unmaps the slab.
///
/// Errors: `len` or `count` is 0 or the size overflows (`InvalidInput`);
/// `mmap`'s error.
pub fn thp_slab(len: usize, count: usize) -> std::io::Result<Vec<AlignedBuf>> {
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidInput, "bad slab size");
    let SlabSize {
        stride,
        total,
        map_len,
        huge,
    } = SlabSize::of(len, count).ok_or_else(invalid)?;
    let raw = os::map(map_len)?.as_ptr();
    let start = raw as usize;
    let base = if huge {
        start.next_multiple_of(HUGE_PAGE)
    } else {
        start
    };
    let head = base - start;
    let tail = map_len - head - total;
    let (kept, kept_len) = if os::PARTIAL_UNMAP {
        // SAFETY: trimming the unaligned head and the tail of the mapping
        // just made; both ranges are page-aligned parts of it that nothing
        // uses.
        unsafe {
            if head > 0 {
                os::unmap(raw, head);
            }
            if tail > 0 {
                os::unmap((base + total) as *mut u8, tail);
            }
        }
        (base, total)
    } else {
        // Kept whole, unused head and tail included (reserved address
        // space only: never touched).
        (start, map_len)
    };
    if huge {
        // SAFETY: advice only, on the slab's own pages: without THP the
        // memory is ordinary pages.
        unsafe { os::advise_huge(base as *mut u8, total) };
    }
    let slab = Arc::new(Slab {
        base: kept,
        len: kept_len,
    });
    Ok((0..count)
        .map(|i| {
            let ptr = base + i * stride;
            // The last buffer also owns the slack up to the 2 MiB end.
            let cap = if i + 1 == count {
                total - i * stride
            } else {
                stride
            };
            AlignedBuf {
                ptr: NonNull::new(ptr as *mut u8).expect("mmap is not NULL"),
                len,
                align: 4096,
                cap,
                backing: Backing::Slab(Arc::clone(&slab)),
            }
        })
        .collect())
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr` points at `len` initialised (zeroed at allocation)
        // bytes owned by `self`, or is a dangling aligned pointer with len 0.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        // The layout was valid when `self` was made, so this cannot fail.
        Self::copy_from(self, self.align).expect("layout was valid at creation")
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.cap == 0 {
            return;
        }
        match &self.backing {
            // SAFETY: `ptr..ptr+cap` is the mapping made in `huge`, owned
            // by this buffer alone.
            Backing::Mapping => unsafe {
                os::unmap(self.ptr.as_ptr(), self.cap);
            },
            // The last buffer of a slab leaves the memory to the unmap that
            // follows when its `Arc<Slab>` drops (after this function).
            Backing::Slab(slab) if Arc::strong_count(slab) > 1 => {
                // SAFETY: `ptr..ptr+cap` is this buffer's own piece of the
                // slab (pieces are disjoint), which nobody uses after this
                // drop; the mapping stays, held by the other buffers.
                // `discard` frees the memory and changes no mapping.
                unsafe { os::discard(self.ptr.as_ptr(), self.cap) };
            }
            Backing::Slab(_) => {}
            // SAFETY: allocated in `zeroed` with exactly `cap` bytes and
            // this alignment (which passed `Layout::from_size_align` then).
            Backing::Heap => unsafe {
                alloc::dealloc(
                    self.ptr.as_ptr(),
                    Layout::from_size_align_unchecked(self.cap, self.align),
                )
            },
        }
    }
}

/// Bytes of one slab of a [`BufferPool`]: 2 MiB, one transparent huge
/// page.
pub const SLAB_BYTES: usize = HUGE_PAGE;

/// A buffer with one owner, already wrapped in the [`Arc`] that shares it
/// once it is handed on ([`share`](Self::share) costs nothing).
///
/// The write buffer shares pages as `Arc<AlignedBuf>`; a [`BufferPool`]
/// keeps idle buffers in this form, so a page that goes round write, flush
/// and pool reuses its `Arc` allocation too.
pub struct UniqueBuf(Arc<AlignedBuf>);

impl UniqueBuf {
    /// Wraps a buffer (one allocation, for the `Arc`).
    pub fn new(buf: AlignedBuf) -> Self {
        Self(Arc::new(buf))
    }

    /// Takes `page` back if nothing else holds it, else returns it.
    pub fn try_unique(mut page: Arc<AlignedBuf>) -> Result<Self, Arc<AlignedBuf>> {
        // `get_mut` succeeds only for the one strong reference and no weak
        // one, and keeps that so for as long as `page` is owned here.
        match Arc::get_mut(&mut page) {
            Some(_) => Ok(Self(page)),
            None => Err(page),
        }
    }

    /// The buffer as a shared page.
    pub fn share(self) -> Arc<AlignedBuf> {
        self.0
    }
}

impl Deref for UniqueBuf {
    type Target = AlignedBuf;
    fn deref(&self) -> &AlignedBuf {
        &self.0
    }
}

impl DerefMut for UniqueBuf {
    fn deref_mut(&mut self) -> &mut AlignedBuf {
        // Made from a new `Arc` or one proven unique, and never cloned:
        // the reference is the only one.
        Arc::get_mut(&mut self.0).expect("a UniqueBuf has one owner")
    }
}

impl fmt::Debug for UniqueBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// A free list of page buffers of one size and alignment, so that a steady
/// write load neither allocates nor frees page memory (LMDB keeps freed
/// dirty pages for reuse the same way). Holds at most `max_bytes` of idle
/// buffers, with their `Arc` ([`UniqueBuf`]); what is returned past that is
/// freed.
pub struct BufferPool {
    len: usize,
    align: usize,
    max_buffers: usize,
    free: Mutex<Vec<UniqueBuf>>,
}

/// A buffer [`BufferPool::take`] handed out: a reused one holds its old
/// bytes, a fresh one is zeroed.
enum Taken {
    Reused(UniqueBuf),
    Fresh(UniqueBuf),
}

impl BufferPool {
    /// A pool of `len`-byte buffers aligned to `align`, keeping at most
    /// `max_bytes` idle. `None` if `align` is not a power of two.
    pub fn new(len: usize, align: usize, max_bytes: usize) -> Option<Self> {
        Layout::from_size_align(len, align).ok()?;
        Some(Self {
            len,
            align,
            max_buffers: max_bytes / len.max(1),
            free: Mutex::new(Vec::new()),
        })
    }

    /// Length of the pool's buffers in bytes.
    pub fn buffer_len(&self) -> usize {
        self.len
    }

    /// A zero-filled buffer: a pooled one cleared, or a new one.
    ///
    /// When the pool is empty it is refilled with a slab: [`SLAB_BYTES`] of
    /// one mapping carved into buffers ([`thp_slab`]), handed out in address
    /// order. Pages allocated one after another (a transaction writing
    /// consecutive pages) are then adjacent in memory, and a run of them
    /// goes to `pwritev` as one iovec (`backend::file::merge_adjacent`).
    /// Where the alignment is above 4 KiB or the mapping fails, buffers are
    /// allocated one by one.
    ///
    /// Aborts (like `Vec`) if the allocator fails; [`try_zeroed`](Self::try_zeroed)
    /// returns `None` instead.
    pub fn zeroed(&self) -> UniqueBuf {
        self.try_zeroed().unwrap_or_else(|| self.alloc_failed())
    }

    /// Aborts as `Vec` does when the allocator refuses a buffer.
    fn alloc_failed(&self) -> ! {
        alloc::handle_alloc_error(
            Layout::from_size_align(self.len, self.align).expect("layout checked in new"),
        )
    }

    /// Like [`zeroed`](Self::zeroed), but memory the allocator refuses is
    /// `None`, not an abort.
    pub fn try_zeroed(&self) -> Option<UniqueBuf> {
        match self.take()? {
            Taken::Reused(mut b) => {
                b.fill(0);
                Some(b)
            }
            Taken::Fresh(b) => Some(b),
        }
    }

    /// A buffer off the free list; where it is empty, one from a new slab
    /// (at most as many as the pool may keep idle, plus this one; popped
    /// from the end, they come out in address order), else one allocated
    /// alone. `None` where the allocator refuses memory.
    fn take(&self) -> Option<Taken> {
        let mut free = self.free.lock();
        if let Some(b) = free.pop() {
            return Some(Taken::Reused(b));
        }
        self.refill(&mut free);
        let from_slab = free.pop();
        drop(free);
        match from_slab {
            Some(b) => Some(Taken::Fresh(b)),
            None => match AlignedBuf::try_zeroed(self.len, self.align) {
                Ok(Some(b)) => Some(Taken::Fresh(UniqueBuf::new(b))),
                _ => None,
            },
        }
    }

    /// Like [`copy_of`](Self::copy_of) (and like it, panics unless `bytes`
    /// is `buffer_len()` long), but memory the allocator refuses is `None`,
    /// not an abort.
    pub fn try_copy_of(&self, bytes: &[u8]) -> Option<UniqueBuf> {
        assert_eq!(bytes.len(), self.len, "BufferPool::copy_of length");
        let (Taken::Reused(mut b) | Taken::Fresh(mut b)) = self.take()?;
        b.copy_from_slice(bytes);
        Some(b)
    }

    /// Buffers holding copies of `bytes` cut into `buffer_len()` pieces,
    /// put in order into the first slots of `out`; `false` (nothing kept)
    /// if the allocator refuses memory. The buffers are taken under one
    /// lock, so the pages of one call come out of the free list (or a new
    /// slab) one after another, adjacent in memory where they were adjacent
    /// when they came back: a run written by one call goes to `pwritev` as
    /// one or two segments, not one per page. Allocates nothing when the
    /// free list holds enough.
    ///
    /// Panics if `bytes` is not a whole number of buffers long or `out`
    /// has fewer slots than that (a caller bug, not an input error).
    pub fn try_copies_of(&self, bytes: &[u8], out: &mut [Option<UniqueBuf>]) -> bool {
        assert!(
            self.len > 0 && bytes.len().is_multiple_of(self.len),
            "BufferPool::copies_of length"
        );
        let n = bytes.len() / self.len;
        let out = &mut out[..n];
        let mut got = 0;
        {
            let mut free = self.free.lock();
            while got < n {
                if free.is_empty() {
                    self.refill(&mut free);
                }
                match free.pop() {
                    Some(b) => {
                        out[got] = Some(b);
                        got += 1;
                    }
                    None => break,
                }
            }
        }
        while got < n {
            match AlignedBuf::try_zeroed(self.len, self.align) {
                Ok(Some(b)) => {
                    out[got] = Some(UniqueBuf::new(b));
                    got += 1;
                }
                _ => {
                    self.put_all(
                        out[..got]
                            .iter_mut()
                            .filter_map(|b| b.take())
                            .map(UniqueBuf::share),
                    );
                    return false;
                }
            }
        }
        for (b, chunk) in out.iter_mut().zip(bytes.chunks_exact(self.len)) {
            b.as_mut().expect("taken above").copy_from_slice(chunk);
        }
        true
    }

    /// Refills an empty free list with a slab ([`thp_slab`]), its buffers
    /// to be popped in address order; nothing where the alignment is above
    /// 4 KiB, a slab would hold fewer than 2 buffers, or the mapping fails.
    fn refill(&self, free: &mut Vec<UniqueBuf>) {
        let per_slab = (SLAB_BYTES / self.len.next_multiple_of(4096).max(1))
            .min(self.max_buffers.saturating_add(1));
        if self.align <= 4096
            && per_slab >= 2
            && let Ok(slab) = thp_slab(self.len, per_slab)
        {
            free.extend(slab.into_iter().rev().map(UniqueBuf::new));
        }
    }

    /// A buffer holding a copy of `bytes`, which must be `buffer_len()`
    /// long (panics otherwise: a caller bug, not an input error).
    pub fn copy_of(&self, bytes: &[u8]) -> UniqueBuf {
        self.try_copy_of(bytes)
            .unwrap_or_else(|| self.alloc_failed())
    }

    /// Returns buffers to the pool: those nothing else holds any more and
    /// of this size and alignment, up to the idle bound; the rest are
    /// dropped (a buffer still held elsewhere lives on there). Give them in
    /// file order (a flushed batch): they are handed out again in the
    /// reverse of the order they came back in, so pages reused for the
    /// next consecutive pages stay adjacent where they were.
    pub fn put_all(
        &self,
        bufs: impl IntoIterator<Item = Arc<AlignedBuf>, IntoIter: DoubleEndedIterator>,
    ) {
        let mut free = self.free.lock();
        for b in bufs.into_iter().rev() {
            if free.len() < self.max_buffers
                && b.len() == self.len
                && b.align() == self.align
                && let Ok(b) = UniqueBuf::try_unique(b)
            {
                free.push(b);
            }
        }
    }

    /// Idle buffers held now.
    pub fn idle(&self) -> usize {
        self.free.lock().len()
    }
}

impl Drop for BufferPool {
    /// Idle slab pages go without giving their memory back one by one: each
    /// only lets go of its slab, and a slab whose pages are all idle here is
    /// unmapped whole, so closing a file whose pool holds 1 GiB of idle
    /// 4 KiB pages makes one `munmap` per 2 MiB, not 262,144 calls. (A slab
    /// with a page still held elsewhere keeps its memory until that page
    /// drops.)
    fn drop(&mut self) {
        for mut b in std::mem::take(self.free.get_mut()) {
            if matches!(b.backing, Backing::Slab(_)) {
                // `cap` 0: `AlignedBuf::drop` frees nothing itself; the
                // slab reference drops with the buffer.
                b.cap = 0;
            }
        }
    }
}

impl fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferPool")
            .field("len", &self.len)
            .field("align", &self.align)
            .field("max_buffers", &self.max_buffers)
            .field("idle", &self.idle())
            .finish()
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("align", &self.align)
            .finish()
    }
}

impl PartialEq for AlignedBuf {
    fn eq(&self, other: &Self) -> bool {
        self[..] == other[..]
    }
}

/// Page memory from the OS: anonymous mappings, given back piece by piece
/// (a slab's dropped buffers) and advised for huge pages where the
/// platform has them.
#[cfg(unix)]
mod os {
    use std::io;
    use std::ptr::NonNull;

    /// Part of a mapping can be unmapped (a slab's unaligned head).
    pub(super) const PARTIAL_UNMAP: bool = true;

    /// `mmap(MAP_PRIVATE | MAP_ANONYMOUS)` of `len` (> 0) bytes, zeroed.
    pub(super) fn map(len: usize) -> io::Result<NonNull<u8>> {
        map_with(len, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS)
    }

    /// Reserved 2 MiB huge pages: `mmap(MAP_HUGETLB | MAP_HUGE_2MB)` on
    /// Linux; `Unsupported` elsewhere.
    pub(super) fn map_huge(len: usize) -> io::Result<NonNull<u8>> {
        #[cfg(target_os = "linux")]
        {
            // MAP_HUGE_2MB: log2(2 MiB) = 21 in the MAP_HUGE_SHIFT bits.
            let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | (21 << 26);
            map_with(len, flags)
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = len;
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("no reserved huge pages on {}", std::env::consts::OS),
            ))
        }
    }

    fn map_with(len: usize, flags: libc::c_int) -> io::Result<NonNull<u8>> {
        // SAFETY: a fresh anonymous private mapping at a kernel-chosen
        // address; no existing memory is affected. The result is checked.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(NonNull::new(raw.cast::<u8>()).expect("mmap does not return NULL"))
    }

    /// `munmap`.
    ///
    /// # Safety
    /// `ptr..ptr+len` is a page-aligned part of a mapping made here that
    /// nothing uses any more.
    pub(super) unsafe fn unmap(ptr: *mut u8, len: usize) {
        // SAFETY: as the caller promises.
        unsafe { libc::munmap(ptr.cast(), len) };
    }

    /// `madvise(MADV_DONTNEED)`: the memory goes back to the kernel, the
    /// mapping stays.
    ///
    /// # Safety
    /// `ptr..ptr+len` is a page-aligned part of a mapping made here that
    /// nothing reads or writes any more.
    pub(super) unsafe fn discard(ptr: *mut u8, len: usize) {
        // SAFETY: as the caller promises; the advice changes no mapping.
        unsafe { libc::madvise(ptr.cast(), len, libc::MADV_DONTNEED) };
    }

    /// `madvise(MADV_HUGEPAGE)` on Linux; nothing elsewhere.
    ///
    /// # Safety
    /// `ptr..ptr+len` is memory the caller owns.
    pub(super) unsafe fn advise_huge(ptr: *mut u8, len: usize) {
        #[cfg(target_os = "linux")]
        // SAFETY: as the caller promises; the advice changes no contents,
        // and a failure (THP disabled) only loses the advice.
        unsafe {
            libc::madvise(ptr.cast(), len, libc::MADV_HUGEPAGE);
        }
        let _ = (ptr, len);
    }
}

/// Page memory from the OS on Windows: `VirtualAlloc` regions, released
/// whole, decommitted piece by piece.
#[cfg(windows)]
mod os {
    use std::io;
    use std::ptr::NonNull;

    use windows_sys::Win32::System::Memory::{
        MEM_COMMIT, MEM_DECOMMIT, MEM_RELEASE, MEM_RESERVE, PAGE_READWRITE, VirtualAlloc,
        VirtualFree,
    };

    /// A region is released whole only.
    pub(super) const PARTIAL_UNMAP: bool = false;

    /// `VirtualAlloc(MEM_RESERVE | MEM_COMMIT)` of `len` (> 0) bytes,
    /// zeroed.
    pub(super) fn map(len: usize) -> io::Result<NonNull<u8>> {
        // SAFETY: a fresh region at a system-chosen address; no existing
        // memory is affected. The result is checked.
        let raw = unsafe {
            VirtualAlloc(
                std::ptr::null(),
                len,
                MEM_RESERVE | MEM_COMMIT,
                PAGE_READWRITE,
            )
        };
        NonNull::new(raw.cast::<u8>()).ok_or_else(io::Error::last_os_error)
    }

    /// `Unsupported`: large pages on Windows need a privilege this crate
    /// does not ask for.
    pub(super) fn map_huge(_len: usize) -> io::Result<NonNull<u8>> {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "no reserved huge pages on windows",
        ))
    }

    /// `VirtualFree(MEM_RELEASE)` of the whole region.
    ///
    /// # Safety
    /// `ptr` is the start of a region made here, `len` its length, and
    /// nothing uses it any more.
    pub(super) unsafe fn unmap(ptr: *mut u8, len: usize) {
        let _ = len;
        // SAFETY: as the caller promises (MEM_RELEASE takes size 0).
        unsafe { VirtualFree(ptr.cast(), 0, MEM_RELEASE) };
    }

    /// `VirtualFree(MEM_DECOMMIT)`: the memory goes back, the address
    /// range stays reserved until the region is released.
    ///
    /// # Safety
    /// `ptr..ptr+len` is a page-aligned part of a region made here that
    /// nothing reads or writes any more.
    pub(super) unsafe fn discard(ptr: *mut u8, len: usize) {
        // SAFETY: as the caller promises.
        unsafe { VirtualFree(ptr.cast(), len, MEM_DECOMMIT) };
    }

    /// Nothing: no transparent huge pages on Windows.
    ///
    /// # Safety
    /// None needed; `unsafe` to match the Unix one.
    pub(super) unsafe fn advise_huge(_ptr: *mut u8, _len: usize) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropping_a_pool_unmaps_only_its_idle_pages() {
        let pool = BufferPool::new(4096, 4096, 64 << 20).unwrap();
        // Two slabs' worth and a bit, so idle pages span slab boundaries.
        let mut pages: Vec<UniqueBuf> = (0..1100).map(|_| pool.zeroed()).collect();
        // Keep every third page (a gap in each idle range), return the rest
        // out of order.
        let kept: Vec<UniqueBuf> = (0..pages.len() / 3)
            .map(|i| pages.swap_remove(i * 2))
            .collect();
        pages.reverse();
        pool.put_all(pages.into_iter().map(UniqueBuf::share));
        drop(pool);
        // The pages held outside are still mapped and writable.
        for (i, mut p) in kept.into_iter().enumerate() {
            p.fill(i as u8);
            assert!(p.iter().all(|&b| b == i as u8));
        }
    }

    #[test]
    fn pool_hands_out_slab_pages_in_address_order_and_reuses_them_so() {
        let pool = BufferPool::new(4096, 4096, 64 << 20).unwrap();
        let pages: Vec<UniqueBuf> = (0..8).map(|_| pool.zeroed()).collect();
        for w in pages.windows(2) {
            assert_eq!(w[0].as_ptr() as usize + 4096, w[1].as_ptr() as usize);
        }
        assert!(pages.iter().all(|p| p.iter().all(|&b| b == 0)));
        let addrs: Vec<usize> = pages.iter().map(|p| p.as_ptr() as usize).collect();
        // Back in file order, dirty: out again in the same order, zeroed.
        let mut pages = pages;
        for p in &mut pages {
            p.fill(0xAB);
        }
        pool.put_all(pages.into_iter().map(UniqueBuf::share));
        let again: Vec<UniqueBuf> = (0..8).map(|_| pool.zeroed()).collect();
        assert_eq!(
            again
                .iter()
                .map(|p| p.as_ptr() as usize)
                .collect::<Vec<_>>(),
            addrs
        );
        assert!(again.iter().all(|p| p.iter().all(|&b| b == 0)));
        // Copies taken one at a time come from slabs the same way.
        let fresh = BufferPool::new(4096, 4096, 64 << 20).unwrap();
        let copies: Vec<UniqueBuf> = (0..8u8).map(|i| fresh.copy_of(&[i; 4096])).collect();
        for (i, w) in copies.windows(2).enumerate() {
            assert_eq!(w[0].as_ptr() as usize + 4096, w[1].as_ptr() as usize);
            assert!(w[0].iter().all(|&b| b == i as u8));
        }
        // A pool that may keep few idle buffers carves small slabs.
        let small = BufferPool::new(4096, 4096, 2 * 4096).unwrap();
        let _a = small.zeroed();
        assert!(small.idle() <= 2);
    }

    #[test]
    fn small_slabs_are_mapped_at_their_size_large_ones_on_huge_pages() {
        // Three 4 KiB buffers: 12 KiB mapped, not a 2 MiB huge page.
        let s = SlabSize::of(4096, 3).unwrap();
        assert_eq!((s.stride, s.total, s.map_len), (4096, 3 * 4096, 3 * 4096));
        assert!(!s.huge);
        // 1000-byte buffers take 4 KiB strides.
        assert_eq!(SlabSize::of(1000, 7).unwrap().total, 7 * 4096);
        // One 1 MiB I/O buffer: on a huge page (256 segments otherwise).
        let s = SlabSize::of(1 << 20, 1).unwrap();
        assert_eq!((s.total, s.map_len), (HUGE_PAGE, 2 * HUGE_PAGE));
        assert!(s.huge);
        // A full slab: 2 MiB, plus 2 MiB of room to align it.
        let s = SlabSize::of(4096, 512).unwrap();
        assert_eq!((s.total, s.map_len), (HUGE_PAGE, 2 * HUGE_PAGE));
        // Past 2 MiB: rounded up to whole huge pages.
        assert_eq!(SlabSize::of(1 << 20, 5).unwrap().total, 3 * HUGE_PAGE);
        assert!(SlabSize::of(0, 1).is_none() && SlabSize::of(1, 0).is_none());
        assert!(SlabSize::of(usize::MAX, 2).is_none());
    }

    /// Mappings of this process that overlap `lo..hi` (`/proc/self/maps`).
    fn mappings_over(lo: usize, hi: usize) -> usize {
        std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .filter(|l| {
                let range = l.split_whitespace().next().unwrap();
                let (a, b) = range.split_once('-').unwrap();
                let a = usize::from_str_radix(a, 16).unwrap();
                let b = usize::from_str_radix(b, 16).unwrap();
                a < hi && lo < b
            })
            .count()
    }

    /// Freeing slab pages between live ones gives their memory back
    /// without cutting the mapping: unmapping each would leave a hole and
    /// one more mapping per page, until `vm.max_map_count` refuses new
    /// mappings (a read cache evicting pages did this steadily).
    #[test]
    #[cfg_attr(
        not(target_os = "linux"),
        ignore = "counts mappings in /proc/self/maps (Linux)"
    )]
    fn freeing_slab_pages_one_by_one_keeps_the_slab_one_mapping() {
        let mut bufs = thp_slab(4096, 512).unwrap();
        let lo = bufs[0].as_ptr() as usize;
        let hi = lo + 512 * 4096;
        let before = mappings_over(lo, hi);
        assert!(before >= 1);
        let mut i = 0;
        bufs.retain(|_| {
            i += 1;
            i % 2 == 0
        });
        assert_eq!(bufs.len(), 256);
        assert_eq!(mappings_over(lo, hi), before, "the slab was cut up");
        for (i, b) in bufs.iter_mut().enumerate() {
            b.fill(i as u8);
        }
        for (i, b) in bufs.iter().enumerate() {
            assert!(b.iter().all(|&x| x == i as u8));
        }
    }

    #[test]
    fn slab_buffers_are_disjoint_aligned_zeroed_and_freed_one_by_one() {
        for (len, count) in [
            (4096usize, 1usize),
            (1 << 20, 5),
            (1000, 7),
            (128 << 10, 128),
        ] {
            let mut bufs = thp_slab(len, count).unwrap();
            assert_eq!(bufs.len(), count);
            if SlabSize::of(len, count).unwrap().huge {
                assert_eq!(bufs[0].as_ptr() as usize % HUGE_PAGE, 0);
            }
            for (i, b) in bufs.iter_mut().enumerate() {
                assert_eq!(b.len(), len);
                assert_eq!(b.as_ptr() as usize % 4096, 0);
                assert!(b.iter().all(|&x| x == 0));
                b.fill(i as u8 + 1);
            }
            for (i, b) in bufs.iter().enumerate() {
                assert!(b.iter().all(|&x| x == i as u8 + 1), "buffers overlap");
            }
            // Dropping some while others live must not disturb the rest.
            let keep = bufs.split_off(count / 2);
            drop(bufs);
            for b in &keep {
                assert_eq!(b[len - 1], b[0]);
            }
        }
        assert!(thp_slab(0, 1).is_err() && thp_slab(1, 0).is_err());
    }

    #[test]
    fn huge_buffers_are_zeroed_aligned_writable_and_freed() {
        for len in [1usize, HUGE_PAGE, HUGE_PAGE + 4096] {
            let (mut buf, kind, why) = AlignedBuf::huge(len).unwrap();
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_ptr() as usize % HUGE_PAGE, 0, "{kind:?}");
            assert_eq!(kind == HugePages::Transparent, why.is_some());
            assert!(buf.iter().all(|&b| b == 0));
            buf.fill(0xAB);
            assert_eq!(buf.clone()[len - 1], 0xAB);
        }
        assert!(AlignedBuf::huge(0).is_err());
    }

    #[test]
    fn aligned_and_zeroed() {
        for align in [1, 8, 512, 4096, 1 << 16] {
            for len in [0, 1, 511, 4096, 12288] {
                let mut b = AlignedBuf::zeroed(len, align).unwrap();
                assert_eq!(b.as_ptr() as usize % align, 0);
                assert_eq!(b.len(), len);
                assert!(b.iter().all(|&x| x == 0));
                b.fill(7);
                let c = b.clone();
                assert_eq!(c, b);
                assert_eq!(c.as_ptr() as usize % align, 0);
            }
        }
    }

    #[test]
    fn pool_reuses_clears_and_bounds() {
        let pool = BufferPool::new(4096, 4096, 2 * 4096).unwrap();
        let a = pool.copy_of(&[7u8; 4096]);
        // The rest of the slab `a` came from, taken so the free list is empty.
        let _rest: Vec<UniqueBuf> = (0..pool.idle()).map(|_| pool.zeroed()).collect();
        assert_eq!(pool.idle(), 0);
        let ptr = a.as_ptr();
        pool.put_all([a.share()]);
        assert_eq!(pool.idle(), 1);
        let b = pool.zeroed();
        assert_eq!(b.as_ptr(), ptr, "reused");
        assert!(b.iter().all(|&x| x == 0), "cleared on reuse");
        let others = [
            Arc::new(AlignedBuf::zeroed(4096, 4096).unwrap()),
            Arc::new(AlignedBuf::zeroed(4096, 4096).unwrap()),
        ];
        pool.put_all([
            b.share(),
            Arc::new(AlignedBuf::zeroed(8192, 4096).unwrap()),
            Arc::new(AlignedBuf::zeroed(4096, 512).unwrap()),
        ]);
        pool.put_all(others);
        assert_eq!(
            pool.idle(),
            2,
            "bounded, wrong sizes and alignments dropped"
        );
        assert!(BufferPool::new(4096, 3, 1).is_none());
    }

    #[test]
    fn pool_takes_back_only_pages_nothing_else_holds() {
        let pool = BufferPool::new(4096, 4096, 64 << 20).unwrap();
        let mut page = pool.copy_of(&[1u8; 4096]);
        page[0] = 9;
        let shared = page.share();
        let reader = Arc::clone(&shared);
        pool.put_all([shared]);
        let idle = pool.idle();
        // The reader's page is not handed out again: it still reads 9, 1...
        let fresh: Vec<UniqueBuf> = (0..idle + 1).map(|_| pool.zeroed()).collect();
        assert!(fresh.iter().all(|p| p.as_ptr() != reader.as_ptr()));
        assert_eq!((reader[0], reader[1]), (9, 1));
        // ...and once the reader lets go it comes back, Arc and all.
        let at = reader.as_ptr();
        let again = UniqueBuf::try_unique(reader).expect("last holder");
        let idle = pool.idle();
        pool.put_all([again.share()]);
        assert_eq!(pool.idle(), idle + 1);
        let reused = pool.zeroed();
        assert_eq!(reused.as_ptr(), at);
        assert!(reused.iter().all(|&b| b == 0));
    }

    #[test]
    fn bad_alignment_is_none() {
        assert!(AlignedBuf::zeroed(10, 3).is_none());
        assert!(AlignedBuf::zeroed(10, 0).is_none());
        assert!(AlignedBuf::zeroed(usize::MAX - 10, 4096).is_none());
    }
}
