//! An in-memory backend for tests and examples.

use std::io::{self, IoSlice};

use parking_lot::RwLock;

use super::storage::StorageBackend;

/// A file held in a `Vec<u8>`. `sync_data` is a no-op that always succeeds.
/// Growing past the memory the process can get is
/// `io::ErrorKind::OutOfMemory`, not an abort.
///
/// Vectored writes use the trait's default (one `write_all_at` per slice),
/// which is what a backend without `pwritev` would do.
#[derive(Debug, Default)]
pub struct MemoryBackend {
    data: RwLock<Vec<u8>>,
}

impl MemoryBackend {
    /// An empty file.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the whole file's bytes.
    pub fn contents(&self) -> Vec<u8> {
        self.data.read().clone()
    }
}

impl StorageBackend for MemoryBackend {
    fn len(&self) -> io::Result<u64> {
        Ok(self.data.read().len() as u64)
    }
    /// Memory holds no holes: all of it.
    fn data_len(&self) -> Option<u64> {
        self.len().ok()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        let mut data = self.data.write();
        grow(&mut data, len)?;
        data.truncate(len);
        Ok(())
    }

    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let data = self.data.read();
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let end = start
            .checked_add(buf.len())
            .filter(|&end| end <= data.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(&data[start..end]);
        Ok(())
    }

    fn write_all_at(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::OutOfMemory)?;
        let end = start
            .checked_add(buf.len())
            .ok_or(io::ErrorKind::OutOfMemory)?;
        let mut data = self.data.write();
        grow(&mut data, end)?;
        data[start..end].copy_from_slice(buf);
        Ok(())
    }

    fn write_vectored_all_at(&self, offset: u64, bufs: &mut [IoSlice<'_>]) -> io::Result<()> {
        let mut at = offset;
        for buf in bufs.iter() {
            self.write_all_at(at, buf)?;
            at += buf.len() as u64;
        }
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        Ok(())
    }
}

/// Extends `data` with zeros to `len` bytes (if shorter), with memory the
/// allocator refuses reported as `OutOfMemory`.
fn grow(data: &mut Vec<u8>, len: usize) -> io::Result<()> {
    if data.len() < len {
        data.try_reserve(len - data.len())
            .map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
        data.resize(len, 0);
    }
    Ok(())
}
