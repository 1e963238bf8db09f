//! What a workload wrote and what its acknowledged commits promise, and
//! the check of a replayed file against it.
//!
//! Every page version the workload writes is numbered (1, 2, ...; 0 is a
//! page of zeros: never written, cut by `set_len`, or grown into) and its
//! bytes follow from the page number and the version, so a page read back
//! says which version it is. Per page the [`Tracker`] keeps the versions
//! in the order they were written; an acknowledged commit records, for
//! each page it promised, the position of the version it promised in that
//! order (its floor). At a replayed state, every commit acknowledged
//! before it holds: a page must read as its floor's version or one
//! written after it, or, where torn pages are allowed, each 512-byte
//! sector as such a version's. A page no commit promised must still hold
//! a version that was written (or zeros): bytes never written never
//! appear.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// The bytes of `page`'s version `v` (`page_size` bytes): zeros for 0,
/// else the page number, the version, then bytes that differ in every
/// sector and every version.
pub fn page_bytes(page: u64, v: u64, page_size: usize) -> Vec<u8> {
    let mut b = vec![0u8; page_size];
    if v == 0 {
        return b;
    }
    let mut x = page.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ v.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    for chunk in b.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let n = chunk.len();
        chunk.copy_from_slice(&x.to_le_bytes()[..n]);
    }
    b[..8].copy_from_slice(&page.to_le_bytes());
    b[8..16].copy_from_slice(&v.to_le_bytes());
    b
}

#[derive(Default)]
struct State {
    /// Per page, its versions in write order (0: zeros).
    history: BTreeMap<u64, Vec<u64>>,
    /// Per page, the position in `history` that reached the OS last
    /// (flushed or synced): where a `discard` takes the page back to.
    flushed: BTreeMap<u64, usize>,
    next_version: u64,
    /// Per acknowledged commit, its floors: (page, position).
    acks: Vec<Vec<(u64, usize)>>,
    /// What acknowledged commits of a workload with its own check
    /// promised, by id (see [`Tracker::ack_note`]).
    notes: BTreeMap<usize, String>,
}

/// The record of a workload (see the module docs). Shared by its
/// threads; each write is numbered and recorded under one lock with the
/// write call itself, so the order of versions is the order of the calls.
pub struct Tracker {
    st: Mutex<State>,
    pub page_size: usize,
}

impl Tracker {
    pub fn new(page_size: usize) -> Tracker {
        Tracker {
            st: Mutex::new(State {
                next_version: 1,
                ..State::default()
            }),
            page_size,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes a new version of `page` with `write` (given its bytes),
    /// recorded under the lock; returns its position in the page's
    /// history.
    ///
    /// Errors: `write`'s, and then nothing is recorded.
    pub fn write<E>(
        &self,
        page: u64,
        write: impl FnOnce(&[u8]) -> Result<(), E>,
    ) -> Result<usize, E> {
        let mut st = self.lock();
        let v = st.next_version;
        write(&page_bytes(page, v, self.page_size))?;
        st.next_version += 1;
        let h = st.history.entry(page).or_default();
        h.push(v);
        Ok(h.len() - 1)
    }

    /// `set_len` to `pages` pages (a cut or a growth, under the lock with
    /// the call): every page at or past it now reads zeros.
    pub fn resize<E>(&self, pages: u64, set_len: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let mut st = self.lock();
        set_len()?;
        for (_, h) in st.history.range_mut(pages..) {
            if h.last() != Some(&0) {
                h.push(0);
            }
        }
        Ok(())
    }

    /// Every page's newest version reached the OS (a flush or a commit of
    /// the whole file).
    pub fn flushed_all(&self) {
        let mut st = self.lock();
        let now: Vec<(u64, usize)> = st.history.iter().map(|(&p, h)| (p, h.len() - 1)).collect();
        st.flushed.extend(now);
    }

    /// `discard` of `page` (under the lock with the call): its buffered
    /// version is dropped and it reads what reached the OS last again.
    /// Only where nothing flushed it since it was written.
    pub fn discard<E>(&self, page: u64, discard: impl FnOnce() -> Result<(), E>) -> Result<(), E> {
        let mut st = self.lock();
        discard()?;
        let back = st.flushed.get(&page).copied();
        let h = st.history.entry(page).or_default();
        let v = back.map_or(0, |i| h[i]);
        h.push(v);
        Ok(())
    }

    /// The floors of a commit of every page written so far (`sync`), taken
    /// under the lock with `commit_start` (the call that starts the
    /// commit, or nothing for a commit already started).
    pub fn all_floors(&self) -> Vec<(u64, usize)> {
        let st = self.lock();
        st.history.iter().map(|(&p, h)| (p, h.len() - 1)).collect()
    }

    /// Records an acknowledged commit with `floors`; its id for the mark.
    pub fn ack(&self, floors: Vec<(u64, usize)>) -> usize {
        let mut st = self.lock();
        st.acks.push(floors);
        st.acks.len() - 1
    }

    /// Records an acknowledged commit whose promise is `note`, read by the
    /// workload's own check rather than by page floors; its id for the
    /// mark.
    pub fn ack_note(&self, note: String) -> usize {
        let mut st = self.lock();
        st.acks.push(Vec::new());
        let id = st.acks.len() - 1;
        st.notes.insert(id, note);
        id
    }

    /// What the workload wrote and promised, for the checks.
    pub fn finish(&self) -> Expect {
        let st = self.lock();
        Expect {
            history: st.history.clone(),
            acks: st.acks.clone(),
            notes: st.notes.clone(),
            page_size: self.page_size,
        }
    }
}

/// What a workload wrote and its acknowledged commits promised.
#[derive(Debug, Clone)]
pub struct Expect {
    pub history: BTreeMap<u64, Vec<u64>>,
    pub acks: Vec<Vec<(u64, usize)>>,
    /// The promises of commits acknowledged with [`Tracker::ack_note`].
    pub notes: BTreeMap<usize, String>,
    pub page_size: usize,
}

/// A replayed state without the page file: fine only if no commit
/// (`acked`) was acknowledged before it.
pub fn missing_file(acked: &[usize]) -> Result<(), String> {
    if acked.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "the file is missing after {} acknowledged commits",
            acked.len()
        ))
    }
}

impl Expect {
    /// Checks `file` (the page file's bytes as reopened, `None` if it does
    /// not exist) against the commits `acked` (ids). `torn_ok`: sectors of
    /// different versions in one page are allowed. `Err` names the first
    /// page that breaks a promise.
    pub fn check(&self, file: Option<&[u8]>, acked: &[usize], torn_ok: bool) -> Result<(), String> {
        let ps = self.page_size;
        let Some(file) = file else {
            return missing_file(acked);
        };
        let mut floors: BTreeMap<u64, usize> = BTreeMap::new();
        for &a in acked {
            for &(p, i) in &self.acks[a] {
                let f = floors.entry(p).or_insert(i);
                *f = (*f).max(i);
            }
        }
        let pages = (file.len() as u64).div_ceil(ps as u64);
        let last = self.history.keys().next_back().copied().unwrap_or(0);
        for p in 0..pages.max(last + 1) {
            let s = p as usize * ps;
            let got: Vec<u8> = if s >= file.len() {
                Vec::new()
            } else {
                let mut g = file[s..(s + ps).min(file.len())].to_vec();
                g.resize(ps, 0);
                g
            };
            let history = self.history.get(&p).map_or(&[][..], |h| h.as_slice());
            let floor = floors.get(&p).copied();
            // Versions allowed: from the floor on; with no promise, any
            // version written, or zeros.
            let mut allowed: Vec<u64> = match floor {
                Some(f) => history[f..].to_vec(),
                None => {
                    let mut a = history.to_vec();
                    a.push(0);
                    a
                }
            };
            allowed.dedup();
            if got.is_empty() {
                // Past the end: a page whose promised version is data must
                // be there.
                if !allowed.contains(&0) {
                    return Err(format!(
                        "page {p} is past the end of the file ({} bytes) but an acknowledged \
                         commit wrote version {} of it",
                        file.len(),
                        history[floor.expect("data allowed only under a promise")]
                    ));
                }
                continue;
            }
            let versions: Vec<Vec<u8>> = allowed.iter().map(|&v| page_bytes(p, v, ps)).collect();
            if versions.contains(&got) {
                continue;
            }
            // Torn, a page may be at any byte: a buffered write copying a
            // newer version into the page cache while write-back sends the
            // page (no stable pages on a loop device) puts a mix on disk
            // that the next write-back replaces. Every byte must still be
            // some allowed version's.
            let stray = (0..ps).find(|&i| !versions.iter().any(|v| v[i] == got[i]));
            if let Some(at) = stray {
                let found = (
                    u64::from_le_bytes(got[..8].try_into().expect("8")),
                    u64::from_le_bytes(got[8..16].try_into().expect("8")),
                );
                return Err(format!(
                    "page {p} holds bytes of no version allowed, the first at byte {at} ({} \
                     promised, allowed {allowed:?}; its header says page {} version {})",
                    match floor {
                        Some(f) => format!("version {}", history[f]),
                        None => "none".into(),
                    },
                    found.0,
                    found.1
                ));
            }
            if std::env::var_os("CRASHLOG_VERBOSE").is_some() {
                eprintln!("page {p} torn: {}", describe_mix(&got, &allowed, &versions));
            }
            if !torn_ok {
                return Err(format!(
                    "page {p} is torn: {}",
                    describe_mix(&got, &allowed, &versions)
                ));
            }
        }
        Ok(())
    }
}

/// A torn page as byte ranges and the versions they match, e.g.
/// `0..512 v2, 512..4096 v1`.
fn describe_mix(got: &[u8], allowed: &[u64], versions: &[Vec<u8>]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut start = 0;
    let mut current: Option<usize> = None;
    for i in 0..got.len() {
        // Keep the current version while it matches; else the first that does.
        let v = match current {
            Some(c) if versions[c][i] == got[i] => c,
            _ => versions
                .iter()
                .position(|v| v[i] == got[i])
                .unwrap_or(usize::MAX),
        };
        if Some(v) != current {
            if let Some(c) = current {
                out.push(format!("{start}..{i} {}", name(allowed, c)));
            }
            start = i;
            current = Some(v);
        }
    }
    if let Some(c) = current {
        out.push(format!("{start}..{} {}", got.len(), name(allowed, c)));
    }
    out.join(", ")
}

fn name(allowed: &[u64], i: usize) -> String {
    allowed.get(i).map_or("none".into(), |v| format!("v{v}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracked() -> (Tracker, Vec<u8>) {
        let t = Tracker::new(4096);
        let mut file = vec![0u8; 3 * 4096];
        for p in 0..3u64 {
            t.write(p, |b| {
                file[p as usize * 4096..][..4096].copy_from_slice(b);
                Ok::<_, ()>(())
            })
            .unwrap();
        }
        (t, file)
    }

    #[test]
    fn a_promised_page_must_hold_its_version_or_a_later_one() {
        let (t, file) = tracked();
        let a = t.ack(t.all_floors());
        let e = t.finish();
        assert!(e.check(Some(&file), &[a], false).is_ok());
        // Page 1 back to zeros: an acknowledged version lost.
        let mut lost = file.clone();
        lost[4096..8192].fill(0);
        assert!(
            e.check(Some(&lost), &[a], false)
                .unwrap_err()
                .contains("page 1")
        );
        // Without the promise zeros are fine.
        assert!(e.check(Some(&lost), &[], false).is_ok());
        // Cut short: page 2 missing.
        assert!(
            e.check(Some(&file[..8192]), &[a], false)
                .unwrap_err()
                .contains("past the end")
        );
        assert!(e.check(None, &[a], false).unwrap_err().contains("missing"));
        assert!(e.check(None, &[], false).is_ok());
    }

    #[test]
    fn torn_pages_only_where_allowed_and_never_unwritten_bytes() {
        let (t, mut file) = tracked();
        let a = t.ack(t.all_floors());
        let mut v2 = Vec::new();
        t.write(0, |b| {
            v2 = b.to_vec();
            Ok::<_, ()>(())
        })
        .unwrap();
        let e = t.finish();
        // Page 0: first sector of version 2, the rest of version 1.
        file[..512].copy_from_slice(&v2[..512]);
        assert!(e.check(Some(&file), &[a], true).is_ok());
        assert!(
            e.check(Some(&file), &[a], false)
                .unwrap_err()
                .contains("torn")
        );
        // Torn inside a sector (write-back racing a buffered copy): a mix
        // still, allowed where torn pages are.
        file[..700].copy_from_slice(&v2[..700]);
        assert!(e.check(Some(&file), &[a], true).is_ok());
        let torn = e.check(Some(&file), &[a], false).unwrap_err();
        assert!(torn.contains("..700 v4, 700..4096 v1"), "{torn}");
        // A byte of garbage: never allowed.
        file[1024] ^= 0xFF;
        assert!(
            e.check(Some(&file), &[a], true)
                .unwrap_err()
                .contains("no version")
        );
    }

    #[test]
    fn a_cut_allows_zeros_and_a_discard_goes_back() {
        let (t, file) = tracked();
        let a = t.ack(t.all_floors());
        t.resize(1, || Ok::<_, ()>(())).unwrap();
        let b = t.ack(t.all_floors());
        let e = t.finish();
        // After the cut's commit, pages 1 and 2 may be gone; before it
        // too (the cut may reach the disk before its commit returns).
        assert!(e.check(Some(&file[..4096]), &[a, b], false).is_ok());
        assert!(e.check(Some(&file[..4096]), &[a], false).is_ok());
        // With no cut, they may not.
        let (t, file) = tracked();
        let a = t.ack(t.all_floors());
        let e = t.finish();
        assert!(
            e.check(Some(&file[..4096]), &[a], false)
                .unwrap_err()
                .contains("past the end")
        );

        let t = Tracker::new(4096);
        t.write(0, |_| Ok::<_, ()>(())).unwrap();
        t.flushed_all();
        t.write(0, |_| Ok::<_, ()>(())).unwrap();
        t.discard(0, || Ok::<_, ()>(())).unwrap();
        let c = t.ack(t.all_floors());
        let e = t.finish();
        assert_eq!(e.history[&0], vec![1, 2, 1]);
        assert!(e.check(Some(&page_bytes(0, 1, 4096)), &[c], false).is_ok());
    }
}
