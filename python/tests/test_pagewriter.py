"""Tests of the pagewriter Python package against the Rust crates it wraps.

Run from a virtual environment where ``pip install ./python`` and pytest
(and numpy) are installed. The Rust CLI (``target/release/pagewriter`` or
``target/debug/pagewriter``, or $PAGEWRITER_BIN) gives the reference bytes.
"""

import errno
import math
import mmap
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import pagewriter

ROOT = Path(__file__).resolve().parents[2]
MIB = 1 << 20


def rust_cli():
    env = os.environ.get("PAGEWRITER_BIN")
    if env:
        return env
    for kind in ("release", "debug"):
        p = ROOT / "target" / kind / "pagewriter"
        if p.exists():
            return str(p)
    pytest.skip("no pagewriter binary built (cargo build), and no $PAGEWRITER_BIN")


def rust_bytes(size, dedup, compress, seed):
    out = subprocess.run(
        [rust_cli(), "gen", "--size", str(size), "--dedup", str(dedup),
         "--compress", str(compress), "--seed", str(seed)],
        check=True, capture_output=True,
    )
    return out.stdout


@pytest.mark.parametrize("dedup,compress", [(1.0, 1.0), (2.0, 2.0), (3.0, 1.5)])
def test_bytes_equal_the_rust_generator(dedup, compress):
    size = 3 * MIB + 12345
    want = rust_bytes(size, dedup, compress, 7)
    assert len(want) == size
    g = pagewriter.Generator(size, dedup_ratio=dedup, compress_ratio=compress, seed=7)
    got = bytearray()
    while not g.is_complete():
        got += g.get_chunk(1 << 20)
    assert bytes(got) == want
    # fill_chunk in uneven pieces gives the same stream.
    g.reset()
    assert g.position == 0
    buf = bytearray(777_777)
    got = bytearray()
    while (n := g.fill_chunk(buf)) > 0:
        got += buf[:n]
    assert bytes(got) == want
    assert g.position == size == g.total_size
    assert g.fill_chunk(buf) == 0


def test_another_seed_gives_other_bytes():
    a = pagewriter.Generator(1 << 16, seed=1).get_chunk(1 << 16)
    b = pagewriter.Generator(1 << 16, seed=2).get_chunk(1 << 16)
    assert a != b


def test_fill_chunk_fills_every_writable_buffer_type_in_place():
    np = pytest.importorskip("numpy")
    size = 4 * MIB
    want = pagewriter.Generator(size, 2.0, 2.0, seed=3).get_chunk(size)
    n = MIB
    bufs = {
        "bytearray": bytearray(n),
        "memoryview": memoryview(bytearray(n)),
        "numpy": np.zeros(n, dtype=np.uint8),
        "mmap": mmap.mmap(-1, n),
    }
    for name, buf in bufs.items():
        g = pagewriter.Generator(size, 2.0, 2.0, seed=3)
        g.fill_chunk(buf)  # skip the first MiB
        assert g.fill_chunk(buf) == n, name
        assert bytes(buf[:n]) == want[n:2 * n], name
        assert g.position == 2 * n, name


def test_fill_chunk_without_numpy_gives_the_same_bytes():
    # With numpy, fill threads write through a numpy view; without it (the
    # import blocked in a child interpreter) pieces are copied in. Both must
    # give the stream's bytes, for several thread counts.
    pytest.importorskip("numpy")
    size = 5 * MIB + 4321
    want = pagewriter.Generator(size, 2.0, 1.5, seed=9).get_chunk(size)
    code = textwrap.dedent(f"""
        import sys
        sys.modules["numpy"] = None  # import numpy now raises ImportError
        import pagewriter
        for threads in (1, 2, 3):
            g = pagewriter.Generator({size}, 2.0, 1.5, seed=9, threads=threads)
            buf, out = bytearray(3 << 20), bytearray()
            while (n := g.fill_chunk(buf)) > 0:
                out += buf[:n]
            sys.stdout.buffer.write(out)
    """)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         cwd="/").stdout
    assert out == want * 3
    for threads in (1, 2, 3):
        g = pagewriter.Generator(size, 2.0, 1.5, seed=9, threads=threads)
        buf, got = bytearray(3 << 20), bytearray()
        while (n := g.fill_chunk(buf)) > 0:
            got += buf[:n]
        assert bytes(got) == want


def test_fill_chunk_refuses_read_only_and_non_contiguous_buffers():
    np = pytest.importorskip("numpy")
    g = pagewriter.Generator(MIB)
    with pytest.raises(ValueError, match="writable"):
        g.fill_chunk(b"\0" * 4096)
    with pytest.raises(ValueError, match="writable"):
        g.fill_chunk(memoryview(bytearray(4096)).toreadonly())
    with pytest.raises(ValueError, match="contiguous"):
        g.fill_chunk(np.zeros((64, 64), dtype=np.uint8)[:, ::2])
    with pytest.raises((TypeError, BufferError)):
        g.fill_chunk(np.zeros(16, dtype=np.float64))
    assert g.position == 0, "nothing was handed out"


def test_write_file_content_stats_and_ratios(tmp_path):
    size = 24 * MIB + 4096 + 100  # an unaligned tail
    path = tmp_path / "data.bin"
    st = pagewriter.write_file(path, size, buffer_size=4 * MIB, dedup_ratio=2.0,
                               compress_ratio=2.0, seed=11)
    assert isinstance(st, pagewriter.WriteStats)
    assert st.bytes_written == size == path.stat().st_size
    assert st.duration_secs > 0 and st.throughput_gbps > 0
    assert math.isclose(st.throughput_gbps, size / st.duration_secs / 1e9, rel_tol=1e-6)
    assert st.cpu_s_per_gb > 0
    assert st.engine in ("io_uring", "pwrite") and st.io_mode
    assert st.buffer_size == 4 * MIB
    assert "WriteStats(" in repr(st)
    want = pagewriter.Generator(size, 2.0, 2.0, seed=11).get_chunk(size)
    assert path.read_bytes() == want
    m = pagewriter.measure(path)
    assert m["bytes"] == size
    assert abs(m["dedup_ratio"] / 2.0 - 1) < 0.05, m
    assert abs(m["compress_ratio"] / 2.0 - 1) < 0.05, m
    assert not Path(str(path) + ".partial").exists()


def test_the_proposals_snippet_runs_as_dgen_py(tmp_path):
    import pagewriter as dgen_py

    path = str(tmp_path / "p.bin")
    stats = dgen_py.write_file(path, size=8 * MIB, buffer_size=1 * MIB, buffer_count=4,
                               use_direct_io=False, dedup_ratio=1.0, compress_ratio=1.0,
                               use_io_uring=False)
    assert stats.bytes_written == 8 * MIB
    assert stats.engine == "pwrite" and not stats.direct


@pytest.mark.parametrize("kwargs", [
    {"size": -1},
    {"size": 2**70},
    {"size": MIB, "dedup_ratio": 0.5},
    {"size": MIB, "compress_ratio": float("nan")},
    {"size": MIB, "dedup_ratio": float("inf")},
    {"size": MIB, "buffer_size": 0},
    {"size": MIB, "buffer_size": -4096},
    {"size": MIB, "buffer_count": 0},
])
def test_bad_arguments_raise_value_error_and_write_nothing(tmp_path, kwargs):
    path = tmp_path / "bad.bin"
    with pytest.raises(ValueError):
        pagewriter.write_file(path, **kwargs)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [
    (-5,), (2**70,), (MIB, 0.9), (MIB, float("nan")), (MIB, 1.0, 0.0),
])
def test_bad_generator_arguments_raise_value_error(args):
    with pytest.raises(ValueError):
        pagewriter.Generator(*args)
    with pytest.raises(ValueError):
        pagewriter.Generator(MIB, block_size=0)
    with pytest.raises(ValueError):
        pagewriter.Generator(MIB).get_chunk(-1)


def test_a_directory_as_path_is_refused_and_left_alone(tmp_path):
    d = tmp_path / "dir"
    d.mkdir()
    (d / "keep").write_bytes(b"x")
    with pytest.raises((ValueError, OSError)) as e:
        pagewriter.write_file(d, MIB)
    assert str(d) in str(e.value)
    assert d.is_dir() and (d / "keep").read_bytes() == b"x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]


def test_an_unwritable_path_raises_os_error_with_errno_and_path(tmp_path):
    path = tmp_path / "missing" / "f.bin"
    with pytest.raises(OSError) as e:
        pagewriter.write_file(path, MIB)
    assert not isinstance(e.value, ValueError)
    assert e.value.errno == errno.ENOENT, e.value
    assert e.value.filename == str(path)
    with pytest.raises(OSError) as e:
        pagewriter.measure(tmp_path / "nope")
    assert e.value.errno == errno.ENOENT


def _threads_state(pid):
    """Per thread of `pid`: name, state, wait channel and kernel stack
    (where readable), to say where a process that does not exit is stuck."""
    out = []
    for task in sorted(Path(f"/proc/{pid}/task").glob("*")):
        def read(name):
            try:
                return (task / name).read_text().strip()
            except OSError as e:
                return f"<{e.strerror}>"
        state = (read("stat").rsplit(")", 1)[-1].split() or ["?"])[0]
        out.append(f"{task.name} {read('comm')} state={state} wchan={read('wchan')}\n"
                   f"{read('stack')}")
    return "\n".join(out)


def test_keyboard_interrupt_stops_write_file_promptly_and_cleans_up(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    size = min(16 << 30, free // 4)
    if size < 2 << 30:
        pytest.skip(f"{free} bytes free: too little for a write that lasts")
    path = tmp_path / "big.bin"
    path.write_bytes(b"old contents")
    # Ctrl-C as in an interactive session: a process started in the
    # background of a non-interactive shell (a CI job, nohup) inherits
    # SIGINT ignored, and Python then installs no KeyboardInterrupt.
    script = textwrap.dedent(f"""
        import signal, sys, pagewriter
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("start", flush=True)
        try:
            pagewriter.write_file({str(path)!r}, {size}, use_direct_io=False)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(7)
        print("finished", flush=True)
    """)
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "start"
    time.sleep(1.0)
    sent = time.monotonic()
    p.send_signal(signal.SIGINT)
    try:
        rc = p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        # Say where it is stuck, then stop it: a 16 GiB write must not go
        # on filling the disk after the test.
        where = _threads_state(p.pid)
        p.kill()
        p.wait()
        Path(str(path) + ".partial").unlink(missing_ok=True)
        pytest.fail(f"still running 30 s after SIGINT; its threads:\n{where}")
    waited = time.monotonic() - sent
    out = p.stdout.read()
    if "finished" in out:
        pytest.skip("the write finished before the signal (a very fast disk)")
    assert rc == 7 and "interrupted" in out, (rc, out)
    assert waited < 5, f"took {waited:.1f} s to stop"
    assert path.read_bytes() == b"old contents"
    assert not Path(str(path) + ".partial").exists()


def test_io_and_scale_return_the_clis_reports(tmp_path):
    f = tmp_path / "io.bin"
    r = pagewriter.io(f, rw="write", bs=65536, size=4 * MIB, pattern="gen", verify=True)
    assert r["write"]["bytes"] == 4 * MIB
    assert r["verified_blocks"] == 64
    r = pagewriter.io(f, rw="randread", bs=4096, size=4 * MIB, runtime=0.2)
    assert r["read"]["ios"] > 0 and r["write"] is None
    with pytest.raises(ValueError):
        pagewriter.io(f, colour="blue")
    with pytest.raises(ValueError):
        pagewriter.io(f, rw="sideways")
    s = pagewriter.scale(threads=[1, 2], modes=["vectored"], duration=0.2, repeats=1,
                         path=tmp_path, direct="off")
    rows = s["rows"]
    assert [(r["mode"], r["threads"]) for r in rows] == [("vectored", 1), ("vectored", 2)]
    assert all(r["commits_per_s"] > 0 for r in rows)
    with pytest.raises(ValueError):
        pagewriter.scale(modes=["bogus"], path=tmp_path)
    with pytest.raises(ValueError):
        pagewriter.scale(duration=-1, path=tmp_path)
    with pytest.raises(ValueError, match="dedup"):
        pagewriter.scale(dedup=0.5, path=tmp_path)
    with pytest.raises(ValueError, match="reads"):
        pagewriter.scale(reads=1 << 20, path=tmp_path)
    # Scoped and asynchronous commits, and the streams without a page writer.
    for commit, modes in (("scoped", ["vectored", "streams"]), ("async:2", ["vectored"])):
        s = pagewriter.scale(threads=[2], modes=modes, duration=0.2, repeats=1,
                             path=tmp_path, direct="off", commit=commit)
        assert s["config"]["commit"] == commit
        assert [r["mode"] for r in s["rows"]] == modes
        assert all(r["commits_per_s"] > 0 and r["syncs_per_commit"] > 0 for r in s["rows"])
    with pytest.raises(ValueError, match="commit"):
        pagewriter.scale(commit="async:0", path=tmp_path)
    # A read-heavy mix with a read cache reports reads and a hit ratio.
    s = pagewriter.scale(threads=[2], modes=["vectored"], duration=0.2, repeats=1,
                         path=tmp_path, direct="off", commit="flush", reads=16,
                         read_cache=64 << 20)
    row = s["rows"][0]
    assert row["reads_per_s"] > 0
    assert 0.0 <= row["cache_hit_ratio"] <= 1.0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["io.bin"], "scratch removed"


@pytest.mark.parametrize("call,option", [
    (lambda p: pagewriter.measure(p, block_size=3), "block_size"),
    (lambda p: pagewriter.measure(p, block_size=1 << 30), "block_size"),
    (lambda p: pagewriter.io(p, bs=-1), "bs"),
    (lambda p: pagewriter.io(p, size="big"), "size"),
    (lambda p: pagewriter.io(p, iodepth=2**70), "iodepth"),
])
def test_bad_arguments_are_value_errors_naming_the_option(tmp_path, call, option):
    f = tmp_path / "data.bin"
    f.write_bytes(b"x" * 4096)
    with pytest.raises(ValueError) as e:
        call(f)
    msg = str(e.value)
    assert option in msg, msg
    # No parser positions leak: the option names the problem.
    assert "line 1" not in msg and "column" not in msg, msg
    assert f.read_bytes() == b"x" * 4096


@pytest.mark.parametrize("call", [
    lambda p: pagewriter.measure(p),
    lambda p: pagewriter.write_file(p, MIB),
    lambda p: pagewriter.io(p, rw="write", size=MIB),
    lambda p: pagewriter.scale(path=p, duration=0.1, repeats=1),
])
def test_a_path_with_a_nul_byte_is_a_value_error(tmp_path, call):
    bad = str(tmp_path / "a\0b")
    with pytest.raises(ValueError, match="NUL"):
        call(bad)
    assert list(tmp_path.iterdir()) == []


def test_os_errors_carry_a_real_errno(tmp_path):
    # A directory where a file is expected: the read's own errno.
    with pytest.raises(OSError) as e:
        pagewriter.measure(tmp_path)
    assert e.value.errno == errno.EISDIR, e.value
    assert e.value.filename == str(tmp_path)
