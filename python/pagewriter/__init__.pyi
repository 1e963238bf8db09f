"""Type stubs of the pagewriter package. Sizes in bytes, times in seconds,
throughput in GB/s (1e9 bytes per second)."""

import os
from typing import Any, Iterable, Optional

class WriteStats:
    """Figures of one ``write_file``."""

    bytes_written: int
    """Bytes written (the file's size)."""
    duration_secs: float
    """Wall time from open to the rename of the complete file."""
    throughput_gbps: float
    """bytes_written / duration_secs / 1e9."""
    cpu_s_per_gb: float
    """CPU seconds (user + system, the whole process) per 1e9 bytes."""
    io_mode: str
    """Engine, queue depth, buffers and O_DIRECT, as the CLI prints them."""
    engine: str
    """"io_uring" or "pwrite"."""
    fallbacks: list[str]
    """Why an engine or O_DIRECT asked for was not used."""
    direct: bool
    """Whether O_DIRECT was used."""
    buffer_size: int
    buffer_count: int
    queue_depth: int
    gen_threads: int
    gen_secs: float
    """Seconds the fill threads spent generating (summed over threads)."""
    io_wait_secs: float
    """Seconds the I/O side waited for writes to complete."""
    starved_secs: float
    """Seconds the I/O side waited for a filled buffer."""
    preallocate_secs: float
    fdatasync_secs: float

def write_file(
    path: str | os.PathLike[str],
    size: int,
    buffer_size: int = 8 * 1024 * 1024,
    buffer_count: Optional[int] = None,
    use_direct_io: bool = True,
    dedup_ratio: float = 1.0,
    compress_ratio: float = 1.0,
    use_io_uring: bool = True,
    seed: int = 0,
    progress: bool = False,
) -> WriteStats:
    """Writes ``size`` bytes of generated data to ``path`` at the storage's
    speed: ``buffer_count`` buffers of ``buffer_size`` bytes circulate
    between fill threads and io_uring (or pwrite) writes.

    The data goes to ``path + ".partial"`` and is renamed over ``path`` only
    when complete and synced; an existing ``path`` is untouched until then,
    and a failed or interrupted run removes the partial file.

    ``use_direct_io``: O_DIRECT where the file system takes it (``io_mode``
    says which). ``use_io_uring``: io_uring where it can be set up, else
    pwrite (``fallbacks`` says why). ``buffer_count`` None: chosen for the
    device and CPU. ``progress``: a progress line on stderr.

    The GIL is released while writing; Ctrl-C raises ``KeyboardInterrupt``
    within about 200 ms.

    Raises ``ValueError`` (bad sizes, ratios < 1 or NaN, a directory as
    path), ``OSError`` (with errno and the path) for I/O failures.
    """

class Generator:
    """A stream of generated data with exact dedup and compression ratios;
    the same bytes as the Rust generator for the same settings and seed."""

    def __init__(
        self,
        size: int,
        dedup_ratio: float = 1.0,
        compress_ratio: float = 1.0,
        seed: int = 0,
        block_size: int = 4096,
        threads: Optional[int] = None,
    ) -> None:
        """``size`` bytes in all; dedup at ``block_size``; ``threads`` fill
        threads (None: the CPU count). Raises ``ValueError`` for bad
        arguments."""
    def fill_chunk(self, buffer: Any) -> int:
        """Fills a writable, C-contiguous byte buffer (bytearray, memoryview,
        numpy uint8 array, mmap) in place with the next bytes; returns how
        many (0 once complete). Raises ``ValueError`` for a read-only or
        non-contiguous buffer, ``BufferError``/``TypeError`` for one that is
        not bytes."""
    def get_chunk(self, n: int) -> bytes:
        """The next ``n`` bytes (fewer at the end) as ``bytes``."""
    @property
    def position(self) -> int:
        """Bytes handed out so far."""
    @property
    def total_size(self) -> int:
        """Bytes in the whole stream."""
    def reset(self) -> None:
        """Starts the stream again from byte 0."""
    def is_complete(self) -> bool:
        """Whether every byte was handed out."""

def measure(path: str | os.PathLike[str], block_size: int = 4096) -> dict[str, float]:
    """A file's ratios, as ``pagewriter gen --verify``: ``bytes``,
    ``block_size``, ``dedup_ratio`` (blocks / distinct blocks, XXH3-128) and
    ``compress_ratio`` (LZ4 per 64 KiB of distinct data). Raises
    ``OSError`` with the path."""

def io(filename: str | os.PathLike[str], **options: Any) -> dict[str, Any]:
    """Runs ``pagewriter io``; returns the CLI's ``--json`` report."""

def scale(
    threads: Iterable[int] = (1, 2, 4, 8),
    modes: Optional[Iterable[str]] = None,
    pages: int = 16,
    page_size: int = 4096,
    rewrite: float = 0.125,
    commit: str = "global",
    duration: float = 1.5,
    repeats: int = 3,
    path: str | os.PathLike[str] = ".",
    direct: str = "auto",
    queue_depth: int = 32,
    dedup: float = 1.0,
    compress: float = 1.0,
    seed: int = 24301,
    reads: int = 0,
    read_cache: int = 0,
) -> dict[str, Any]:
    """Runs ``pagewriter scale``; returns the CLI's ``--json`` report."""
