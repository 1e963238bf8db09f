//! Aligned page memory.
//!
//! Every page the write buffer holds lives in an [`AlignedBuf`], so that the
//! same memory can later be handed to `O_DIRECT` I/O (which needs both the
//! buffer address and the length aligned to the device's logical block size)
//! without a bounce copy.

use std::alloc::{self, Layout};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Default alignment of page memory in bytes: 4096, which satisfies the
/// `O_DIRECT` alignment of every Linux block device in common use.
pub const DEFAULT_ALIGN: usize = 4096;

/// A heap buffer of fixed length whose start address is a multiple of its
/// alignment. Zero-filled on creation.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    align: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like Box<[u8]>); it has
// no interior mutability, so sharing `&AlignedBuf` across threads is sound.
unsafe impl Send for AlignedBuf {}
// SAFETY: see above.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes aligned to `align` bytes.
    ///
    /// Returns `None` if `align` is not a power of two or `len` rounded up to
    /// `align` overflows `isize`. Aborts (like `Vec`) if the allocator fails.
    pub fn zeroed(len: usize, align: usize) -> Option<Self> {
        let layout = Layout::from_size_align(len, align).ok()?;
        if len == 0 {
            // No allocation; a dangling pointer that is still aligned.
            let ptr = NonNull::new(std::ptr::without_provenance_mut::<u8>(align))?;
            return Some(Self { ptr, len, align });
        }
        // SAFETY: `layout` has a non-zero size (checked above).
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        Some(Self { ptr, len, align })
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
        if self.len == 0 {
            return;
        }
        // SAFETY: allocated in `zeroed` with exactly this size and alignment
        // (which passed `Layout::from_size_align` then).
        unsafe {
            alloc::dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len, self.align),
            )
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn bad_alignment_is_none() {
        assert!(AlignedBuf::zeroed(10, 3).is_none());
        assert!(AlignedBuf::zeroed(10, 0).is_none());
        assert!(AlignedBuf::zeroed(usize::MAX - 10, 4096).is_none());
    }
}
