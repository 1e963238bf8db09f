#!/usr/bin/env python3
"""Streaming generated data from Python: pagewriter against dgen-py and fio.

On one file system, interleaved, median of --rounds (default 3):
  (a) dgen-py's "current approach": Generator.fill_chunk into an 8 MiB
      page-aligned buffer, then os.write to a file opened with O_DIRECT;
  (b) pagewriter.write_file with the same size and buffer size;
  (c) a fill_chunk loop of each Generator into one reused buffer, at 1 and
      2 threads, incompressible and dedup = compress = 2 (no I/O), beside
      memset of the same buffer from as many threads: the rate at which
      this machine stores bytes with no generator at all;
  (d) fio's sequential write at the same block size (O_DIRECT, io_uring,
      end_fsync), where fio is installed.

Set up (dgen-py goes into the bench's own virtual environment):
  python3 -m venv /tmp/bench-venv
  /tmp/bench-venv/bin/pip install ./python "dgen-py==0.3.*" numpy
  /tmp/bench-venv/bin/python python/bench.py --dir /path/on/the/disk --size 8GiB

Throughput is in GB/s (1e9 bytes per second); the file is removed after each
run. Prints a Markdown table and, with --json FILE, the raw figures.
"""

import argparse
import concurrent.futures
import ctypes
import json
import mmap
import os
import shutil
import statistics
import subprocess
import sys
import time

# This script sits beside the package's source folder: import the installed
# package, not the source (which has no compiled module).
_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]

import pagewriter  # noqa: E402

try:
    import dgen_py
except ImportError:
    dgen_py = None

UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "": 1}


def parse_size(s):
    for unit in ("KiB", "MiB", "GiB", ""):
        if s.endswith(unit):
            return int(float(s[: len(s) - len(unit)] if unit else s) * UNITS[unit])
    raise ValueError(s)


def dgen_write(path, size, bs):
    """The proposal's "current approach": fill_chunk + os.write, O_DIRECT."""
    g = dgen_py.Generator(size=size, seed=1)
    buf = mmap.mmap(-1, bs)  # page-aligned, as O_DIRECT needs
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    t = time.perf_counter()
    try:
        done = 0
        while done < size:
            n = g.fill_chunk(buf)
            if n == 0:
                break
            # O_DIRECT writes whole blocks: the last one is written padded.
            os.write(fd, buf if n == bs else memoryview(buf)[: (n + 4095) // 4096 * 4096])
            done += n
        os.fsync(fd)
    finally:
        os.close(fd)
    dt = time.perf_counter() - t
    os.truncate(path, size)
    return size / dt / 1e9


def pw_write(path, size, bs):
    st = pagewriter.write_file(path, size, buffer_size=bs, use_direct_io=True, seed=1)
    return st.throughput_gbps


def fio_write(path, size, bs):
    out = subprocess.run(
        ["fio", "--name=seqwrite", f"--filename={path}", f"--size={size}", f"--bs={bs}",
         "--rw=write", "--ioengine=io_uring", "--iodepth=4", "--direct=1", "--end_fsync=1",
         "--output-format=json"],
        check=True, capture_output=True, text=True,
    ).stdout
    job = json.loads(out)["jobs"][0]
    return job["write"]["io_bytes"] / (job["job_runtime"] / 1000) / 1e9


def fill_loop(make, size, bs):
    g = make()
    buf = bytearray(bs)
    t = time.perf_counter()
    done = 0
    while done < size:
        n = g.fill_chunk(buf)
        if n == 0:
            break
        done += n
    return done / (time.perf_counter() - t) / 1e9


def memset_loop(threads, size, bs):
    """Zeroes one reused buffer of `bs` bytes until `size` bytes are done,
    split over `threads` threads (ctypes calls release the GIL)."""
    buf = bytearray(bs)
    base = ctypes.addressof((ctypes.c_char * bs).from_buffer(buf))
    part = bs // threads
    pieces = [(base + i * part, part if i < threads - 1 else bs - i * part)
              for i in range(threads)]
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        t = time.perf_counter()
        done = 0
        while done < size:
            list(pool.map(lambda p: ctypes.memset(p[0], 0, p[1]), pieces))
            done += bs
        return done / (time.perf_counter() - t) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, help="directory on the file system to test")
    ap.add_argument("--size", default="8GiB", help="file size (default 8GiB)")
    ap.add_argument("--bs", default="8MiB", help="buffer / block size (default 8MiB)")
    ap.add_argument("--gen-size", default="4GiB", help="bytes per fill_chunk loop")
    ap.add_argument("--gen-bs", default="32MiB", help="buffer of the fill_chunk loops")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the raw figures here")
    ap.add_argument("--skip-write", action="store_true",
                    help="only the fill_chunk loops (no file is written)")
    a = ap.parse_args()
    if dgen_py is None:
        sys.exit("dgen-py is not installed in this environment (see the module docstring)")
    size, bs = parse_size(a.size), parse_size(a.bs)
    gsize, gbs = parse_size(a.gen_size), parse_size(a.gen_bs)
    path = os.path.join(a.dir, "pagewriter-bench.bin")
    if shutil.disk_usage(a.dir).free < 2 * size:
        sys.exit(f"{a.dir}: less than twice --size free")
    has_fio = shutil.which("fio") is not None
    writers = [("dgen-py fill_chunk + os.write (O_DIRECT)", dgen_write),
               ("pagewriter.write_file", pw_write)]
    if a.skip_write:
        writers, has_fio = [], False
    elif has_fio:
        writers.append(("fio seq write (O_DIRECT, io_uring QD4)", fio_write))
    gens = []
    for threads in (1, 2):
        for d in (1.0, 2.0):
            gens.append((f"dgen-py fill_chunk, {threads} thr, dedup=compress={d:g}",
                         lambda t=threads, d=d: dgen_py.Generator(
                             size=gsize, dedup_ratio=d, compress_ratio=d, max_threads=t, seed=1)))
            gens.append((f"pagewriter fill_chunk, {threads} thr, dedup=compress={d:g}",
                         lambda t=threads, d=d: pagewriter.Generator(
                             gsize, dedup_ratio=d, compress_ratio=d, threads=t, seed=1)))
    ceilings = [(f"memset, {threads} thr", threads) for threads in (1, 2)]
    figures = {name: [] for name, _ in writers + gens + ceilings}
    for r in range(a.rounds):
        for name, fn in writers:
            try:
                figures[name].append(fn(path, size, bs))
            finally:
                if os.path.exists(path):
                    os.remove(path)
            print(f"round {r + 1}: {name}: {figures[name][-1]:.3f} GB/s", file=sys.stderr)
        for name, make in gens:
            figures[name].append(fill_loop(make, gsize, gbs))
            print(f"round {r + 1}: {name}: {figures[name][-1]:.3f} GB/s", file=sys.stderr)
        for name, threads in ceilings:
            figures[name].append(memset_loop(threads, gsize, gbs))
            print(f"round {r + 1}: {name}: {figures[name][-1]:.3f} GB/s", file=sys.stderr)
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(f"\nwrite {a.size} at {a.bs} to {a.dir}, median of {a.rounds} interleaved rounds\n")
    print("| case | GB/s | ratio |")
    print("|---|---|---|")
    base = med[writers[0][0]] if writers else 0
    for name, _ in writers:
        print(f"| {name} | {med[name]:.3f} | {med[name] / base:.2f}x dgen-py |")
    if has_fio:
        fio = med[writers[2][0]]
        print(f"| pagewriter.write_file vs fio | | {med[writers[1][0]] / fio:.2f}x fio |")
    for i in range(0, len(gens), 2):
        d, p = gens[i][0], gens[i + 1][0]
        print(f"| {p} | {med[p]:.2f} | {med[p] / med[d]:.2f}x dgen-py ({med[d]:.2f}) |")
    print("\nmemset of the same buffer from the same threads (no generator):\n")
    print("| threads | memset GB/s | dgen-py 1:1 / 2:2 | pagewriter 1:1 / 2:2 |")
    print("|---|---|---|---|")
    for name, threads in ceilings:
        m = med[name]
        share = [med[n] / m for n, _ in gens if f", {threads} thr," in n]
        print(f"| {threads} | {m:.2f} | {share[0]:.2f} / {share[2]:.2f} of memset "
              f"| {share[1]:.2f} / {share[3]:.2f} of memset |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"config": vars(a), "runs": figures, "median": med}, f, indent=1)


if __name__ == "__main__":
    main()
