//! Block patterns that can be checked, and the check.

use super::*;

/// Bytes of the [`Pattern::Header`] header.
pub const HEADER_LEN: usize = 32;
pub(super) const MAGIC: u64 = u64::from_le_bytes(*b"PWBLOCK1");

/// Reads `[offset, offset + len)` of `file` back in `bs` blocks and checks
/// each against `cfg.pattern`: the generator's bytes (`Gen`), or a valid
/// header naming the block's own offset and seed with a matching checksum
/// (`Header`). `Fixed` data cannot be checked and counts 0 blocks.
/// Returns the blocks checked.
///
/// Errors: the first bad block, or an I/O error (offset and message).
pub fn verify_region(
    cfg: &IoConfig,
    generator: &Generator,
    file: &File,
    offset: u64,
    len: u64,
) -> std::result::Result<u64, VerifyError> {
    if cfg.pattern == Pattern::Fixed {
        return Ok(0);
    }
    let bs = cfg.bs;
    let mut got = vec![0u8; bs];
    let mut want = vec![0u8; bs];
    let mut blocks = 0;
    let mut at = offset;
    while at < offset + len {
        let n = (bs as u64).min(offset + len - at) as usize;
        file.read_exact_at(&mut got[..n], at)
            .map_err(|e| VerifyError {
                offset: at,
                why: format!("read failed: {e}"),
            })?;
        let bad = |why: String| VerifyError { offset: at, why };
        match cfg.pattern {
            Pattern::Gen => {
                generator
                    .fill_at(at, &mut want[..n])
                    .map_err(|e| bad(e.to_string()))?;
                if let Some(i) = got[..n].iter().zip(&want[..n]).position(|(a, b)| a != b) {
                    return Err(bad(format!("byte {i} differs from the generator's")));
                }
            }
            Pattern::Header if n >= HEADER_LEN => {
                let word = |k: usize| u64::from_le_bytes(got[k..k + 8].try_into().unwrap());
                if word(0) != MAGIC {
                    return Err(bad("no block header".into()));
                }
                if word(8) != at {
                    return Err(bad(format!("header names offset {}", word(8))));
                }
                if word(16) != cfg.seed {
                    return Err(bad(format!("header names seed {}", word(16))));
                }
                if word(24) != xxhash_rust::xxh3::xxh3_64(&got[HEADER_LEN..n]) {
                    return Err(bad("checksum mismatch".into()));
                }
            }
            _ => {}
        }
        blocks += 1;
        at += n as u64;
    }
    Ok(blocks)
}
