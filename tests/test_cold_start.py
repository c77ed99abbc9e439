"""``cluster.kind: auto`` and ``inprocess``: a small job decodes in the driver process, a large
one on a LocalCluster; the file is the same either way, down to the stored chunk bytes; a
file that kills its decoder still becomes a reject wherever processes are used, and the
decode timeout holds in-process. Speed is the bench's business: nothing here is timed."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import h5py
import hdf5plugin  # noqa: F401  (plugin filters for reading)
import pytest

from h5batch import generate
from h5batch.config import job_from_dict, load_job
from h5batch.conversion import inprocess
from h5batch.layouts import discover
from tests.conftest import REPO
from tests.support import run
from tests.support.h5compare import assert_same_h5
from tests.support.processes import holder_of

DEMO = REPO / "jobs" / "demo.yaml"
PAIRED = REPO / "jobs" / "paired_audio.yaml"


@pytest.fixture(scope="module")
def paired(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cold") / "corpus"
    # test_worker_failures' corpus: with 24 + 8 pairs, crash isolation on a LocalCluster
    # waited a minute or more in fut.result() 2 runs in 4, with or without this module
    generate.make_paired_audio(root, n_train=48, n_test=16, seconds=0.25, seed=5)
    return root


def convert(job: Path, root: Path, out: Path, kind: str, *settings: str, faults: str = "",
            progress: str = "none", timeout: float = 300):
    return run.convert(job, output=out, root=root, progress=progress, env_extra={"H5BATCH_FAULTS": faults},
                       settings=(f"cluster.kind={kind}", "cluster.dashboard=false", *settings), timeout=timeout)


# Faults fire in the driver's codec trial too: a named codec and batch size need no trial.
NO_TRIAL = ("output.codec=none", "cluster.batch_size=8")


def stored_chunks(path: Path) -> dict[str, list[bytes]]:
    """Every chunked dataset's chunks as stored (compressed bytes and filter mask); not
    those of strings, whose chunks hold addresses in the file's global heap."""
    out: dict[str, list[bytes]] = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and obj.chunks and obj.dtype.kind != "O":
                chunks = []
                for i in range(obj.id.get_num_chunks()):
                    info = obj.id.get_chunk_info(i)
                    mask, data = obj.id.read_direct_chunk(info.chunk_offset)
                    chunks.append(bytes([mask]) + data)
                out[name] = chunks
        f.visititems(visit)
    return out


def rejects(out: Path) -> list[dict]:
    path = Path(str(out).replace(".h5", ".rejects.jsonl"))
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_auto_decodes_a_small_job_in_process_and_writes_the_same_file_as_local(demo_root, tmp_path):
    a, b = tmp_path / "auto.h5", tmp_path / "local.h5"
    # A named codec: compressed chunks to compare, and no trial figures in the attributes.
    res = convert(DEMO, demo_root, a, "auto", "output.codec=blosc2-lz4", progress="log")
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stderr.splitlines() if x.startswith("cluster auto: "))
    assert line.startswith("cluster auto: inprocess (") and "to decode on one thread" in line, line
    # decoders forked at the start, one per core (a 1-core machine decodes on the driver's thread)
    assert re.search(r"cluster: in-process, (\d+ forked decoders|1 decode thread) \(no worker processes\)",
                     res.stderr), res.stderr
    assert "preflight: in-process decoding" in res.stderr
    # progress reaches the console, not the decoder-warning capture of fd 2
    assert "[h5batch] " in res.stderr and "files (100%)" in res.stderr
    assert not Path(str(a).replace(".h5", ".warnings.txt")).exists()
    res = convert(DEMO, demo_root, b, "local", "output.codec=blosc2-lz4", "cluster.workers=2")
    assert res.returncode == 0, res.stderr
    assert "cluster: LocalCluster, 2 worker processes" in res.stderr and "cluster auto" not in res.stderr
    assert_same_h5(a, b)
    assert stored_chunks(a) == stored_chunks(b)  # byte for byte, compressed image chunks included
    assert not run.own_stale_segments()


def test_auto_chooses_by_the_estimated_work(demo_root, monkeypatch):
    monkeypatch.delenv("H5BATCH_FAULTS", raising=False)
    job = load_job(DEMO, [f"source.root={demo_root}", "cluster.kind=auto"])
    m = discover(job)
    small = inprocess.choose_kind(job, m, len(m.items), resuming=False)
    assert small.kind == "inprocess" and f"{len(m.items)} items" in small.why
    large = inprocess.choose_kind(job, m, 10**8, resuming=False)  # the same files, a corpus 10^8 items long
    assert large.kind == "local" and "over 3 s" in large.why and "worker processes" in large.why
    assert inprocess.resolved(job, "local").cluster.kind == "local"
    ip = inprocess.resolved(job, "inprocess").cluster
    assert ip.kind == "inprocess" and ip.compress_on == "writer"  # as on a LocalCluster: the writer compresses


def test_auto_uses_processes_when_resuming_or_when_faults_are_injected(demo_root, monkeypatch):
    job = load_job(DEMO, [f"source.root={demo_root}", "cluster.kind=auto"])
    m = discover(job)
    monkeypatch.delenv("H5BATCH_FAULTS", raising=False)
    resumed = inprocess.choose_kind(job, m, len(m.items), resuming=True)
    assert resumed.kind == "local" and resumed.why.startswith("resuming")
    monkeypatch.setenv("H5BATCH_FAULTS", "crash_on=nothing.wav")
    faulty = inprocess.choose_kind(job, m, len(m.items), resuming=False)
    assert faulty.kind == "local" and "H5BATCH_FAULTS" in faulty.why
    for kind in ("local", "inprocess"):  # explicit kinds are taken as they are, faults or not
        explicit = load_job(DEMO, [f"source.root={demo_root}", f"cluster.kind={kind}"])
        assert inprocess.choose_kind(explicit, m, 10**8, resuming=True) == inprocess.KindChoice(kind)


def test_forked_decoders_are_for_jobs_that_may_decode_in_process():
    from h5batch.conversion.cluster import default_workers
    from h5batch.conversion.spares import MAX_DECODERS, count

    def job(kind: str, workers: int | None):
        data = {"name": "x", "source": {"root": ".", "layout": "class_folders"},
                "fields": {"audio": {"type": "audio", "extensions": [".wav"]}}, "output": {"path": "x.h5"},
                "cluster": {"kind": kind, **({"workers": workers} if workers else {})}}
        return job_from_dict(data, "job.yaml", check_paths=False)

    per_core = min(MAX_DECODERS, default_workers())
    per_core = per_core if per_core > 1 else 0  # one decoder: the driver's thread, nothing forked
    assert count(job("inprocess", 3)) == 3 and count(job("inprocess", 2)) == 2 and count(job("inprocess", 1)) == 0
    assert count(job("inprocess", None)) == per_core and count(job("auto", None)) == per_core
    # auto with workers > 1 starts a LocalCluster whatever the work; other kinds never decode in process
    assert count(job("auto", 2)) == 0 and count(job("auto", 1)) == 0 and count(job("local", None)) == 0


def _lock_type(lock, pause: float) -> str:
    time.sleep(pause)
    return type(lock).__name__


def test_a_call_that_cannot_reach_a_forked_decoder_runs_on_the_drivers_thread():
    """Arguments that do not pickle (a lock) cannot go to a forked decoder: the call is
    decoded on the driver's thread instead, and every future resolves (the feed thread
    used to die with the batch unresolved, and the driver waited for ever)."""
    import multiprocessing as mp
    import threading

    from h5batch.conversion.spares import SpareDecoder, can_fork

    data = {"name": "x", "source": {"root": ".", "layout": "class_folders"},
            "fields": {"audio": {"type": "audio", "extensions": [".wav"]}}, "output": {"path": "x.h5"},
            "cluster": {"kind": "inprocess", "workers": 2}}
    # Forked from here where that is safe; under pytest-xdist (execnet's threads) from a fork
    # server, as the Driver does in a threaded process.
    ctx = None if can_fork() else mp.get_context("forkserver")
    spares = SpareDecoder.start_all(job_from_dict(data, "job.yaml", check_paths=False), ctx)
    assert len(spares) == 2
    client = inprocess.InProcessClient(spares, own_thread=False)  # as a run with forked decoders
    try:
        futs = [client.submit(_lock_type, threading.Lock(), 0.05) for _ in range(6)]
        assert [f.result(timeout=20) for f in futs] == ["lock"] * 6
        # each decoder takes a call, fails to send it and is killed; the driver's thread
        # joins in at the first loss and decodes them all
        assert client.served["died"] == 2 and client.served["thread"] == 6, client.served
        assert not any(s.alive for s in spares)
    finally:
        client.close()
        for s in spares:
            s.tell()
            s.reap()


def _alive_with(text: str) -> list[int]:
    """Processes whose command line mentions ``text`` (a test's own output path)."""
    pids = []
    for d in Path("/proc").iterdir():
        try:
            if d.name.isdigit() and text in (d / "cmdline").read_bytes().decode(errors="replace"):
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def test_forked_decoders_share_the_batches_and_write_the_same_file(demo_root, tmp_path):
    one, more = tmp_path / "one.h5", tmp_path / "forked.h5"
    # A named codec: codec auto weighs measured speeds, and two runs may choose differently.
    codec = "output.codec=blosc2-lz4"
    res = convert(DEMO, demo_root, one, "inprocess", "cluster.workers=1", "cluster.batch_size=16", codec)
    assert res.returncode == 0, res.stderr
    assert "cluster: in-process, 1 decode thread (no worker processes)" in res.stderr
    res = convert(DEMO, demo_root, more, "inprocess", "cluster.workers=3", "cluster.batch_size=16", codec)
    assert res.returncode == 0, res.stderr
    assert "cluster: in-process, 3 forked decoders (no worker processes)" in res.stderr
    line = next(x for x in res.stderr.splitlines() if x.startswith("in-process decoding: "))
    thread, forked = (int(n) for n in re.findall(r"(\d+) (?:batches on|in forked)", line))
    assert thread + forked >= 3 and forked > 0 and "died" not in line, line
    # Every field is of a fixed size per batch (a numeric batch_size): the forked decoders
    # started on the first batches before the plan (head_start.py), and the file is the same.
    assert line.endswith("; the first 3 submitted before the plan"), line
    assert_same_h5(one, more)
    assert stored_chunks(one) == stored_chunks(more)
    assert not _alive_with(str(more)), "a forked decoder outlived its run"
    assert not run.own_stale_segments()


def test_the_drivers_lines_never_land_in_the_decoder_warnings(demo_root, tmp_path):
    """Decoding starts on a head start's queued batches while the driver writes its
    "cluster:" and "preflight:" lines, and a decode points fd 2 at the decoder-warning
    capture (the forked decoders' own fd 2; the driver's where its thread decodes): those
    lines must reach the console, not a file's warnings.
    (They did not in 1 run of 3 before driver.run wrote them through the console's copy
    of fd 2; several runs, so a race shows.)"""
    for k in range(4):
        out = tmp_path / f"run{k}.h5"
        res = convert(DEMO, demo_root, out, "inprocess", "cluster.workers=3", "cluster.batch_size=16",
                      "output.codec=none")
        assert res.returncode == 0, res.stderr
        assert "before the plan" in res.stderr, res.stderr  # the head start ran
        assert "cluster: in-process, 3 forked decoders" in res.stderr, res.stderr
        assert "preflight: in-process decoding" in res.stderr, res.stderr
        warnings_file = out.with_suffix(".warnings.txt")
        assert not warnings_file.exists(), warnings_file.read_text()


def test_no_head_start_where_the_trial_sizes_the_batches(demo_root, tmp_path):
    """The demo's audio has no fixed length: batch_size auto waits for the codec trial's
    sizes, so no batch may start before the plan (head_start.py)."""
    res = convert(DEMO, demo_root, tmp_path / "auto.h5", "inprocess", "cluster.workers=2")
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stderr.splitlines() if x.startswith("in-process decoding: "))
    assert "before the plan" not in line, line


def test_a_forked_decoder_that_dies_has_its_batch_decoded_again(demo_root, tmp_path):
    ref, out = tmp_path / "ref.h5", tmp_path / "out.h5"
    assert convert(DEMO, demo_root, ref, "inprocess", "cluster.workers=1").returncode == 0
    marker = tmp_path / "killed"
    res = convert(DEMO, demo_root, out, "inprocess", "cluster.workers=2", "cluster.batch_size=16",
                  faults=f"kill_forked={marker}")
    assert res.returncode == 0, res.stderr
    assert marker.exists()  # the forked decoder did kill itself
    # The other forked decoder and the driver's thread (it joins in when a decoder dies) go on.
    assert "cluster: in-process, 2 forked decoders" in res.stderr, res.stderr
    assert re.search(r"in-process decoding: \d+ batches on the driver's thread, \d+ in forked decoders; "
                     r"1 forked decoder died, its batch decoded again", res.stderr), res.stderr
    assert not out.with_suffix(".warnings.txt").exists()  # no driver line taken for a decoder warning
    assert_same_h5(ref, out)
    assert not _alive_with(str(out))
    assert not run.own_stale_segments()


def test_a_file_that_crashes_its_decoder_is_still_rejected_under_auto(paired, tmp_path):
    out = tmp_path / "out.h5"
    # test_worker_failures' settings, kind auto (the trial decodes even items: 5.wav is not among them)
    res = run.convert(PAIRED, "--set", "cluster.kind=auto", workers=2, output=out, root=paired,
                      env_extra={"H5BATCH_FAULTS": "crash_on=5.wav"}, timeout=400,
                      settings=("cluster.batch_size=8", "policy.retries=1", "policy.max_reject_fraction=0.2"))
    assert res.returncode == 0, res.stderr
    assert "cluster auto: local (H5BATCH_FAULTS is set" in res.stderr
    rej = [r for r in rejects(out) if r["path"].endswith("/5.wav")]
    assert sorted(r["path"] for r in rej) == ["test/data/5.wav", "test/label/5.wav", "train/data/5.wav", "train/label/5.wav"]
    assert all(r["stage"] == "worker" and "worker failed while decoding" in r["reason"] for r in rej)
    assert not run.own_stale_segments()


def test_decode_timeout_holds_in_process(paired, tmp_path):
    out = tmp_path / "out.h5"
    res = convert(PAIRED, paired, out, "inprocess", *NO_TRIAL, "policy.decode_timeout=1",
                  "policy.max_reject_fraction=0.2", faults="hang_on=7.wav")
    assert res.returncode == 0, res.stderr
    rej = [r for r in rejects(out) if r["path"].endswith("/7.wav")]
    assert sorted(r["path"] for r in rej) == ["test/data/7.wav", "test/label/7.wav", "train/data/7.wav", "train/label/7.wav"]
    assert all(r["stage"] == "timeout" for r in rej), rej
    with h5py.File(out, "r") as f:
        assert f["train"]["source"].shape[0] == 47 and f["test"]["source"].shape[0] == 15
    assert not run.own_stale_segments()


def test_after_a_crash_in_process_the_next_auto_run_resumes_on_processes(paired, tmp_path):
    out = tmp_path / "out.h5"
    # kind inprocess taken at its word: the "decoder" kills the driver itself
    res = convert(PAIRED, paired, out, "inprocess", *NO_TRIAL, faults="crash_on=20.wav")
    assert res.returncode == -9, res.stderr
    partial = Path(str(out) + ".partial")
    deadline = time.monotonic() + 20  # the orphaned writer commits what it stored and exits
    while holder_of(partial) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert Path(str(partial) + ".commit.json").exists(), "the writer left nothing to resume"
    res = convert(PAIRED, paired, out, "auto", *NO_TRIAL, "cluster.workers=2")
    assert res.returncode == 0, res.stderr
    assert "cluster auto: local (resuming" in res.stderr
    ref = tmp_path / "ref.h5"
    res = convert(PAIRED, paired, ref, "inprocess", *NO_TRIAL)
    assert res.returncode == 0, res.stderr
    assert_same_h5(ref, out)
    assert not run.own_stale_segments()


# A command line's conversion, with a report of what its driver imported (stdout, JSON).
_CLI_WITH_MODULES = """
import json, sys
from h5batch.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, **{m: m in sys.modules for m in ("blosc2", "dask", "distributed")}}))
"""


def test_a_command_line_driver_forks_its_writer_and_never_imports_blosc2_or_dask(demo_root, tmp_path):
    """The CLI's driver is single-threaded when the writer starts: the writer is forked from
    it; codec: auto's measurements run on Blosc2's C library (or in the writer where it does
    not load), so the driver imports neither blosc2 nor Dask.
    The file equals one made where the fork server starts the writer (a thread is running)
    and the driver measures itself: the same samples and trial figures (the codec auto
    picks from them also weighs a speed measured at run time: see assert_same_h5)."""
    import sys
    import threading

    from h5batch import ConvertOptions
    from h5batch import convert as convert_in_process
    from h5batch.conversion.writer_start import can_fork

    a, b = tmp_path / "cli.h5", tmp_path / "threaded.h5"
    cmd = [sys.executable, "-c", _CLI_WITH_MODULES, *run.convert_cmd(DEMO, output=a, root=demo_root)[len(run.CLI):]]
    res = run.run(cmd)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[-1]) == {"code": 0, "blosc2": False, "dask": False,
                                                         "distributed": False}
    stop = threading.Event()
    busy = threading.Thread(target=stop.wait, daemon=True)
    busy.start()
    try:
        assert not can_fork()
        job = load_job(DEMO, [f"source.root={demo_root}", f"output.path={b}"])
        convert_in_process(job, ConvertOptions(overwrite=True, progress="none"))
    finally:
        stop.set()
    assert_same_h5(a, b)
    with h5py.File(a) as f:
        assert "blosc2-lz4 shrank 32 trial samples" in f["train/image"].attrs["codec_choice"]


def test_a_driver_with_threads_starts_its_decoders_from_the_fork_server(demo_root, tmp_path):
    """In this (threaded) test process the writer and the decoders come from the writer's
    fork server: the same file as one decode thread, the decoders gone at the end."""
    import io
    import multiprocessing as mp

    from h5batch import ConvertOptions
    from h5batch import convert as convert_in_process

    outs = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}.h5"
        job = load_job(DEMO, [f"source.root={demo_root}", f"output.path={out}", "cluster.kind=inprocess",
                              f"cluster.workers={workers}", "cluster.batch_size=16"])
        log = io.StringIO()
        convert_in_process(job, ConvertOptions(overwrite=True, progress="none", log=log))
        outs[workers] = (out, log.getvalue())
    assert "cluster: in-process, 1 decode thread (no worker processes)" in outs[1][1]
    line = next(x for x in outs[2][1].splitlines() if x.startswith("in-process decoding: "))
    assert int(re.search(r"(\d+) in forked decoders", line).group(1)) > 0, outs[2][1]
    assert "cluster: in-process, 2 forked decoders" in outs[2][1]
    assert_same_h5(outs[1][0], outs[2][0])
    assert not [p for p in mp.active_children() if p.name == "h5batch-decoder"]
    assert not run.own_stale_segments()


def test_the_probe_spreads_its_items_coarse_to_fine():
    """The first :data:`PROBE_ITEMS` picks are the evenly spaced ones; the ones the probe
    adds while it is quick lie between them; no item twice, none past the corpus."""
    n = 100_000
    picks = inprocess.spread(n, inprocess.PROBE_MORE)
    first = inprocess.PROBE_ITEMS
    assert picks[:first] == [i * n // first for i in range(first)]
    assert picks[first:2 * first] == [(2 * i + 1) * n // (2 * first) for i in range(first)]
    assert len(picks) == inprocess.PROBE_MORE == len(set(picks)) and all(0 <= p < n for p in picks)
    assert sorted(inprocess.spread(5, 64)) == [0, 1, 2, 3, 4]
    assert inprocess.spread(0, 64) == []
