//! # pagewriter-bench
//!
//! The tools beside the page writer: synthetic data with exact dedup and
//! compression ratios ([`datagen`]), a streaming file writer at the storage
//! limit ([`stream`]), and the workloads the `pagewriter` CLI and the
//! criterion benches share ([`workload`]: `scale`, bulk flush, the fio-style
//! `io` worker). Built on the core crate `pagewriter`; an engine that embeds
//! the page writer does not depend on this crate.

pub mod cpu;
pub mod datagen;
pub mod error;
pub mod interrupt;
pub mod plot;
pub mod rng;
pub mod room;
pub mod scratch;
pub mod stream;
pub mod workload;
