"""pagewriter: synthetic data with exact dedup and compression ratios, and a
streaming ``write_file`` at the storage limit, from Python.

Built on the Rust crates ``pagewriter`` and ``pagewriter-bench`` (nothing is
reimplemented here). Sizes are in bytes, times in seconds, throughput in
GB/s (1e9 bytes per second).

``write_file`` and ``Generator`` follow dgen-py's names, so code written for
the proposed ``dgen_py.write_file`` runs with ``import pagewriter as dgen_py``.
"""

from __future__ import annotations

import json
import os
from typing import Any, Iterable, Optional

from ._native import Generator, WriteStats, measure, write_file
from . import _native

__all__ = ["Generator", "WriteStats", "write_file", "measure", "io", "scale"]


def io(filename: "str | os.PathLike[str]", **options: Any) -> dict:
    """Runs the fio-style I/O worker (``pagewriter io``) and returns its report
    as the CLI's ``--json`` does.

    ``options`` are ``IoConfig`` fields over their defaults, by the same names:
    ``rw`` ("read", "write", "randread", "randwrite", "rw", "randrw"), ``bs``
    and ``size`` (bytes), ``iodepth``, ``numjobs``, ``direct`` ("off", "on",
    "auto"), ``engine`` ("io_uring", "psync"), ``runtime`` (seconds, or None
    to do ``size`` bytes per job), ``pattern`` ("gen", "header", "fixed"),
    ``verify``, ``seed``, ``offset``, ``fsync_every``, ... An unknown name or
    a bad value raises ``ValueError``; an I/O failure ``OSError``.
    """
    config = json.loads(_native.io_defaults(os.fspath(filename)))
    for key, value in options.items():
        if key not in config or key == "path":
            raise ValueError(f"io: unknown option {key!r}")
        if key == "runtime" and value is not None:
            if not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"io: runtime = {value!r} must be seconds > 0")
            secs = float(value)
            value = {"secs": int(secs), "nanos": int(round((secs - int(secs)) * 1e9))}
        config[key] = value
    return json.loads(_native.io_json(json.dumps(config)))


def scale(
    threads: Iterable[int] = (1, 2, 4, 8),
    modes: Optional[Iterable[str]] = None,
    pages: int = 16,
    page_size: int = 4096,
    rewrite: float = 0.125,
    commit: str = "global",
    duration: float = 1.5,
    repeats: int = 3,
    path: "str | os.PathLike[str]" = ".",
    direct: str = "auto",
    queue_depth: int = 32,
    dedup: float = 1.0,
    compress: float = 1.0,
    seed: int = 24301,
    reads: int = 0,
    read_cache: int = 0,
) -> dict:
    """Runs ``pagewriter scale`` (commit throughput across thread counts) and
    returns its report as the CLI's ``--json`` does. Arguments are the CLI's;
    ``duration`` is seconds per cell, ``path`` the directory for the
    temporary files (removed afterwards); ``reads`` page reads per
    transaction and ``read_cache`` the read cache budget in bytes (the CLI's
    ``--reads`` and ``--read-cache``); ``commit`` is ``"global"``
    (``sync()``), ``"scoped"`` (each thread's own ``Writer::commit``),
    ``"through"`` (``Writer::write_and_commit``: a transaction's pages and
    its commit in one call), ``"async:N"`` (N tickets in flight per thread) or ``"flush"``, and the
    ``"streams"`` mode runs ``pwrite`` + ``fdatasync`` per commit without a
    page writer."""
    if modes is None:
        modes = ("per-page", "concat", "vectored", "io-uring", "separate-files")
    return json.loads(
        _native.scale_json(
            list(threads), list(modes), pages, page_size, rewrite, commit, duration,
            repeats, os.fspath(path), direct, queue_depth, dedup, compress, seed,
            reads, read_cache,
        )
    )
