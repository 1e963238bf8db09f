//! The write log: what the kernel sent the logged device, in the order it
//! sent it.
//!
//! A log starts with a header (magic, the image's size in bytes) and holds
//! records, each `kind u8 | 0u8 | 0u16 | len u32 | offset u64 | crc32c
//! u32 | payload[len]`, little-endian; the CRC32C covers the 16 bytes
//! before it and the payload. Kinds: a write (`offset`, its bytes), a
//! flush (the device's cache flush: a FUSE `fsync` from the loop device),
//! a flush that the logger failed with EIO, a write it failed with EIO (no
//! bytes reached the image), and a mark (a line the workload wrote to the
//! marks file: an acknowledged commit).
//!
//! Reading stops at the first record that does not check (a log cut short
//! by a crash of the logger, or garbage) and says where.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

const MAGIC: &[u8; 16] = b"pagewriter-log-1";
const HEADER: u64 = 16 + 8;
const RECORD_HEAD: usize = 16;

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Bytes written at `offset`.
    Write,
    /// A cache flush: every write before it is on stable media.
    Flush,
    /// A cache flush the logger failed (EIO): the writes since the last
    /// good flush may or may not be on stable media.
    FailedFlush,
    /// A write the logger failed (EIO): none of its bytes reached the image.
    FailedWrite,
    /// A line from the workload (an acknowledged commit).
    Mark,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Write => 1,
            Kind::Flush => 2,
            Kind::FailedFlush => 3,
            Kind::FailedWrite => 4,
            Kind::Mark => 5,
        }
    }

    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            1 => Kind::Write,
            2 => Kind::Flush,
            3 => Kind::FailedFlush,
            4 => Kind::FailedWrite,
            5 => Kind::Mark,
            _ => return None,
        })
    }
}

/// One record, its payload left in the log file (`at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub kind: Kind,
    /// Byte offset on the device (writes), 0 otherwise.
    pub offset: u64,
    /// Payload bytes.
    pub len: u32,
    /// Where the payload starts in the log file.
    pub at: u64,
}

/// Appends records to a log file.
pub struct LogWriter {
    out: BufWriter<File>,
}

impl LogWriter {
    /// A new log at `path` (created; an existing file is refused) for a
    /// device of `size` bytes.
    ///
    /// Errors: the file exists, or cannot be created or written.
    pub fn create(path: &Path, size: u64) -> io::Result<LogWriter> {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)?;
        let mut out = BufWriter::with_capacity(1 << 20, f);
        out.write_all(MAGIC)?;
        out.write_all(&size.to_le_bytes())?;
        Ok(LogWriter { out })
    }

    /// Appends one record.
    pub fn append(&mut self, kind: Kind, offset: u64, payload: &[u8]) -> io::Result<()> {
        let mut head = [0u8; RECORD_HEAD];
        head[0] = kind.code();
        head[4..8].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        head[8..16].copy_from_slice(&offset.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&head), payload);
        self.out.write_all(&head)?;
        self.out.write_all(&crc.to_le_bytes())?;
        self.out.write_all(payload)
    }

    /// Writes what is buffered to the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A log read back: its records, and where it ended if it was cut short.
#[derive(Debug)]
pub struct Log {
    file: File,
    /// The device's size in bytes.
    pub size: u64,
    pub records: Vec<Record>,
    /// `Some((byte offset, why))` if the log ends in a record that does not
    /// check: the records before it are all there is.
    pub cut_at: Option<(u64, String)>,
}

impl Log {
    /// Reads the log at `path`: every record up to the first that does not
    /// check.
    ///
    /// Errors: the file cannot be read, or its header is not a log's.
    pub fn open(path: &Path) -> io::Result<Log> {
        let file = File::open(path)?;
        let total = file.metadata()?.len();
        let mut r = BufReader::with_capacity(1 << 20, file.try_clone()?);
        let mut header = [0u8; HEADER as usize];
        r.read_exact(&mut header).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: shorter than a log's header", path.display()),
            )
        })?;
        if &header[..16] != MAGIC {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: not a write log (bad magic)", path.display()),
            ));
        }
        let size = u64::from_le_bytes(header[16..24].try_into().expect("8 bytes"));
        let mut records = Vec::new();
        let mut pos = HEADER;
        let mut cut_at = None;
        let mut payload = Vec::new();
        while pos < total {
            let mut head = [0u8; RECORD_HEAD + 4];
            if total - pos < head.len() as u64 {
                cut_at = Some((pos, "a record header cut short".to_string()));
                break;
            }
            r.read_exact(&mut head)?;
            let kind = Kind::from_code(head[0]);
            let len = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
            let offset = u64::from_le_bytes(head[8..16].try_into().expect("8 bytes"));
            let crc = u32::from_le_bytes(head[16..20].try_into().expect("4 bytes"));
            let at = pos + head.len() as u64;
            if total - at < len as u64 {
                cut_at = Some((pos, format!("a record of {len} bytes cut short")));
                break;
            }
            payload.resize(len as usize, 0);
            r.read_exact(&mut payload)?;
            let Some(kind) = kind else {
                cut_at = Some((pos, format!("unknown record kind {}", head[0])));
                break;
            };
            if crc32c::crc32c_append(crc32c::crc32c(&head[..RECORD_HEAD]), &payload) != crc {
                cut_at = Some((pos, "a record whose checksum does not match".to_string()));
                break;
            }
            records.push(Record {
                kind,
                offset,
                len,
                at,
            });
            pos = at + len as u64;
        }
        Ok(Log {
            file,
            size,
            records,
            cut_at,
        })
    }

    /// The payload of record `r`.
    ///
    /// Errors: the log file cannot be read.
    pub fn payload(&self, r: &Record) -> io::Result<Vec<u8>> {
        let mut buf = vec![0u8; r.len as usize];
        let mut f = &self.file;
        f.seek(SeekFrom::Start(r.at))?;
        f.read_exact(&mut buf)?;
        Ok(buf)
    }

    /// The indices of the flush records (good ones), in order.
    pub fn flushes(&self) -> Vec<usize> {
        self.records
            .iter()
            .enumerate()
            .filter(|(_, r)| r.kind == Kind::Flush)
            .map(|(i, _)| i)
            .collect()
    }

    /// A one-line summary: records of each kind and bytes written.
    pub fn summary(&self) -> String {
        let count = |k| self.records.iter().filter(|r| r.kind == k).count();
        let bytes: u64 = self
            .records
            .iter()
            .filter(|r| r.kind == Kind::Write)
            .map(|r| r.len as u64)
            .sum();
        format!(
            "{} writes ({} MiB), {} flushes, {} failed flushes, {} failed writes, {} marks{}",
            count(Kind::Write),
            bytes >> 20,
            count(Kind::Flush),
            count(Kind::FailedFlush),
            count(Kind::FailedWrite),
            count(Kind::Mark),
            match &self.cut_at {
                Some((at, why)) => format!("; cut short at byte {at}: {why}"),
                None => String::new(),
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_read_back_and_a_cut_log_says_where_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut w = LogWriter::create(&path, 1 << 20).unwrap();
        w.append(Kind::Write, 4096, &[7u8; 512]).unwrap();
        w.append(Kind::Flush, 0, &[]).unwrap();
        w.append(Kind::Mark, 0, b"ack 1").unwrap();
        w.flush().unwrap();
        drop(w);
        assert!(
            LogWriter::create(&path, 1).is_err(),
            "an existing log overwritten"
        );
        let log = Log::open(&path).unwrap();
        assert_eq!(log.size, 1 << 20);
        let kinds: Vec<Kind> = log.records.iter().map(|r| r.kind).collect();
        assert_eq!(kinds, [Kind::Write, Kind::Flush, Kind::Mark]);
        assert_eq!(log.payload(&log.records[0]).unwrap(), vec![7u8; 512]);
        assert_eq!(log.payload(&log.records[2]).unwrap(), b"ack 1");
        assert!(log.cut_at.is_none());

        // Cut inside the last record: the two before it remain, and the
        // log says where it ends.
        let len = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 2).unwrap();
        let log = Log::open(&path).unwrap();
        assert_eq!(log.records.len(), 2);
        let (at, why) = log.cut_at.clone().unwrap();
        assert!(why.contains("cut short"), "{why}");
        assert!(at > HEADER && at < len);

        // A flipped byte in the first record's payload: nothing after it.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER as usize + 20 + 100] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let log = Log::open(&path).unwrap();
        assert!(log.records.is_empty());
        assert!(log.cut_at.unwrap().1.contains("checksum"));

        std::fs::write(&path, b"not a log at all, just text......").unwrap();
        assert!(Log::open(&path).is_err());
    }
}
