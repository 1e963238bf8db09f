//! Grow-ahead's trailer ([`GrowAhead::Window`](crate::GrowAhead::Window)):
//! the record its two slots at the end of the file hold, and the scan
//! every open makes for one ([`recover`]).
//!
//! A slot is `slot` bytes (a sector, or the direct I/O alignment where
//! larger) holding a [`Record`]: magic `PWGROW01`, sequence number, the
//! file's length, where the previous trailer was, CRC32C (36 bytes,
//! zeros after). A file a crash (or a drop without `close`) left with a
//! window ends in a trailer; the open finds it, whatever the slot size it
//! was written with, and cuts the file to the recorded length.

use std::io;

use crate::backend::StorageBackend;
use crate::buffer::AlignedBuf;

pub(crate) const MAGIC: &[u8; 8] = b"PWGROW01";
/// Bytes of a record: magic, seq, len, prev (8 each), CRC32C (4).
const RECORD: usize = 36;
/// `prev` of a record with no earlier trailer to zero.
pub(crate) const NO_PREV: u64 = u64::MAX;

/// One trailer slot's contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) seq: u64,
    /// The file's length in bytes.
    pub(crate) len: u64,
    /// Offset of the previous trailer's slots, or [`NO_PREV`].
    pub(crate) prev: u64,
}

impl Record {
    /// Writes the record at the start of `slot` (at least [`RECORD`]
    /// bytes), zeros after it.
    pub(crate) fn encode(&self, slot: &mut [u8]) {
        slot.fill(0);
        slot[..8].copy_from_slice(MAGIC);
        slot[8..16].copy_from_slice(&self.seq.to_le_bytes());
        slot[16..24].copy_from_slice(&self.len.to_le_bytes());
        slot[24..32].copy_from_slice(&self.prev.to_le_bytes());
        let crc = crc32c::crc32c(&slot[..32]);
        slot[32..RECORD].copy_from_slice(&crc.to_le_bytes());
    }

    /// The record at the start of `slot`, if one is there whole.
    pub(crate) fn decode(slot: &[u8]) -> Option<Self> {
        if slot.len() < RECORD || &slot[..8] != MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes(slot[32..RECORD].try_into().ok()?);
        if crc32c::crc32c(&slot[..32]) != crc {
            return None;
        }
        let word = |i: usize| u64::from_le_bytes(slot[i..i + 8].try_into().expect("8 bytes"));
        Some(Self {
            seq: word(8),
            len: word(16),
            prev: word(24),
        })
    }
}

/// Bytes of one trailer slot on `backend`: 512, or its direct I/O
/// alignment where larger (a slot is written alone).
pub(crate) fn slot_bytes(backend: &dyn StorageBackend) -> u64 {
    backend
        .dio_align()
        .map_or(512, |a| u64::from(a.offset.max(a.memory)).max(512))
}

/// What [`recover`] found at the end of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Recovered {
    /// The length the newest valid record holds.
    pub(crate) len: u64,
    /// The file's size on the OS when found.
    pub(crate) size: u64,
}

/// Largest slot a trailer may have been written with: slots are a sector
/// or the direct I/O alignment of the device that wrote them, which need
/// not be this one's (a file copied to another device, or opened with
/// other options).
const MAX_SLOT: u64 = 64 << 10;

/// The newest valid record among the two slots ending at `end`, slots of
/// any size from 512 bytes to [`MAX_SLOT`] (a power of two), whose length
/// fits below the slots; with the slot size it was found at. One read of
/// the last `2 * MAX_SLOT` bytes (or the whole of a smaller file), aligned
/// for `backend`. Reads nothing past `end`.
fn newest_at(
    backend: &dyn StorageBackend,
    end: u64,
    align: usize,
) -> io::Result<Option<(Record, u64)>> {
    let own = slot_bytes(backend);
    // Aligned for this backend: its slot divides every candidate at or
    // above it, and the read starts on a multiple of it.
    let span = (2 * MAX_SLOT).min(end - end % own);
    if span == 0 {
        return Ok(None);
    }
    let start = end - span;
    let mut buf = AlignedBuf::zeroed(span as usize, align).ok_or(io::ErrorKind::InvalidInput)?;
    backend.read_exact_at(start, &mut buf)?;
    let mut best: Option<(Record, u64)> = None;
    let mut slot = 512u64;
    while 2 * slot <= span {
        let at = (span - 2 * slot) as usize;
        for r in buf[at..].chunks(slot as usize).filter_map(Record::decode) {
            if r.len <= end - 2 * slot && best.is_none_or(|(b, _)| r.seq > b.seq) {
                best = Some((r, slot));
            }
        }
        slot *= 2;
    }
    Ok(best)
}

/// Zeros `len` bytes at `at` on `backend`, reading and writing back the
/// aligned blocks around them where the backend needs alignment.
fn zero_range(backend: &dyn StorageBackend, at: u64, len: u64, align: usize) -> io::Result<()> {
    let own = slot_bytes(backend);
    let start = at - at % own;
    let end = (at + len).div_ceil(own) * own;
    let mut buf =
        AlignedBuf::zeroed((end - start) as usize, align).ok_or(io::ErrorKind::InvalidInput)?;
    backend.read_exact_at(start, &mut buf)?;
    buf[(at - start) as usize..(at - start + len) as usize].fill(0);
    backend.write_all_at(start, &buf)
}

/// Looks for a grow-ahead trailer at the end of the file behind `backend`
/// (left by a crash, or by a drop without `close`), its slots of any size
/// a device may have written them with. Where one is found: unless
/// `read_only`, zeros the stale trailer its record points to if it starts
/// below the length and still holds an older record, cuts the file to the
/// recorded length and makes that durable (`fdatasync`). Returns the
/// recorded length and the size found, or `None` for a plain file. One
/// read of the file's tail when there is nothing to do.
///
/// Errors: the reads, the cut and the sync (`io::Error`).
pub(crate) fn recover(
    backend: &dyn StorageBackend,
    read_only: bool,
    align: usize,
) -> io::Result<Option<Recovered>> {
    let size = backend.len()?;
    let Some((rec, slot)) = newest_at(backend, size, align)? else {
        return Ok(None);
    };
    if read_only {
        return Ok(Some(Recovered { len: rec.len, size }));
    }
    if rec.prev != NO_PREV
        && rec.prev < rec.len
        && rec.prev.checked_add(2 * slot).is_some_and(|e| e <= size)
        && newest_at(backend, rec.prev + 2 * slot, align)?
            .is_some_and(|(old, s)| s == slot && old.seq < rec.seq)
    {
        zero_range(backend, rec.prev, 2 * slot, align)?;
    }
    backend.set_len(rec.len)?;
    backend.sync_data()?;
    Ok(Some(Recovered { len: rec.len, size }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_refused() {
        let r = Record {
            seq: 7,
            len: 123 << 12,
            prev: NO_PREV,
        };
        let mut slot = vec![0xAAu8; 512];
        r.encode(&mut slot);
        assert_eq!(Record::decode(&slot), Some(r));
        for i in [0, 9, 20, 30, 33] {
            let mut bad = slot.clone();
            bad[i] ^= 1;
            assert_eq!(Record::decode(&bad), None, "byte {i} flipped");
        }
        assert_eq!(Record::decode(&[0u8; 512]), None);
        assert_eq!(Record::decode(&slot[..RECORD - 1]), None);
    }
}
