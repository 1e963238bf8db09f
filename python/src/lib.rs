//! Python bindings of the `pagewriter` tools (module `pagewriter._native`,
//! re-exported by the `pagewriter` package): `write_file`, `Generator`,
//! `measure`, `io` and `scale`. No logic of their own: every call goes to
//! `pagewriter-bench`, with the GIL released while it works.
//!
//! Errors: a bad argument raises `ValueError`; an I/O failure `OSError`
//! with the errno and the path; Ctrl-C during `write_file` the
//! `KeyboardInterrupt` Python raised.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

use numpy::PyArrayMethods;
use pagewriter::DirectIo;
use pagewriter_bench::datagen::{self, GenConfig};
use pagewriter_bench::error::{CoreError, Error};
use pagewriter_bench::stream::{self, StreamEngine, WriteOptions};
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// 1 MiB in bytes.
const MIB: usize = 1 << 20;

/// The errno of an I/O error: the OS's, or for an error std made itself
/// (no OS code) the errno of its kind, so Python's `OSError` always
/// carries a real one.
fn errno_of(e: &std::io::Error) -> i32 {
    use std::io::ErrorKind as K;
    e.raw_os_error().unwrap_or(match e.kind() {
        K::NotFound => libc::ENOENT,
        K::PermissionDenied => libc::EACCES,
        K::AlreadyExists => libc::EEXIST,
        K::WouldBlock => libc::EAGAIN,
        K::Interrupted => libc::EINTR,
        K::Unsupported => libc::EOPNOTSUPP,
        K::OutOfMemory => libc::ENOMEM,
        K::StorageFull => libc::ENOSPC,
        K::FileTooLarge => libc::EFBIG,
        K::ReadOnlyFilesystem => libc::EROFS,
        K::IsADirectory => libc::EISDIR,
        K::NotADirectory => libc::ENOTDIR,
        K::TimedOut => libc::ETIMEDOUT,
        K::InvalidInput | K::InvalidData => libc::EINVAL,
        // A short read or write, and anything else: an I/O error.
        _ => libc::EIO,
    })
}

/// An `OSError` for an I/O error: errno, message, and the path if known;
/// an error std raised for a bad argument (`InvalidInput` without an OS
/// code, e.g. a path holding a NUL byte) is a `ValueError`.
fn os_error(e: &std::io::Error, msg: String, shown: Option<String>) -> PyErr {
    if e.raw_os_error().is_none() && e.kind() == std::io::ErrorKind::InvalidInput {
        return PyValueError::new_err(match shown {
            Some(p) => format!("{p}: {msg}"),
            None => msg,
        });
    }
    let errno = errno_of(e);
    match shown {
        Some(p) => PyOSError::new_err((errno, msg, p)),
        None => PyOSError::new_err((errno, msg)),
    }
}

/// A path argument: one holding a NUL byte (which no system call takes)
/// is a `ValueError` naming the argument.
fn path_arg(name: &str, path: PathBuf) -> PyResult<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    if path.as_os_str().as_bytes().contains(&0) {
        return Err(PyValueError::new_err(format!(
            "{name} = {path:?} holds a NUL byte"
        )));
    }
    Ok(path)
}

/// The Python exception for a crate error about `path`.
fn to_py(e: Error, path: Option<&std::path::Path>) -> PyErr {
    let shown = path.map(|p| p.display().to_string());
    let e = match e {
        Error::Core(core) => core,
        other => return PyRuntimeError::new_err(other.to_string()),
    };
    match e {
        CoreError::Io { op, offset, source } => {
            let at = offset.map_or(String::new(), |o| format!(" at offset {o}"));
            let msg = format!("{op}{at}: {source}");
            os_error(&source, msg, shown)
        }
        CoreError::Open {
            op,
            ref path,
            ref source,
        } => {
            let msg = format!("{op}: {source}");
            os_error(source, msg, Some(path.display().to_string()))
        }
        CoreError::PagesFailed { ref source, .. } => {
            let msg = e.to_string();
            os_error(source, msg, shown)
        }
        CoreError::InvalidConfig(_)
        | CoreError::FileTooLarge { .. }
        | CoreError::InvalidPageSize(_)
        | CoreError::Unaligned { .. } => PyValueError::new_err(match shown {
            Some(p) => format!("{p}: {e}"),
            None => e.to_string(),
        }),
        other => PyRuntimeError::new_err(other.to_string()),
    }
}

/// Sizes come in as Python ints of any size: negative or past `u64` is a
/// `ValueError` naming the argument (not pyo3's `OverflowError`).
fn size_arg(name: &str, v: i128) -> PyResult<u64> {
    u64::try_from(v)
        .map_err(|_| PyValueError::new_err(format!("{name} = {v} is not in 0..=2**64-1 bytes")))
}

/// A ratio must be a number >= 1 (checked again by the generator).
/// Figures of one `write_file`.
#[pyclass(get_all, frozen, module = "pagewriter")]
struct WriteStats {
    /// Bytes written (the file's size).
    bytes_written: u64,
    /// Wall time of the write in seconds (open to rename).
    duration_secs: f64,
    /// bytes_written / duration_secs / 1e9.
    throughput_gbps: f64,
    /// CPU seconds (user + system, the whole process: fill threads and
    /// I/O) per 10^9 bytes.
    cpu_s_per_gb: f64,
    /// Engine, queue depth, buffers and O_DIRECT, as the CLI prints them.
    io_mode: String,
    /// "io_uring" or "pwrite".
    engine: String,
    /// Why an engine or O_DIRECT asked for was not used.
    fallbacks: Vec<String>,
    /// Whether O_DIRECT was used.
    direct: bool,
    /// Bytes per buffer and per write.
    buffer_size: usize,
    /// Buffers in the pool.
    buffer_count: usize,
    /// Most writes in flight.
    queue_depth: u32,
    /// Threads generating data.
    gen_threads: usize,
    /// Seconds the fill threads spent generating (summed over threads).
    gen_secs: f64,
    /// Seconds the I/O side waited for writes to complete.
    io_wait_secs: f64,
    /// Seconds the I/O side waited for a filled buffer.
    starved_secs: f64,
    /// Seconds spent in fallocate.
    preallocate_secs: f64,
    /// Seconds spent in the final fdatasync.
    fdatasync_secs: f64,
}

#[pymethods]
impl WriteStats {
    fn __repr__(&self) -> String {
        format!(
            "WriteStats(bytes_written={}, duration_secs={:.3}, throughput_gbps={:.3}, io_mode={:?})",
            self.bytes_written, self.duration_secs, self.throughput_gbps, self.io_mode
        )
    }
}

impl From<&stream::WriteStats> for WriteStats {
    fn from(s: &stream::WriteStats) -> Self {
        Self {
            bytes_written: s.bytes,
            duration_secs: s.duration_s,
            throughput_gbps: s.gb_per_s,
            cpu_s_per_gb: s.cpu_s_per_gb,
            io_mode: s.io_mode.clone(),
            engine: s.engine.clone(),
            fallbacks: s.fallbacks.clone(),
            direct: s.direct.is_some(),
            buffer_size: s.buffer_size,
            buffer_count: s.buffer_count,
            queue_depth: s.queue_depth,
            gen_threads: s.gen_threads,
            gen_secs: s.gen_s,
            io_wait_secs: s.io_wait_s,
            starved_secs: s.starved_s,
            preallocate_secs: s.preallocate_s,
            fdatasync_secs: s.fdatasync_s,
        }
    }
}

/// Writes `size` bytes of generated data to `path` at the storage's speed
/// (see the package docs). Signature of the `dgen_py.write_file` proposal.
#[pyfunction]
#[pyo3(signature = (
    path, size, buffer_size = 8 * MIB as i128, buffer_count = None, use_direct_io = true,
    dedup_ratio = 1.0, compress_ratio = 1.0, use_io_uring = true, seed = 0, progress = false
))]
#[allow(clippy::too_many_arguments)]
fn write_file(
    py: Python<'_>,
    path: PathBuf,
    size: i128,
    buffer_size: i128,
    buffer_count: Option<i128>,
    use_direct_io: bool,
    dedup_ratio: f64,
    compress_ratio: f64,
    use_io_uring: bool,
    seed: u64,
    progress: bool,
) -> PyResult<WriteStats> {
    let path = path_arg("path", path)?;
    let size = size_arg("size", size)?;
    let buffer_size = usize::try_from(size_arg("buffer_size", buffer_size)?)
        .map_err(|_| PyValueError::new_err("buffer_size is too large"))?;
    let base = WriteOptions {
        buffer_size,
        direct: if use_direct_io {
            DirectIo::Auto
        } else {
            DirectIo::Off
        },
        engine: if use_io_uring {
            StreamEngine::Auto
        } else {
            StreamEngine::Pwrite
        },
        dedup_ratio,
        compress_ratio,
        seed,
        ..WriteOptions::default()
    };
    // Buffer count, queue depth and fill threads for this device and CPU,
    // as the CLI's --auto; the caller's buffer size and count win.
    let (mut opts, _) = stream::auto_options(&path, &base);
    opts.buffer_size = buffer_size;
    if let Some(n) = buffer_count {
        opts.buffer_count = usize::try_from(size_arg("buffer_count", n)?)
            .map_err(|_| PyValueError::new_err("buffer_count is too large"))?;
    }
    opts.queue_depth = opts
        .queue_depth
        .min(opts.buffer_count.saturating_sub(1).max(1) as u32);
    let cancel = AtomicBool::new(false);
    let mut interrupt: Option<PyErr> = None;
    let result = py.detach(|| {
        let mut report = |p: stream::Progress| {
            // Ctrl-C: Python's handler only sets a flag; run it here (the
            // thread that called us) and stop the write if it raised.
            if let Err(e) = Python::attach(|py| py.check_signals()) {
                interrupt.get_or_insert(e);
                cancel.store(true, Ordering::Relaxed);
            }
            if progress {
                eprint!(
                    "\r{:>8.2} / {:.2} GB  {:>6.2} GB/s",
                    p.bytes_done as f64 / 1e9,
                    p.total as f64 / 1e9,
                    p.bytes_per_sec / 1e9
                );
            }
        };
        stream::write_file_cancellable(&path, size, &opts, &mut report, &cancel)
    });
    if progress {
        eprintln!();
    }
    match result {
        Ok(stats) => Ok(WriteStats::from(&stats)),
        Err(e) => match (e.error, interrupt) {
            (Error::Cancelled, Some(py_err)) => Err(py_err),
            (error, _) => Err(to_py(error, Some(&path))),
        },
    }
}

/// A stream of generated data: dgen-py's streaming surface over the
/// crate's generator (same bytes for the same seed and settings).
#[pyclass(module = "pagewriter")]
struct Generator {
    inner: datagen::Generator,
    position: u64,
    threads: usize,
}

/// `buffer` as a one-dimensional numpy `uint8` view (`numpy.frombuffer`,
/// no copy), or `None` where numpy is not installed. Its `&mut [u8]` comes
/// from rust-numpy's borrow checking, so threads can fill it without
/// `unsafe` here.
fn numpy_view<'py>(
    py: Python<'py>,
    buffer: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, numpy::PyArray1<u8>>>> {
    let Ok(np) = py.import("numpy") else {
        return Ok(None);
    };
    let view = np.call_method1("frombuffer", (buffer, np.getattr("uint8")?))?;
    Ok(Some(view.cast_into::<numpy::PyArray1<u8>>()?))
}

#[pymethods]
impl Generator {
    #[new]
    #[pyo3(signature = (size, dedup_ratio = 1.0, compress_ratio = 1.0, seed = 0, block_size = 4096, threads = None))]
    fn new(
        size: i128,
        dedup_ratio: f64,
        compress_ratio: f64,
        seed: u64,
        block_size: i128,
        threads: Option<usize>,
    ) -> PyResult<Self> {
        let size = size_arg("size", size)?;
        let block_size = usize::try_from(size_arg("block_size", block_size)?)
            .map_err(|_| PyValueError::new_err("block_size is too large"))?;
        let inner = datagen::Generator::new(GenConfig {
            size,
            dedup_ratio,
            compress_ratio,
            block_size,
            seed,
        })
        .map_err(|e| to_py(e, None))?;
        let threads = match threads {
            Some(0) => return Err(PyValueError::new_err("threads must be at least 1")),
            Some(n) => n,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        Ok(Self {
            inner,
            position: 0,
            threads,
        })
    }

    /// Fills `buffer` (any writable, C-contiguous buffer of bytes:
    /// bytearray, memoryview, numpy uint8 array, mmap) with the next bytes
    /// of the stream, in place; returns how many (0 once complete).
    ///
    /// Where numpy is installed, the fill threads write the buffer directly
    /// through a numpy view of it (rust-numpy checks the borrow); without
    /// numpy they make pieces in their own memory and this thread copies
    /// them in (`datagen::fill_cells`). The bytes are the same either way.
    fn fill_chunk(&mut self, py: Python<'_>, buffer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let buf = PyBuffer::<u8>::get(buffer)?;
        if buf.readonly() {
            return Err(PyValueError::new_err("fill_chunk needs a writable buffer"));
        }
        if !buf.is_c_contiguous() {
            return Err(PyValueError::new_err(
                "fill_chunk needs a C-contiguous buffer",
            ));
        }
        let left = self.inner.config().size - self.position;
        let n = (buf.len_bytes() as u64).min(left) as usize;
        if n == 0 {
            return Ok(0);
        }
        let (inner, at, threads) = (&self.inner, self.position, self.threads);
        if let Some(view) = numpy_view(py, buffer)? {
            // The GIL stays held: no Python code runs while the pool writes.
            let mut view = view
                .try_readwrite()
                .map_err(|e| PyValueError::new_err(format!("fill_chunk: {e}")))?;
            let bytes = view
                .as_slice_mut()
                .map_err(|e| PyValueError::new_err(format!("fill_chunk: {e}")))?;
            inner
                .fill_at_parallel(at, &mut bytes[..n], threads)
                .map_err(|e| to_py(e, None))?;
        } else {
            let cells = buf
                .as_mut_slice(py)
                .ok_or_else(|| PyValueError::new_err("fill_chunk needs a writable buffer"))?;
            datagen::fill_cells(inner, at, &cells[..n], threads).map_err(|e| to_py(e, None))?;
        }
        self.position += n as u64;
        Ok(n)
    }

    /// The next `n` bytes of the stream (fewer at the end) as `bytes`.
    fn get_chunk<'py>(&mut self, py: Python<'py>, n: i128) -> PyResult<Bound<'py, PyBytes>> {
        let n = size_arg("n", n)?;
        let left = self.inner.config().size - self.position;
        let n =
            usize::try_from(n.min(left)).map_err(|_| PyValueError::new_err("n is too large"))?;
        let (inner, at, threads) = (&self.inner, self.position, self.threads);
        let mut failed = None;
        let bytes = PyBytes::new_with(py, n, |b: &mut [u8]| {
            if let Err(e) = py.detach(|| inner.fill_at_parallel(at, b, threads)) {
                failed = Some(e);
            }
            Ok(())
        })?;
        if let Some(e) = failed {
            return Err(to_py(e, None));
        }
        self.position += n as u64;
        Ok(bytes)
    }

    /// Bytes of the stream handed out so far.
    #[getter]
    fn position(&self) -> u64 {
        self.position
    }

    /// Bytes in the whole stream.
    #[getter]
    fn total_size(&self) -> u64 {
        self.inner.config().size
    }

    /// Starts the stream again from byte 0.
    fn reset(&mut self) {
        self.position = 0;
    }

    /// Whether every byte was handed out.
    fn is_complete(&self) -> bool {
        self.position >= self.inner.config().size
    }
}

/// Measures a file's dedup ratio (XXH3-128 per `block_size` block) and
/// compression ratio (LZ4 per 64 KiB of distinct data), as `gen --verify`.
#[pyfunction]
#[pyo3(signature = (path, block_size = 4096))]
fn measure(
    py: Python<'_>,
    path: PathBuf,
    block_size: i128,
) -> PyResult<std::collections::HashMap<&'static str, f64>> {
    use std::io::Read;
    let path = path_arg("path", path)?;
    let block_size = usize::try_from(size_arg("block_size", block_size)?)
        .ok()
        .filter(|&b| datagen::check_block_size(b).is_ok())
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "block_size = {block_size} is not a power of two in 512..=1048576"
            ))
        })?;
    let io_err = |e: std::io::Error| os_error(&e, e.to_string(), Some(path.display().to_string()));
    let mut f = std::fs::File::open(&path).map_err(io_err)?;
    let m = py
        .detach(|| datagen::measure(|buf| f.read(buf), block_size))
        .map_err(io_err)?;
    Ok([
        ("bytes", m.bytes as f64),
        ("block_size", block_size as f64),
        ("dedup_ratio", m.dedup_ratio),
        ("compress_ratio", m.compress_ratio),
    ]
    .into_iter()
    .collect())
}

/// The io worker's defaults for `path` (an `IoConfig`) as JSON text; the
/// Python wrapper overlays the caller's keyword arguments on it.
#[pyfunction]
fn io_defaults(path: PathBuf) -> PyResult<String> {
    let cfg = pagewriter_bench::workload::io::IoConfig::new(path_arg("filename", path)?);
    serde_json::to_string(&cfg).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// Runs `pagewriter io` with an `IoConfig` given as JSON text; returns the
/// report (the CLI's `--json`) as JSON text.
#[pyfunction]
fn io_json(py: Python<'_>, config: &str) -> PyResult<String> {
    use pagewriter_bench::workload::io::IoConfig;
    let given: serde_json::Map<String, serde_json::Value> = serde_json::from_str(config)
        .map_err(|e| PyValueError::new_err(format!("io: the options are not an object: {e}")))?;
    // Option by option over the defaults, so a bad value is named by its
    // option (a parse of the whole text would say only where in the text).
    let path = given
        .get("path")
        .and_then(|p| p.as_str())
        .map(PathBuf::from)
        .ok_or_else(|| PyValueError::new_err("io: no path"))?;
    let mut value = serde_json::to_value(IoConfig::new(path))
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))?;
    for (key, v) in given {
        value[key.as_str()] = v.clone();
        if let Err(e) = serde_json::from_value::<IoConfig>(value.clone()) {
            return Err(PyValueError::new_err(format!("io: {key} = {v}: {e}")));
        }
    }
    let cfg: IoConfig =
        serde_json::from_value(value).map_err(|e| PyValueError::new_err(format!("io: {e}")))?;
    let path = cfg.path.clone();
    let report = py
        .detach(|| pagewriter_bench::workload::io::run(&cfg, &mut |_| {}))
        .map_err(|e| to_py(e, Some(&path)))?;
    serde_json::to_string(&report).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// Runs `pagewriter scale`; returns the report (the CLI's `--json`) as JSON
/// text. Arguments as the CLI's; `duration` in seconds.
#[pyfunction]
#[pyo3(signature = (
    threads, modes, pages, page_size, rewrite, commit, duration, repeats, path,
    direct, queue_depth, dedup, compress, seed, reads, read_cache
))]
#[allow(clippy::too_many_arguments)]
fn scale_json(
    py: Python<'_>,
    threads: Vec<usize>,
    modes: Vec<String>,
    pages: usize,
    page_size: usize,
    rewrite: f64,
    commit: &str,
    duration: f64,
    repeats: usize,
    path: PathBuf,
    direct: &str,
    queue_depth: u32,
    dedup: f64,
    compress: f64,
    seed: u64,
    reads: usize,
    read_cache: usize,
) -> PyResult<String> {
    use pagewriter_bench::workload::scale::{self, CommitKind, Mode, ScaleConfig};
    let path = path_arg("path", path)?;
    let value = |e: Error| to_py(e, None);
    let modes = modes
        .iter()
        .map(|m| m.parse::<Mode>().map(|m| m.with_queue_depth(queue_depth)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(value)?;
    if !(duration.is_finite() && duration > 0.0 && duration <= 3600.0) {
        return Err(PyValueError::new_err(format!(
            "duration = {duration:?} is not in (0, 3600] seconds"
        )));
    }
    let cfg = ScaleConfig {
        threads,
        modes,
        pages_per_txn: pages,
        page_size,
        rewrite_fraction: rewrite,
        commit: commit.parse::<CommitKind>().map_err(|_| {
            PyValueError::new_err(format!(
                "commit = {commit:?} is not global (or sync), scoped, through, async:N or flush"
            ))
        })?,
        cell_duration: std::time::Duration::from_secs_f64(duration),
        repeats,
        dir: path,
        direct: match direct {
            "off" => DirectIo::Off,
            "on" => DirectIo::On,
            "auto" => DirectIo::Auto,
            other => {
                return Err(PyValueError::new_err(format!(
                    "direct = {other:?} is not off, on or auto"
                )));
            }
        },
        dedup_ratio: dedup,
        compress_ratio: compress,
        seed,
        reads_per_txn: reads,
        read_cache_bytes: read_cache,
        ..ScaleConfig::default()
    };
    let dir = cfg.dir.clone();
    let report = py
        .detach(|| scale::run(&cfg, |_| {}))
        .map_err(|e| to_py(e, Some(&dir)))?;
    serde_json::to_string(&report).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// The native module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(write_file, m)?)?;
    m.add_function(wrap_pyfunction!(measure, m)?)?;
    m.add_function(wrap_pyfunction!(io_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(io_json, m)?)?;
    m.add_function(wrap_pyfunction!(scale_json, m)?)?;
    m.add_class::<Generator>()?;
    m.add_class::<WriteStats>()?;
    Ok(())
}
