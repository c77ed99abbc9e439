"""The head start (h5batch/conversion/head_start.py): the first in-process batches decode on
the forked decoders before the plan is made. Real files, real forked decoders, real shared
memory; the whole-conversion cases (same file as without it, the log line) are in
tests/test_cold_start.py."""

from __future__ import annotations

import os

from h5batch.config import load_job
from h5batch.conversion.head_start import AHEAD_PER_DECODER, HeadStart
from h5batch.conversion.inprocess import InProcessClient, KindChoice
from h5batch.conversion.spares import SpareDecoder, close_all
from h5batch.forking import can_fork
from h5batch.layouts import discover
from h5batch.transport.segments import SHM_DIR, new_run_id
from h5batch.writer.process import writer_context
from tests.conftest import REPO

PAIRED = REPO / "jobs" / "paired_audio.yaml"


def _job(root, out, *settings: str):
    return load_job(PAIRED, [f"source.root={root}", f"output.path={out}", "cluster.kind=inprocess",
                             "cluster.workers=2", *settings])


def _decoders(job) -> list[SpareDecoder]:
    """Forked from this process where it may fork, else from the writer's fork server (as a
    run in a process with threads starts them)."""
    return SpareDecoder.start_all(job, None if can_fork() else writer_context())


def _segments(run_id: str) -> list[str]:
    return [n for n in os.listdir(SHM_DIR) if run_id in n]


def test_batches_decoded_ahead_are_the_plans_and_a_head_start_never_taken_leaves_nothing(paired_root, tmp_path):
    job = _job(paired_root, tmp_path / "o.h5", "cluster.batch_size=4")
    manifest = discover(job)
    spares = _decoders(job)
    assert len(spares) == 2
    run_id = new_run_id()
    try:
        head = HeadStart.begin(job, manifest, KindChoice("inprocess"), None, spares, run_id)
        assert head is not None and sorted(head.futures) == list(range(2 * AHEAD_PER_DECODER))
        for index, fut in head.futures.items():
            result = fut.result(timeout=120)
            task = head.tasks[index]
            assert (result.index, result.start, result.n_items) == (index, task.start, len(task.items))
            assert result.n_samples == len(task.items) and not result.rejects
        assert head.client.served == {"thread": 0, "forked": 2 * AHEAD_PER_DECODER, "died": 0}
        assert _segments(run_id), "the decoded batches wait in shared memory"
        head.close()  # the run ended before its loop took the batches over
        assert not _segments(run_id)
        assert not any(s.process.is_alive() for s in spares)
    finally:
        close_all(spares)


def test_no_head_start_where_the_plan_could_cut_other_batches(paired_root, tmp_path):
    fixed = _job(paired_root, tmp_path / "o.h5", "cluster.batch_size=4")
    variable = _job(paired_root, tmp_path / "o.h5")  # batch_size auto, clips of any length: the trial sizes it
    manifest = discover(fixed)
    spares = _decoders(fixed)
    try:
        inproc = KindChoice("inprocess")
        assert HeadStart.begin(variable, manifest, inproc, None, spares, new_run_id()) is None
        assert HeadStart.begin(fixed, manifest, KindChoice("local"), None, spares, new_run_id()) is None
        assert HeadStart.begin(fixed, manifest, inproc, None, [], new_run_id()) is None
        workers = _job(paired_root, tmp_path / "o.h5", "cluster.batch_size=4", "cluster.compress_on=workers")
        assert HeadStart.begin(workers, manifest, inproc, None, spares, new_run_id()) is None
        # Fixed and uncompressed: the decoders will write the output's chunks, once placed.
        placed = _job(paired_root, tmp_path / "o.h5", "cluster.batch_size=4", "fields.data.length=8000",
                      "fields.target.length=8000", "output.codec=none")
        assert HeadStart.begin(placed, manifest, inproc, None, spares, new_run_id()) is None
    finally:
        close_all(spares)



_PREWARM = """
import json, os, sys, time
from h5batch.config import load_job
from h5batch.conversion.auto import TARGET_BATCH_BYTES
from h5batch.conversion.plan import TaskList
from h5batch.conversion.spares import PREWARM_SEGMENTS, SpareDecoder, close_all
from h5batch.conversion.worker import decode_batch
from h5batch.forking import can_fork
from h5batch.layouts import discover
from h5batch.transport.segments import SHM_DIR, hostname, list_segments, new_run_id, remove_segments

job = load_job(sys.argv[1], sys.argv[2:])
manifest = discover(job)
run_id = new_run_id()
assert can_fork()
spares = SpareDecoder.start_all(job, run_id=run_id)
out = {"decoders": len(spares)}
try:
    def touched():
        return {n: os.stat(os.path.join(SHM_DIR, n)).st_blocks * 512 for n in list_segments(run_id)}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (len(touched()) < PREWARM_SEGMENTS * len(spares)
                                           or min(touched().values()) < TARGET_BATCH_BYTES):
        time.sleep(0.05)
    out["made"] = touched()
    task = TaskList(job, manifest, run_id, hostname(), 4)[0]
    raised, result = spares[0].call(decode_batch, (task,))
    out["raised"] = repr(result) if raised else ""
    out["samples"] = result.n_samples
    out["taken"] = result.packed.shm_name
    out["after_batch"] = list_segments(run_id)
    close_all(spares)
    out["after_end"] = list_segments(run_id)
finally:
    close_all(spares)
    remove_segments(run_id)
print(json.dumps({**out, "expected": PREWARM_SEGMENTS, "bytes": TARGET_BATCH_BYTES}))
"""


def test_a_forked_decoder_prewarms_its_segments_and_unlinks_those_never_taken(paired_root, tmp_path):
    """Forked with the run's id, a decoder makes and touches its shared-memory segments while
    it waits for its first batch (spares.PREWARM_SEGMENTS); a batch takes one of them, and
    the decoder unlinks the others when it ends. In a process of its own: pytest's has
    threads, where decoders come from the fork server, without a prewarm."""
    import json
    import subprocess
    import sys

    args = [f"source.root={paired_root}", f"output.path={tmp_path / 'o.h5'}", "cluster.kind=inprocess",
            "cluster.workers=2", "cluster.batch_size=4"]
    res = subprocess.run([sys.executable, "-c", _PREWARM, str(PAIRED), *args], capture_output=True, text=True,
                         timeout=300, cwd=REPO)
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["decoders"] == 2
    made = out["made"]
    assert len(made) == 2 * out["expected"], made  # each decoder's own
    assert all(b >= out["bytes"] for b in made.values()), made  # pages in memory, not a hole
    assert not out["raised"] and out["samples"] == 4
    assert out["taken"] in made, "the batch did not take a prewarmed segment"
    assert sorted(out["after_batch"]) == sorted(made), "the batch made a segment of its own"
    assert out["after_end"] == [out["taken"]]  # the writer's to read; the driver removes it


def _double(x: int) -> int:
    return 2 * x


def test_a_head_starts_lost_decoder_waits_for_the_loop_before_the_drivers_thread_decodes(paired_root, tmp_path):
    """A forked decoder that dies during a head start leaves its batch to the driver's
    thread only once the driver's loop has the client (allow_thread): before that, the
    driver runs the codec trial and prints through fd 2, which a decode on its thread points
    at the decoder-warning capture (the driver's lines were lost that way, 1 run in 10-20)."""
    import signal
    import time

    job = _job(paired_root, tmp_path / "o.h5")  # 2 workers: 2 forked decoders
    spares = _decoders(job)
    assert len(spares) == 2
    try:
        for s in spares:
            os.kill(s.process.pid, signal.SIGKILL)
            s.process.join(10)
        client = InProcessClient(spares, own_thread=False, thread_allowed=False)
        fut = client.submit(_double, 21)
        deadline = time.monotonic() + 20
        while client.served["died"] < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert client.served["died"] == 2
        time.sleep(0.2)
        assert not fut.done() and client.served["thread"] == 0
        assert not any(t.name == "h5batch-inprocess" for t in client.threads)
        client.allow_thread()  # what connect() does when the loop takes the head start over
        assert fut.result(timeout=20) == 42 and client.served["thread"] == 1
        client.close()
    finally:
        close_all(spares)
