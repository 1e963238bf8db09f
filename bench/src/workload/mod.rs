//! Workloads shared by the CLI (`pagewriter scale`) and the criterion
//! benches, so both measure the same loop.

pub mod bulk;
#[cfg(feature = "cf")]
pub mod cf;
pub mod flush;
pub mod io;
pub mod scale;
