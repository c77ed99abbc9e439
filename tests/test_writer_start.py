"""What a conversion starts besides decoding: the writer process without the caller's main
module (a script that calls ``h5batch.convert`` runs its top level once, however many
writers its conversions start; multiprocessing would otherwise run it again in every writer,
imports and all, before the writer stores a batch), Dask settings for a cluster it starts,
and the read-ahead hint of a batch, which must never block."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import h5py

from h5batch import generate
from tests.support import run

SCRIPT = """
import os, sys
with open({marker!r}, "a") as fh:  # every execution of this module's top level
    fh.write(f"{{os.getpid()}} {{__name__}}\\n")

def main():
    import io
    import h5batch
    from h5batch.config import job_from_dict
    from h5batch.conversion.options import ConvertOptions
    for k in range(3):
        job = job_from_dict({{
            "name": "main-once",
            "source": {{"root": {root!r}, "layout": "paired_folders", "splits": ["train"]}},
            "fields": {{"data": {{"type": "audio", "folder": "data", "extensions": [".wav"],
                                  "sample_rate": 16000, "dtype": "int16", "length": 4000}},
                        "target": {{"type": "audio", "folder": "label", "extensions": [".wav"],
                                    "sample_rate": 16000, "dtype": "int16", "length": 4000}}}},
            "output": {{"path": os.path.join({out!r}, f"out{{k}}.h5"), "codec": "auto"}},  # the default (its trial runs first)
            "cluster": {{"kind": "inprocess", "batch_size": 8, "dashboard": False}},
        }}, file="<test>")
        h5batch.convert(job, ConvertOptions(progress="none", log=io.StringIO()))

if __name__ == "__main__":
    main()
"""


def test_script_top_level_runs_once_per_driver(tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    generate.make_paired_audio(root, n_train=12, n_test=0, seconds=0.25, seed=3)
    marker, out = tmp_path / "executions.txt", tmp_path / "out"
    out.mkdir()
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT.format(marker=str(marker), root=str(root), out=str(out))))
    done = run.run([sys.executable, str(script)], cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = marker.read_text().splitlines()
    assert len(lines) == 1 and lines[0].endswith(" __main__"), lines  # the driver only, no writer
    for k in range(3):
        with h5py.File(out / f"out{k}.h5", "r") as f:
            assert f["train/data"].shape == (12, 4000)
            assert f["train/target"].shape == (12, 4000)


def test_started_clusters_skip_idle_work(tmp_path: Path) -> None:
    """A cluster the run starts ticks its event loops every 500 ms, not 20 ms, and its
    workers sample their stacks only when there is a dashboard to show them."""
    import dask

    from h5batch.config import job_from_dict
    from h5batch.conversion.driver import _dask_settings

    def job(dashboard: bool):
        return job_from_dict({"name": "s", "source": {"root": str(tmp_path), "layout": "class_folders"},
                              "fields": {"audio": {"type": "audio", "extensions": [".wav"]}},
                              "output": {"path": str(tmp_path / "x.h5")}, "cluster": {"dashboard": dashboard}},
                             file="<t>")

    with _dask_settings(job(False)):
        assert dask.config.get("distributed.admin.tick.interval") == "500ms"
        assert dask.config.get("distributed.worker.profile.enabled") is False
    with _dask_settings(job(True)):
        assert dask.config.get("distributed.worker.profile.enabled") is True
    assert dask.config.get("distributed.admin.tick.interval") != "500ms"  # only for the run


def test_prefetch_skips_what_it_cannot_read_ahead(tmp_path: Path) -> None:
    """The read-ahead hint of a batch opens regular files only, without blocking: a FIFO
    named like a sample (the decode rejects it) and a missing file are passed over."""
    import os
    import threading

    from h5batch.conversion.readahead import in_page_cache, prefetch

    (tmp_path / "a.wav").write_bytes(b"RIFF" + bytes(100))
    os.mkfifo(tmp_path / "fifo.wav")
    items = [(("a.wav",), 0, ()), (("fifo.wav", "missing.wav"), 0, ())]
    t = threading.Thread(target=prefetch, args=(str(tmp_path), items), daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive()
    assert in_page_cache(str(tmp_path / "a.wav")) in (True, None)  # just written: cached (None: cannot tell)
    assert in_page_cache(str(tmp_path / "fifo.wav")) is None
    assert in_page_cache(str(tmp_path / "missing.wav")) is None


DEAD_WRITER = """
import os, signal, sys, time
import numpy as np
from h5batch.conversion.writer_start import PendingWriter
from h5batch.writer.messages import Quit
from h5batch.writer.process import WriterGone

pending = PendingWriter(None, ())
assert pending.forked
handle = pending.get()
os.kill(handle.process.pid, signal.SIGKILL)
handle.process.join(10)
arrays = [np.zeros(1 << 20, np.float32) for _ in range(4)]  # 16 MiB: far more than a pipe holds
t = time.monotonic()
assert pending.measure({"x": (np.concatenate(arrays), arrays)}, None, True, 1.15) is None
try:
    handle.send(Quit())
except WriterGone as e:
    print("gone", e.exit_code, round(time.monotonic() - t, 1))
"""


def test_a_writer_that_died_before_its_job_fails_the_send_instead_of_hanging(tmp_path: Path) -> None:
    """The driver keeps no copy of the writer's read end: a message to a dead writer fails
    (BrokenPipeError, then WriterGone) where a big one blocked forever on the full pipe."""
    res = run.run([sys.executable, "-c", DEAD_WRITER], timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split()[:2] == ["gone", "-9"], res.stdout
