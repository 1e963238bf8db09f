//! The ring's own buffers ("slots") and who holds each: the ring (home:
//! the caller may fill it through the ring), a [`SlotBuf`] lent out (to be
//! filled on another thread), or the kernel (an SQE in flight points into
//! it). Memory is freed only when no one may still touch it.
//!
//! Owns: the buffers (shared with a lent [`SlotBuf`] through an `Arc`),
//! their addresses and lengths, and each one's holder. Calls: nothing.
//! The submission loop (`SlotRing`) hands a slot to the kernel with
//! [`SlotBuffers::give_to_kernel`] before it queues the SQE and takes it
//! back with [`SlotBuffers::returned`] once the transfer's last CQE is
//! reaped; in between, nothing here gives out a reference to it.

use std::cell::UnsafeCell;
use std::io;
use std::sync::Arc;

use crate::buffer::AlignedBuf;

/// A slot's buffer, owned jointly by the ring and a [`SlotBuf`] lent out.
struct SlotMem(UnsafeCell<AlignedBuf>);

// SAFETY: the buffer is reached only through `SlotBuffers` while the slot
// is home (under `&self`/`&mut self` of the ring) or through the one
// `SlotBuf` lent out (while the slot is lent, `SlotBuffers` does not touch
// it); never both at once. `AlignedBuf` itself is `Send` and `Sync`.
unsafe impl Sync for SlotMem {}

/// A slot's buffer lent out of the ring by
/// [`SlotRing::take`](super::SlotRing::take), to fill on any thread; give
/// it back with [`SlotRing::put`](super::SlotRing::put). Dropping it does
/// not free the memory (the ring still owns it) but leaves the slot empty.
pub struct SlotBuf {
    mem: Arc<SlotMem>,
    slot: usize,
}

impl SlotBuf {
    /// The slot this buffer belongs to.
    pub fn slot(&self) -> usize {
        self.slot
    }
}

impl std::fmt::Debug for SlotBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotBuf")
            .field("slot", &self.slot)
            .field("len", &self.len())
            .finish()
    }
}

impl std::ops::Deref for SlotBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: while this `SlotBuf` exists its slot is lent and the ring
        // neither reads nor writes the buffer nor submits it (see
        // `SlotMem`); there is one `SlotBuf` per slot.
        unsafe { &*self.mem.0.get() }
    }
}

impl std::ops::DerefMut for SlotBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; `&mut self` makes this the only access.
        unsafe { &mut *self.mem.0.get() }
    }
}

/// Who holds a slot's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Holder {
    /// The ring: the caller may reach it through the ring.
    Home,
    /// A [`SlotBuf`] lent out.
    Lent,
    /// The kernel: an SQE in flight points into it.
    Kernel,
}

struct Slot {
    mem: Arc<SlotMem>,
    /// Address and length of the buffer (fixed for the slot's life).
    base: usize,
    len: usize,
    holder: Holder,
}

/// The slots of one ring (see the module docs).
pub(super) struct SlotBuffers {
    slots: Vec<Slot>,
}

impl SlotBuffers {
    /// Takes ownership of `bufs` as slots `0..bufs.len()`, all home.
    pub(super) fn new(bufs: Vec<AlignedBuf>) -> Self {
        let slots = bufs
            .into_iter()
            .map(|mut buf| Slot {
                base: buf.as_mut_ptr() as usize,
                len: buf.len(),
                mem: Arc::new(SlotMem(UnsafeCell::new(buf))),
                holder: Holder::Home,
            })
            .collect();
        Self { slots }
    }

    /// Number of slots.
    pub(super) fn count(&self) -> usize {
        self.slots.len()
    }

    /// The shortest slot's length in bytes (0 without slots).
    pub(super) fn shortest(&self) -> usize {
        self.slots.iter().map(|s| s.len).min().unwrap_or(0)
    }

    /// Every slot's memory, for `IORING_REGISTER_BUFFERS`: each stays
    /// valid until [`leak`](Self::leak) or the drop of the ring, which
    /// unregisters first.
    pub(super) fn iovecs(&self) -> Vec<libc::iovec> {
        self.slots
            .iter()
            .map(|s| libc::iovec {
                iov_base: s.base as *mut libc::c_void,
                iov_len: s.len,
            })
            .collect()
    }

    /// The slot's buffer; `None` unless it is home.
    pub(super) fn get(&self, slot: usize) -> Option<&[u8]> {
        let s = self.slots.get(slot)?;
        if s.holder != Holder::Home {
            return None;
        }
        // SAFETY: the slot is home (not lent, nothing in flight), so only
        // the ring reaches its buffer, and `&self` excludes writers.
        Some(unsafe { &*s.mem.0.get() })
    }

    /// The slot's buffer to fill; `None` unless it is home.
    pub(super) fn get_mut(&mut self, slot: usize) -> Option<&mut [u8]> {
        let s = self.slots.get_mut(slot)?;
        if s.holder != Holder::Home {
            return None;
        }
        // SAFETY: as in `get`; `&mut self` makes this the only access.
        Some(unsafe { &mut *s.mem.0.get() })
    }

    /// Lends the slot's buffer out; `None` unless it is home.
    pub(super) fn lend(&mut self, slot: usize) -> Option<SlotBuf> {
        let s = self.slots.get_mut(slot)?;
        if s.holder != Holder::Home {
            return None;
        }
        s.holder = Holder::Lent;
        Some(SlotBuf {
            mem: Arc::clone(&s.mem),
            slot,
        })
    }

    /// Takes a lent buffer back; gives it back if it is not one of these.
    pub(super) fn put(&mut self, buf: SlotBuf) -> Result<(), SlotBuf> {
        match self.slots.get_mut(buf.slot) {
            Some(s) if s.holder == Holder::Lent && Arc::ptr_eq(&s.mem, &buf.mem) => {
                s.holder = Holder::Home;
                Ok(())
            }
            _ => Err(buf),
        }
    }

    /// The first slot that is home.
    pub(super) fn first_home(&self) -> Option<usize> {
        self.slots.iter().position(|s| s.holder == Holder::Home)
    }

    /// Hands bytes `start..start + len` of the slot's buffer to the kernel
    /// for one transfer; returns the buffer's address. The slot stays the
    /// kernel's until [`returned`](Self::returned).
    ///
    /// Errors (`InvalidInput`, nothing changed): no such slot, the slot is
    /// in flight or lent out, the range is outside the buffer or over
    /// 2 GiB.
    pub(super) fn give_to_kernel(
        &mut self,
        slot: usize,
        start: usize,
        len: usize,
    ) -> io::Result<usize> {
        let invalid = |m: &str| io::Error::new(io::ErrorKind::InvalidInput, m.to_string());
        let s = self
            .slots
            .get_mut(slot)
            .ok_or_else(|| invalid("no such slot"))?;
        match s.holder {
            Holder::Kernel => return Err(invalid("slot in flight")),
            Holder::Lent => return Err(invalid("slot's buffer is lent out")),
            Holder::Home => {}
        }
        let end = start
            .checked_add(len)
            .ok_or_else(|| invalid("range overflows"))?;
        if end > s.len || len > i32::MAX as usize {
            return Err(invalid("range outside the slot's buffer"));
        }
        s.holder = Holder::Kernel;
        Ok(s.base)
    }

    /// The address of a slot the kernel holds (for the SQE that continues
    /// a short transfer).
    pub(super) fn base(&self, slot: usize) -> usize {
        debug_assert_eq!(self.slots[slot].holder, Holder::Kernel);
        self.slots[slot].base
    }

    /// The kernel is done with the slot (its transfer's last CQE was
    /// reaped, or its SQE was never queued): home again.
    pub(super) fn returned(&mut self, slot: usize) {
        debug_assert_eq!(self.slots[slot].holder, Holder::Kernel);
        self.slots[slot].holder = Holder::Home;
    }

    /// The kernel may still use these buffers (transfers left in flight,
    /// or buffers it would not unregister): never free them.
    pub(super) fn leak(&self) {
        for s in &self.slots {
            std::mem::forget(Arc::clone(&s.mem));
        }
    }

    /// References to slot `slot`'s memory (tests: a lent buffer shares it).
    #[cfg(test)]
    pub(super) fn owners(&self, slot: usize) -> usize {
        Arc::strong_count(&self.slots[slot].mem)
    }
}
