"""The engines: ``cluster.kind: processes`` (the default; ``auto`` and ``inprocess`` of older
job files mean it) and a LocalCluster write the same file, down to the stored chunk bytes; a
file that kills its decoder or hangs it becomes a reject on the default engine; the command
line's driver forks its writer and decoders and never imports Dask."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import hdf5plugin  # noqa: F401  (plugin filters for reading)
import pytest

from h5batch import generate
from h5batch.config import job_from_dict, load_job
from tests.conftest import REPO
from tests.support import run
from tests.support.h5compare import assert_same_h5

DEMO = REPO / "jobs" / "demo.yaml"
PAIRED = REPO / "jobs" / "paired_audio.yaml"


@pytest.fixture(scope="module")
def paired(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("engines") / "corpus"
    generate.make_paired_audio(root, n_train=48, n_test=16, seconds=0.25, seed=5)
    return root


def convert(job: Path, root: Path, out: Path, kind: str, *settings: str, faults: str = "",
            progress: str = "none", timeout: float = 300):
    return run.convert(job, output=out, root=root, progress=progress, env_extra={"H5BATCH_FAULTS": faults},
                       settings=(f"cluster.kind={kind}", "cluster.dashboard=false", *settings), timeout=timeout)


NO_TRIAL = ("output.codec=none", "cluster.batch_size=8")  # a named codec and batch size: no trial


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


def test_processes_and_a_local_cluster_write_the_same_file(demo_root, tmp_path):
    a, b = tmp_path / "processes.h5", tmp_path / "local.h5"
    # A named codec: compressed chunks to compare, and no trial figures in the attributes.
    res = convert(DEMO, demo_root, a, "processes", "output.codec=blosc2-lz4", "cluster.workers=2", progress="log")
    assert res.returncode == 0, res.stderr
    assert "decoding on 2 decoder processes on this machine" in res.stderr
    assert "[h5batch] " in res.stderr and "files (100%)" in res.stderr
    assert not Path(str(a).replace(".h5", ".warnings.txt")).exists()
    res = convert(DEMO, demo_root, b, "local", "output.codec=blosc2-lz4", "cluster.workers=2")
    assert res.returncode == 0, res.stderr
    assert "decoding on LocalCluster, 2 worker processes" in res.stderr
    assert_same_h5(a, b)
    assert stored_chunks(a) == stored_chunks(b)  # byte for byte, compressed image chunks included
    assert not run.own_stale_segments()


@pytest.mark.parametrize("kind", ["auto", "inprocess"])
def test_older_kinds_mean_the_local_decoder_processes(demo_root, kind):
    job = load_job(DEMO, [f"source.root={demo_root}", f"cluster.kind={kind}"])
    assert job.cluster.kind == "processes"
    spec = {"name": "x", "source": {"root": str(demo_root), "layout": "class_folders"},
            "fields": {"audio": {"type": "audio", "extensions": [".wav"]}},
            "output": {"path": "o.h5"}, "cluster": {"kind": kind}}
    assert job_from_dict(spec).cluster.kind == "processes"
    assert job_from_dict({k: v for k, v in spec.items() if k != "cluster"}).cluster.kind == "processes"


def test_a_file_that_crashes_its_decoder_is_rejected_on_the_default_engine(paired, tmp_path):
    out = tmp_path / "out.h5"
    res = convert(PAIRED, paired, out, "processes", *NO_TRIAL, "cluster.workers=2", "policy.max_reject_fraction=0.2",
                  faults="crash_on=5.wav")
    assert res.returncode == 0, res.stderr
    rej = [r for r in rejects(out) if r["path"].endswith("/5.wav")]
    assert sorted(r["path"] for r in rej) == ["test/data/5.wav", "test/label/5.wav", "train/data/5.wav", "train/label/5.wav"]
    assert all(r["stage"] == "worker" and "died (killed by SIGKILL)" in r["reason"] for r in rej), rej
    with h5py.File(out, "r") as f:
        assert f["train"]["source"].shape[0] == 47 and f["test"]["source"].shape[0] == 15
    assert not run.own_stale_segments()


def test_a_file_that_crashes_the_codec_trial_is_rejected_by_its_batch(paired, tmp_path):
    """The trial runs on the engine: its crash costs a decoder, not the driver."""
    out = tmp_path / "out.h5"
    res = convert(PAIRED, paired, out, "processes", "cluster.workers=2", "policy.max_reject_fraction=0.2",
                  faults="crash_on=0.wav")  # item 0 is the trial's first pick
    assert res.returncode == 0, res.stderr
    assert "codec trial failed on a worker" in res.stderr
    rej = [r for r in rejects(out) if r["path"].endswith("/0.wav")]
    assert len(rej) == 4 and all(r["stage"] == "worker" for r in rej), rej


def test_decode_timeout_holds_on_the_default_engine(paired, tmp_path):
    out = tmp_path / "out.h5"
    res = convert(PAIRED, paired, out, "processes", *NO_TRIAL, "policy.decode_timeout=1",
                  "policy.max_reject_fraction=0.2", faults="hang_on=7.wav")
    assert res.returncode == 0, res.stderr
    rej = [r for r in rejects(out) if r["path"].endswith("/7.wav")]
    assert sorted(r["path"] for r in rej) == ["test/data/7.wav", "test/label/7.wav", "train/data/7.wav", "train/label/7.wav"]
    assert all(r["stage"] == "timeout" for r in rej), rej
    with h5py.File(out, "r") as f:
        assert f["train"]["source"].shape[0] == 47 and f["test"]["source"].shape[0] == 15
    assert not run.own_stale_segments()


# A command line's conversion, with a report of what its driver imported (stdout, JSON).
_CLI_WITH_MODULES = """
import json, sys
from h5batch.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, **{m: m in sys.modules for m in ("dask", "distributed")}}))
"""


def test_the_default_engine_needs_no_dask_and_a_threaded_caller_gets_the_same_file(demo_root, tmp_path):
    """The command line's driver forks its writer and decoders and never imports Dask; a
    caller with a thread of its own (a notebook) gets them from the fork server, without
    its start method changed, and the same file."""
    import multiprocessing as mp
    import sys
    import threading

    from h5batch import ConvertOptions
    from h5batch import convert as convert_in_process
    from h5batch.forking import can_fork

    a, b = tmp_path / "cli.h5", tmp_path / "threaded.h5"
    settings = ("output.codec=none",)
    cmd = [sys.executable, "-c", _CLI_WITH_MODULES,
           *run.convert_cmd(DEMO, output=a, root=demo_root, settings=settings)[len(run.CLI):]]
    res = run.run(cmd)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[-1]) == {"code": 0, "dask": False, "distributed": False}
    method = mp.get_start_method(allow_none=True)
    stop = threading.Event()
    busy = threading.Thread(target=stop.wait, daemon=True)
    busy.start()
    try:
        assert not can_fork()
        job = load_job(DEMO, [f"source.root={demo_root}", f"output.path={b}", *settings])
        convert_in_process(job, ConvertOptions(overwrite=True, progress="none"))
    finally:
        stop.set()
    # multiprocessing itself fixes an unset start method to the platform's default when it
    # starts a process from the fork server; h5batch sets neither it nor the server's preload
    assert mp.get_start_method(allow_none=True) in (method, mp.get_all_start_methods()[0])
    from multiprocessing import forkserver
    assert forkserver._forkserver._preload_modules == ["__main__"]
    assert_same_h5(a, b)
    assert not [p for p in mp.active_children() if p.name in ("h5batch-decoder", "h5batch-writer")]
    assert not run.own_stale_segments()


def test_a_frozen_decoder_is_killed_and_its_batch_decoded_again(paired, tmp_path):
    """A decoder that sends no heartbeat (stopped: as a native call holding the GIL would
    look) is killed after policy.frozen_worker_timeout; its file, frozen only once, is then
    stored like every other."""
    out = tmp_path / "out.h5"
    marker = tmp_path / "frozen-once"
    res = convert(PAIRED, paired, out, "processes", *NO_TRIAL, "cluster.workers=2", "policy.frozen_worker_timeout=3",
                  faults=f"freeze_once=9.wav:{marker}")
    assert res.returncode == 0, res.stderr
    assert marker.exists()
    assert rejects(out) == []
    with h5py.File(out, "r") as f:
        assert f["train"]["source"].shape[0] == 48 and f["test"]["source"].shape[0] == 16
    assert not run.own_stale_segments()
