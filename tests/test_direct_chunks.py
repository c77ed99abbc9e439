"""Decoders that write the output's chunks themselves (h5batch/conversion/direct_chunks.py).

Real WAV files, real HDF5 files with their chunks placed ahead (alloc time ``EARLY``), real
forked decoders and threads. Checked on content: every stored row against its source file,
the rows a decoder wrote against the rows it sent, and ``h5batch verify``.
"""

from __future__ import annotations

import io
import os

import h5py
import numpy as np
import pytest
import soundfile as sf

from h5batch import ConvertOptions, convert
from h5batch.batches import BatchTask
from h5batch.config import job_from_dict
from h5batch.conversion import fence
from h5batch.conversion.direct_chunks import ChunkSink, likely
from h5batch.conversion.fence import Fence
from h5batch.conversion.worker import decode_batch
from h5batch.transport.packing import Attached
from h5batch.transport.segments import new_run_id, remove_segments
from tests.support.h5compare import assert_same_h5

SR = 16000
DATA, TARGET = 1000, 500  # frames per sample: 2,000 and 1,000 bytes, so 4 and 8 rows per chunk
CHUNK = 8000  # output.chunk_bytes
N = 160  # pairs: 10 batches of 16, 2 groups of 8 rows (lcm of 4 and 8) each
BAD = (130, 157)  # rejected: 130 sits in batch 8's first group, 157 in batch 9's second


def _corpus(root) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """root/train/{data,label}/NNN.wav; returns the samples each good pair must store."""
    rng = np.random.default_rng(7)
    expected = {}
    for i in range(N):
        noise = rng.integers(-20000, 20000, size=DATA, dtype=np.int16)
        clean = rng.integers(-3000, 3000, size=TARGET, dtype=np.int16)
        for folder, x in (("data", noise), ("label", clean)):
            d = root / "train" / folder
            d.mkdir(parents=True, exist_ok=True)
            sf.write(d / f"{i:03d}.wav", x, SR, subtype="PCM_16")
        expected[i] = (noise, clean)
    for bad in BAD:
        (root / "train" / "data" / f"{bad:03d}.wav").write_bytes(b"RIFF" + bytes(3000))
        del expected[bad]
    return expected


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("direct") / "corpus"
    return root, _corpus(root)


def _job(root, out, **cluster):
    field = {"type": "audio", "extensions": [".wav"], "sample_rate": SR, "dtype": "int16"}
    return job_from_dict({
        "name": "direct",
        "source": {"root": str(root), "layout": "paired_folders"},
        "fields": {"data": {**field, "folder": "data", "length": DATA},
                   "target": {**field, "folder": "label", "length": TARGET}},
        "output": {"path": str(out), "codec": "none", "chunk_bytes": CHUNK, "overwrite": True},
        "cluster": {"kind": "inprocess", "workers": 2, "batch_size": 16, "dashboard": False, **cluster},
        "policy": {"max_reject_fraction": 0.5, "decode_timeout": 1.0},
    }, file="<test>")


def _convert(job):
    log = io.StringIO()
    summary = convert(job, ConvertOptions(overwrite=True, progress=False, log=log))
    return summary, log.getvalue()


def _check(path, expected) -> set[str]:
    with h5py.File(path, "r") as f:
        g = f["train"]
        names = [int(p.split("/")[-1][:-4]) for p in g["source"].asstr()[:, 0]]
        assert names == sorted(expected)
        assert g["data"].shape == (len(expected), DATA) and g["target"].shape == (len(expected), TARGET)
        data, target = g["data"][:], g["target"][:]
        for row, i in enumerate(names):
            np.testing.assert_array_equal(data[row], expected[i][0], err_msg=f"data of {i}")
            np.testing.assert_array_equal(target[row], expected[i][1], err_msg=f"target of {i}")
        return set(f["rejects"]["path"].asstr()[:])


@pytest.mark.parametrize("kind", ["inprocess", "local"])
def test_decoders_write_the_chunks_and_the_file_is_the_ordinary_one(corpus, tmp_path, kind):
    """In process, with forked decoders, and on a LocalCluster, its workers: most samples
    reach the file from the decoders, the rest (batches sent before the chunks were placed,
    and after each reject) through the writer; the file equals one made with no batch on a
    chunk boundary (the ordinary path throughout) and passes ``verify``; the run's fence is
    gone."""
    from h5batch.tools.verify import verify_file

    root, expected = corpus
    job = _job(root, tmp_path / "direct.h5", kind=kind)
    assert likely(job)
    summary, log = _convert(job)
    if kind == "inprocess":
        line = next(ln for ln in log.splitlines() if ln.startswith("in-process decoding:"))
        assert "samples written into the output by the decoders" in line, log
        written = int(line.split("; ")[-1].split()[0])
    else:
        line = next(ln for ln in log.splitlines() if ln.endswith("written into the output by the workers"))
        written = int(line.split()[0])
    # Batches 0-7 are written whole (the driver holds them back until the layout came), 8
    # not at all (130 is in its first group), 9 its first group if it was placed before 8's
    # reject was counted. (No head start here: the job's first batches are decoded after
    # the plan; with one, its batches would travel through shared memory.)
    assert "before the plan" not in line and written in (128, 136), line
    assert _check(summary.path, expected) == {f"train/{d}/{b:03d}.wav" for b in BAD for d in ("data", "label")}
    assert not list(tmp_path.glob("*.fence"))
    report = verify_file(str(summary.path), sources=True)
    assert report.ok, report.problems
    ordinary, log2 = _convert(_job(root, tmp_path / "ordinary.h5", batch_size=10))  # 10 rows: never whole chunks
    assert "written into the output by the decoders" not in log2
    assert_same_h5(summary.path, ordinary.path)


def test_workers_that_die_mid_batch_leave_the_ordinary_file(corpus, tmp_path, monkeypatch):
    """On a LocalCluster: the worker decoding 028.wav dies every time, after it wrote batch
    1's first group (16-23) and before its second (24-31): the batch is split until 028 is
    isolated and rejected, its parts ship their rows, and every later row moves down by one;
    the worker that takes batch 3 first dies at its start, and the batch runs again, whole
    and placed. The file holds every other sample in order, and passes ``verify``."""
    from h5batch.tools.verify import verify_file

    root, expected = corpus
    monkeypatch.setenv("H5BATCH_FAULTS", f"crash_on=028.wav,kill_once=3:{tmp_path / 'killed'}")
    summary, log = _convert(_job(root, tmp_path / "direct.h5", kind="local"))
    assert "written into the output by the workers" in log, log
    assert (tmp_path / "killed").exists()
    kept = {i: v for i, v in expected.items() if i != 28}
    assert _check(summary.path, kept) == {f"train/{d}/{b:03d}.wav" for b in (*BAD, 28) for d in ("data", "label")}
    report = verify_file(str(summary.path), sources=True)
    assert report.ok, report.problems
    assert not list(tmp_path.glob("*.fence"))


def test_a_job_that_cannot_place_chunks_is_not_likely(corpus, tmp_path):
    root, _ = corpus
    field = {"type": "audio", "extensions": [".wav"], "sample_rate": SR, "dtype": "int16"}

    def job(length, codec):
        return job_from_dict({
            "name": "direct", "source": {"root": str(root), "layout": "paired_folders"},
            "fields": {"data": {**field, "folder": "data", "length": length},
                       "target": {**field, "folder": "label", "length": TARGET}},
            "output": {"path": str(tmp_path / "x.h5"), "codec": codec}}, file="<test>")

    assert likely(job(DATA, "none")) and likely(job(DATA, "auto"))
    assert not likely(job(None, "none"))  # clips of any length
    assert not likely(job(DATA, "gzip"))


# --- one batch through decode_batch, into a file with its chunks placed ---------------------


def _placed_file(path, rows: int) -> dict[str, tuple[int, tuple[int, ...]]]:
    """An HDF5 file with a dataset per field whose chunks are all placed (as the writer
    places them); per field (rows per chunk, each chunk's file offset)."""
    out = {}
    with h5py.File(path, "w") as f:
        for name, frames in (("data", DATA), ("target", TARGET)):
            k = CHUNK // (2 * frames)
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
            ds = f.create_dataset(name, shape=(rows, frames), maxshape=(None, frames), chunks=(k, frames),
                                  dtype="<i2", dcpl=dcpl, fillvalue=0, fill_time="never")
            found: list[tuple[int, int]] = []
            ds.id.chunk_iter(lambda info, found=found: found.append((info.chunk_offset[0], info.byte_offset)))
            out[name] = (k, tuple(off for _, off in sorted(found)))
    Fence.create(str(path), 1)  # batch 0 open (the driver's fence, left for the test's end)
    return out


def _task(root, job, path, placed, items: range) -> BatchTask:
    rel = [((f"train/data/{i:03d}.wav", f"train/label/{i:03d}.wav"), 0, ()) for i in items]
    return BatchTask(index=0, split="train", start=0, items=tuple(rel), root=str(root),
                     fields=tuple(job.fields.items()), run_id=new_run_id(), transport="shm", timeout=1.0,
                     direct=tuple((name, 0, k, offs) for name, (k, offs) in placed.items()),
                     direct_path=str(path))


def _rows_in(path, name, n) -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f[name][:n]


def _sent(result) -> dict[str, list[np.ndarray]]:
    att = Attached(result.packed)
    try:
        return {b.name: [a.copy() for a in att.samples(b)] for b in result.packed.blocks}
    finally:
        att.release()


@pytest.mark.parametrize("fault", ["reject", "hang"])
def test_a_batch_written_until_its_first_failure_sends_the_rest(corpus, tmp_path, monkeypatch, fault):
    """Items 128-143 (two groups of 8), item 130 undecodable: no group complete, nothing
    written, all through shared memory. Items 144-159, item 157 undecodable: the first group
    is in the file, the second's good items travel through shared memory. ``hang``: items
    96-111, item 105 hangs past the decode timeout: the same, and the items after it, decoded
    on a fresh thread, do not complete the group in the file."""
    root, expected = corpus
    job = _job(root, tmp_path / "unused.h5")
    hang = 105 if fault == "hang" else None
    cases = [(range(128, 144), {130}, 0), (range(144, 160), {157}, 8)]
    if hang:
        monkeypatch.setenv("H5BATCH_FAULTS", f"hang_on={hang}.wav")
        cases = [(range(96, 112), {hang}, 8)]
    for items, bad, w_expected in cases:
        path = tmp_path / f"placed-{items.start}.h5"
        task = _task(root, job, path, _placed_file(path, 16), items)
        try:
            result = decode_batch(task)
            rejected = {r.path for r in result.rejects}
            assert rejected == {f"train/{d}/{i:03d}.wav" for i in bad for d in ("data", "label")}
            good = [i for i in items if i not in bad]
            assert [int(s[0][-7:-4]) for s in result.sources] == good
            w = result.packed.direct_rows
            assert w == w_expected and result.packed.direct_bytes == w * 2 * (DATA + TARGET)
            sent = _sent(result)
            for k, name in enumerate(("data", "target")):
                stored = _rows_in(path, name, w)
                for row in range(w):
                    np.testing.assert_array_equal(stored[row], expected[good[row]][k])
                rest = sent.get(name, [])
                assert len(rest) == len(good) - w
                for j, a in enumerate(rest):
                    np.testing.assert_array_equal(a, expected[good[w + j]][k])
            assert result.stuck == (hang in items)
        finally:
            remove_segments(task.run_id)


def test_a_lost_thread_never_writes_after_the_watch_gave_up(corpus, tmp_path):
    """The rule that keeps an abandoned decode thread out of the file: once the watch gave
    it up (``_Watched.give_up``, under the watch's lock), finishing a group writes nothing."""
    import threading

    from h5batch.conversion.worker import _Watched

    root, _ = corpus
    job = _job(root, tmp_path / "unused.h5")
    path = tmp_path / "placed.h5"
    placed = _placed_file(path, 16)
    task = _task(root, job, path, placed, range(0, 16))
    sink = ChunkSink.maybe(task, "shm")
    assert sink is not None and sink.G == 8

    class Watch:  # the state _Watched.give_up and ChunkSink.after share, without its thread
        abandoned = False
        lock = threading.Lock()

    watch = Watch()
    for b in sink.bufs:
        b[...] = 7
    _Watched.give_up(watch)
    sink.after(7, True, watch)  # the lost thread finishes the group
    sink.close()
    assert sink.written == 0
    with h5py.File(path, "r") as f:
        assert not f["data"][:8].any()  # never written (placed chunks read as zeros here)


def test_a_file_the_decoder_cannot_write_sends_the_batch_the_ordinary_way(corpus, tmp_path):
    """A write that fails (here the path is a folder: EISDIR; on a user's machine a full
    disk) stops the sink: nothing counts as written, every sample travels to the writer."""
    import dataclasses

    root, expected = corpus
    job = _job(root, tmp_path / "unused.h5")
    path = tmp_path / "placed.h5"
    task = dataclasses.replace(_task(root, job, path, _placed_file(path, 16), range(0, 16)), direct_path=str(tmp_path))
    try:
        result = decode_batch(task)
        assert result.packed.direct_rows == 0 and not result.rejects
        sent = _sent(result)
        for k, name in enumerate(("data", "target")):
            assert len(sent[name]) == 16
            for i, a in enumerate(sent[name]):
                np.testing.assert_array_equal(a, expected[i][k])
    finally:
        remove_segments(task.run_id)


# --- the fence: a late copy of a batch writes nothing (h5batch/conversion/fence.py) ---------


def test_a_late_copy_of_a_closed_batch_writes_nothing(corpus, tmp_path):
    """The driver closed batch 0 before the writer stored it (as it does before every
    placed batch's Store): a second run of the task, as Dask may make, decodes it and
    ships every sample, and writes none of its chunks, whose rows the writer may have
    moved there since. Then the fence is retired, the file gone: no write either."""
    root, expected = corpus
    job = _job(root, tmp_path / "unused.h5")
    path = tmp_path / "placed.h5"
    placed = _placed_file(path, 16)
    with h5py.File(path, "r+") as f:  # what the writer put there after a reject: not the batch's rows
        f["data"][:16] = 5
    stale = Fence(fence.path_for(str(path)), os.open(fence.path_for(str(path)), os.O_RDWR), 1)
    stale.close(0)
    for round_ in ("closed", "retired"):
        task = _task(root, job, path, placed, range(0, 16))
        try:
            result = decode_batch(task)
            assert result.packed.direct_rows == 0 and not result.rejects, round_
            sent = _sent(result)
            for i, a in enumerate(sent["data"]):
                np.testing.assert_array_equal(a, expected[i][0])
            assert (_rows_in(path, "data", 16) == 5).all(), round_
        finally:
            remove_segments(task.run_id)
        stale.retire()
        assert not os.path.exists(fence.path_for(str(path)))


def test_a_killed_runs_fence_is_closed_before_the_next_run(corpus, tmp_path):
    """A fence left by a killed run, every batch open: ``retire_stale`` (the next run's
    first step) closes them all for a decoder that still holds the file open, then unlinks
    it; that decoder's next group is not written. A new fence on the same output is a new
    file, open, whatever the old one's descriptors say."""
    partial = str(tmp_path / "x.h5.partial")
    Fence.create(partial, 3)
    fd = os.open(fence.path_for(partial), os.O_RDWR)  # a decoder of the killed run
    try:
        assert os.pread(fd, 3, 0) == b"\0\0\0"
        fence.retire_stale(partial)
        assert not os.path.exists(fence.path_for(partial))
        assert os.pread(fd, 3, 0) == b"\1\1\1"
        with fence.hold(fence.path_for(partial), 1) as open_:
            assert not open_  # the path is gone
        new = Fence.create(partial, 3)
        with fence.hold(fence.path_for(partial), 1) as open_:
            assert open_
        new.close(1)
        with fence.hold(fence.path_for(partial), 1) as open_:
            assert not open_
        with fence.hold(fence.path_for(partial), 2) as open_:
            assert open_
        new.retire()
    finally:
        os.close(fd)


def test_closing_a_batch_waits_for_a_write_in_progress_then_names_it(tmp_path, monkeypatch):
    """A decoder in another process holds batch 2's shared lock (a write in progress; here a
    stopped one): closing batch 1 does not wait for it, closing batch 2 waits, and past
    ``WAIT_SECONDS`` fails with a message naming the batch instead of hanging the run. Once
    the holder is gone, batch 2 closes."""
    import subprocess
    import sys

    from h5batch.errors import ConvertError

    partial = str(tmp_path / "x.h5.partial")
    f = Fence.create(partial, 4)
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({fence.path_for(partial)!r}, os.O_RDWR)\n"
        "fcntl.lockf(fd, fcntl.LOCK_SH, 1, 2, os.SEEK_SET)\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(fence, "WAIT_SECONDS", 0.3)
        f.close(1)
        with pytest.raises(ConvertError, match="batch 2"):
            f.close(2)
        with fence.hold(fence.path_for(partial), 2) as open_:
            assert open_  # (this process's view: still open, nothing was set)
    finally:
        holder.kill()
        holder.wait()
    f.close(2)
    with fence.hold(fence.path_for(partial), 2) as open_:
        assert not open_
    f.retire()


def test_a_decoder_thread_of_the_drivers_own_process_is_fenced_too(tmp_path):
    """POSIX locks do not exclude within one process: where a decoder is a thread of the
    driver's process (a threaded Dask cluster started there), closing its batch must still
    wait for its write in progress, and the write after the close must not happen."""
    import threading
    import time

    partial = str(tmp_path / "x.h5.partial")
    f = Fence.create(partial, 2)
    inside, release, events = threading.Event(), threading.Event(), []

    def decoder():
        with fence.hold(fence.path_for(partial), 0) as open_:
            assert open_
            inside.set()
            release.wait(5)
            events.append("written")

    t = threading.Thread(target=decoder)
    t.start()
    assert inside.wait(5)
    closer = threading.Thread(target=lambda: (f.close(0), events.append("closed")))
    closer.start()
    time.sleep(0.2)
    assert events == []  # the close waits for the write in progress
    release.set()
    t.join(5)
    closer.join(5)
    assert events == ["written", "closed"]
    with fence.hold(fence.path_for(partial), 0) as open_:
        assert not open_
    f.retire()
