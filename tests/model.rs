//! Model-based test: random sequences of writes, reads, flushes and syncs,
//! for every engine, checked against a map of the newest bytes per page;
//! the durable image of a CrashBackend is checked against the model's
//! synced state after every sync.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{ENGINES, page};
use pagewriter::testing::CrashBackend;
use pagewriter::{Config, PagedCachedFile, StorageBackend};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Write { page: u64, pages: u64 },
    Guard { page: u64, byte: usize },
    Read { page: u64, pages: u64 },
    Flush,
    Sync,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u64..48, 1u64..4).prop_map(|(page, pages)| Op::Write { page, pages }),
        2 => (0u64..48, 0usize..512).prop_map(|(page, byte)| Op::Guard { page, byte }),
        4 => (0u64..48, 1u64..4).prop_map(|(page, pages)| Op::Read { page, pages }),
        1 => Just(Op::Flush),
        1 => Just(Op::Sync),
    ]
}

#[derive(Debug)]
struct Shared(Arc<CrashBackend>);

impl StorageBackend for Shared {
    fn len(&self) -> std::io::Result<u64> {
        self.0.len()
    }
    fn set_len(&self, len: u64) -> std::io::Result<()> {
        self.0.set_len(len)
    }
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.0.read_exact_at(offset, buf)
    }
    fn write_all_at(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.0.write_all_at(offset, buf)
    }
    fn sync_data(&self) -> std::io::Result<()> {
        self.0.sync_data()
    }
    fn sync_lanes(&self) -> usize {
        self.0.sync_lanes()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn matches_model(
        ops in prop::collection::vec(op(), 1..120),
        engine in prop::sample::select(ENGINES.to_vec()),
        page_size in prop::sample::select(vec![512usize, 4096]),
        buffer_pages in 1usize..24,
        cache_pages in prop::sample::select(vec![0usize, 4, 64]),
        stripes in prop::sample::select(vec![1usize, 4, 64]),
    ) {
        let be = Arc::new(CrashBackend::new());
        let cfg = Config::default()
            .engine(engine)
            .page_size(page_size)
            .max_write_buffer_bytes(buffer_pages * page_size)
            .read_cache_bytes(cache_pages * page_size)
            .stripes(stripes)
            .max_run_pages(5);
        let f = PagedCachedFile::new(Shared(be.clone()), cfg).unwrap();
        let ps = page_size as u64;
        let mut newest: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut version = 0u64;
        for op in ops {
            match op {
                Op::Write { page: p, pages } => {
                    version += 1;
                    let mut data = Vec::new();
                    for i in 0..pages {
                        let bytes = page(page_size, p + i, version);
                        newest.insert(p + i, bytes.clone());
                        data.extend(bytes);
                    }
                    f.write_page(p * ps, &data).unwrap();
                }
                Op::Guard { page: p, byte } => {
                    let mut g = f.write(p * ps, page_size).unwrap();
                    let want = newest.get(&p).cloned().unwrap_or_else(|| vec![0; page_size]);
                    prop_assert_eq!(&g[..], &want[..]);
                    g[byte] = g[byte].wrapping_add(1);
                    let mut next = want;
                    next[byte] = next[byte].wrapping_add(1);
                    drop(g);
                    newest.insert(p, next);
                }
                Op::Read { page: p, pages } => {
                    let end = (p + pages) * ps;
                    let len = newest.keys().next_back().map_or(0, |&k| (k + 1) * ps);
                    let r = f.read(p * ps, (pages * ps) as usize);
                    if end > len {
                        prop_assert!(r.is_err());
                    } else {
                        let got = r.unwrap();
                        for i in 0..pages {
                            let want = newest.get(&(p + i)).cloned().unwrap_or_else(|| vec![0; page_size]);
                            let at = (i * ps) as usize;
                            prop_assert_eq!(&got[at..at + page_size], &want[..], "page {}", p + i);
                        }
                    }
                }
                Op::Flush => f.flush().unwrap(),
                Op::Sync => {
                    f.sync().unwrap();
                    let img = be.durable_image();
                    for (&p, want) in &newest {
                        let at = (p * ps) as usize;
                        prop_assert_eq!(&img[at..at + page_size], &want[..], "durable page {}", p);
                    }
                }
            }
            let s = f.stats();
            prop_assert!(
                s.buffered_bytes as usize <= buffer_pages * page_size + 3 * page_size,
                "buffered {} over bound", s.buffered_bytes
            );
        }
    }
}
