"""``H5Dataset("s3://...")`` against a real moto server on loopback: the same samples as the
local file, GETs per epoch, the node cache (shared, bounded, never serving a partial or a
replaced object's chunk) and the faults of issue 46."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")
torch = pytest.importorskip("torch")

from h5batch import generate  # noqa: E402
from h5batch.errors import ObjectChangedError  # noqa: E402
from h5batch.torch import H5Dataset, collate  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.support.run import convert_cmd, run  # noqa: E402
from tests.support.s3server import CREDS, FaultProxy, S3Server  # noqa: E402

URL = "s3://bench/p.h5"


@pytest.fixture(scope="module")
def local_file(tmp_path_factory) -> Path:
    t = tmp_path_factory.mktemp("remote-read")
    generate.make_paired_audio(t / "corpus", n_train=256, n_test=8, seconds=1.0)
    out = t / "p.h5"
    r = run(convert_cmd(REPO / "jobs" / "paired_audio.yaml", output=out, root=t / "corpus", workers=1,
                        settings=["output.chunk_bytes=131072"]), cwd=t)  # 4 samples a chunk
    assert r.returncode == 0, r.stderr
    return out


@pytest.fixture
def served(local_file, monkeypatch):
    """The file in a fresh moto server, behind a counting proxy; the AWS environment set."""
    srv = S3Server().start()
    srv.client().upload_file(str(local_file), "bench", "p.h5")
    proxy = FaultProxy(srv.endpoint)
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.endpoint)
    yield srv, proxy
    proxy.close()
    srv.stop()


def _epoch(ds: H5Dataset, loader) -> list[np.ndarray]:
    return [b["data"].numpy().copy() for b in loader]


def test_loader_over_s3_yields_the_local_samples_and_caches_per_node(served, local_file, tmp_path):
    srv, proxy = served
    remote = H5Dataset(URL, split="train", cache_dir=tmp_path / "cache")
    local = H5Dataset(local_file, split="train")
    opened = proxy.counts()["GET"]
    got = _epoch(remote, remote.loader(batch_size=16, shuffle=True, num_workers=2, seed=3))
    want = _epoch(local, local.loader(batch_size=16, shuffle=True, num_workers=2, seed=3))
    assert len(got) == len(want) == 16
    for a, b in zip(got, want):
        assert np.array_equal(a, b)
    first = proxy.counts()["GET"] - opened
    n_chunks = sum(1 for fi in remote.fields for _ in range(-(-fi.num_values // fi.chunk_len)))
    assert 0 < first <= n_chunks
    # A fresh process on the same node: metadata and chunks come from the cache.
    code = ("from h5batch.torch import H5Dataset; import sys\n"
            f"ds = H5Dataset({URL!r}, split='train', cache_dir={str(tmp_path / 'cache')!r})\n"
            "n = sum(len(b['data']) for b in ds.loader(batch_size=16, num_workers=2, seed=3))\n"
            "assert n == 256, n\n")
    before = proxy.counts()["GET"]
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert proxy.counts()["GET"] - before <= 0.05 * (first + opened)


def test_bounded_cache_stays_within_its_bound_and_serves_the_samples(served, local_file, tmp_path):
    size = local_file.stat().st_size
    fetched = []
    for epoch in range(3):  # a fresh dataset per epoch (as a new process): only the node cache is kept
        ds = H5Dataset(URL, split="train", cache_dir=tmp_path / "cache", cache_dir_bytes=size // 4)
        loader = ds.loader(batch_size=4, shuffle=True, num_workers=0, seed=1)
        loader.set_epoch(epoch)
        assert sum(len(b["data"]) for b in loader) == 256
        fetched.append(ds._object.fetched)
    # BEWARE: for this variable-length layout a quarter-file bound fetches ~2x the file an
    # epoch: a sample straddles two chunks, so a chunk is read twice an epoch at random
    # times. `h5batch bench --s3` measures the fixed-length corpus (0.75x from epoch 2).
    entries = [e for e in os.scandir(ds._object.dir) if e.is_file() and "-" in e.name and ".lock" not in e.name]
    # the bound, plus at most the ranges being fetched when it was last applied
    assert sum(e.stat().st_size for e in entries) <= size // 4 + 4 * 131072
    print("fetched per epoch / file:", [round(f / size, 2) for f in fetched])


def test_a_cache_filled_without_a_bound_shrinks_to_one_when_opened_with_it(served, local_file, tmp_path):
    size = local_file.stat().st_size
    ds = H5Dataset(URL, split="train", cache_dir=tmp_path / "cache")
    assert sum(len(b["data"]) for b in ds.loader(batch_size=16, shuffle=True, num_workers=0)) == 256

    def held() -> int:
        return sum(e.stat().st_size for e in os.scandir(ds._object.dir)
                   if e.is_file() and "-" in e.name and ".lock" not in e.name)

    assert held() > size // 2  # the whole file's chunks
    bounded = H5Dataset(URL, split="train", cache_dir=tmp_path / "cache", cache_dir_bytes=size // 4)
    assert bounded._object.dir == ds._object.dir and held() <= size // 4
    assert bounded[255]["data"].shape == ds[255]["data"].shape


def test_replaced_object_between_epochs_is_detected_never_mixed(served, local_file, tmp_path):
    srv, _ = served
    ds = H5Dataset(URL, split="train", cache_dir=tmp_path / "cache")
    loader = ds.loader(batch_size=16, shuffle=True, num_workers=0)
    assert sum(len(b["data"]) for b in loader) == 256
    data = local_file.read_bytes() + b"\0" * 16  # another version: another ETag and size
    srv.client().put_object(Bucket="bench", Key="p.h5", Body=data)
    with pytest.raises(ObjectChangedError, match="s3://bench/p.h5: the object was replaced"):
        next(iter(loader))
    fresh = H5Dataset(URL, split="train", cache_dir=tmp_path / "cache")  # its own cache entry
    assert fresh._object.dir != ds._object.dir and fresh._object.etag != ds._object.etag


def test_server_stopped_mid_epoch_and_restarted_the_loader_goes_on(served, local_file, tmp_path):
    srv, proxy = served
    ds = H5Dataset(URL, split="train", cache_dir=tmp_path / "cache", cache_dir_bytes=1, cache_bytes=1)
    want = collate(H5Dataset(local_file, split="train").__getitems__(list(range(64))))["data"]

    def restart():  # the endpoint (the proxy's port) refuses connections for ~1.5 s
        proxy.close()
        srv.stop()
        srv.start()  # moto restarts empty: the same bytes again, the same ETag
        srv.client().upload_file(str(local_file), "bench", "p.h5")
        time.sleep(0.5)
        served_again.append(FaultProxy(srv.endpoint, port=proxy.port))

    served_again: list[FaultProxy] = []
    got = []
    try:
        for i in range(0, 64, 8):
            if i == 24:
                t = threading.Thread(target=restart)
                t.start()
                time.sleep(0.3)
            got.append(collate(ds.__getitems__(list(range(i, i + 8))))["data"])
    finally:
        t.join()
        for p in served_again:
            p.close()
    assert torch.equal(torch.cat(got), want)


def test_killed_download_leaves_nothing_a_later_read_serves(served, local_file, tmp_path):
    srv, proxy = served
    cache = tmp_path / "cache"
    ds = H5Dataset(URL, split="train", cache_dir=cache)
    obj = ds._object
    chunk = next(c for c in zip(*np.load(os.path.join(obj.dir, "chunks.npy"))) if c[1] > 4096)
    slow = FaultProxy(srv.endpoint, "slow")  # GETs answered after 3 s
    env = {**os.environ, "AWS_ENDPOINT_URL": slow.endpoint}
    code = ("from h5batch.torch import H5Dataset\n"
            f"ds = H5Dataset({URL!r}, split='train', cache_dir={str(cache)!r})\n"
            f"print('go', flush=True); ds._object.read({int(chunk[0])}, {int(chunk[1])})\n")
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "go"
    time.sleep(1.0)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    slow.close()
    assert not obj.has(int(chunk[0]), int(chunk[1]))
    stale = obj.path(int(chunk[0]), int(chunk[1])) + f".tmp.{p.pid}"
    Path(stale).write_bytes(b"partial")  # as if killed between write and publish
    data = obj.read(int(chunk[0]), int(chunk[1]))  # the lock died with it: fetched again
    with open(local_file, "rb") as f:
        f.seek(int(chunk[0]))
        assert data == f.read(int(chunk[1]))
    obj.max_bytes = 1 << 40
    obj.bound()
    assert not os.path.exists(stale)


def test_a_dataloader_worker_killed_mid_download_leaves_no_chunk_served(served, local_file, tmp_path):
    srv, _ = served
    cache = tmp_path / "cache"
    obj = H5Dataset(URL, split="train", cache_dir=cache)._object  # metadata cached: the worker GETs chunks

    def published() -> set[str]:
        return {e for e in os.listdir(obj.dir) if e[0].isdigit() and ".tmp." not in e and not e.endswith(".lock")}

    before = published()
    slow = FaultProxy(srv.endpoint, "slow")  # GETs answered after 3 s
    code = ("import sys\nfrom h5batch.torch import H5Dataset\n"
            "if __name__ == '__main__':\n"
            f"    ds = H5Dataset({URL!r}, split='train', cache_dir={str(cache)!r})\n"
            "    it = iter(ds.loader(batch_size=8, shuffle=False, num_workers=1))\n"
            "    print(it._workers[0].pid, flush=True)\n"
            "    next(it)\n")
    p = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "AWS_ENDPOINT_URL": slow.endpoint},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    worker = int(p.stdout.readline())
    deadline = time.monotonic() + 30
    while slow.counts().get("GET", 0) == 0 and time.monotonic() < deadline:
        time.sleep(0.05)  # the worker's first chunk GET is in flight
    os.kill(worker, signal.SIGKILL)
    _, err = p.communicate(timeout=60)
    slow.close()
    assert p.returncode != 0 and f"DataLoader worker (pid(s) {worker}) exited unexpectedly" in err, err
    assert published() == before  # the killed download published nothing
    ds = H5Dataset(URL, split="train", cache_dir=cache)
    local = H5Dataset(local_file, split="train")
    for a, b in zip(_epoch(ds, ds.loader(batch_size=8, shuffle=False)), _epoch(local, local.loader(batch_size=8, shuffle=False)),
                    strict=True):
        assert np.array_equal(a, b)


def test_500_on_every_request_is_a_clear_error(served, tmp_path):
    srv, _ = served
    bad = FaultProxy(srv.endpoint, "500")
    try:
        t = time.monotonic()
        with pytest.raises(OSError, match=r"s3://bench/p.h5: HEAD failed after 2 tries"):
            H5Dataset(URL, split="train", cache_dir=tmp_path / "c",
                      storage_options={"endpoint_url": bad.endpoint, "retries": 2})
        assert time.monotonic() - t < 10
    finally:
        bad.close()


def test_forked_workers_read_and_a_process_that_made_requests_says_to_use_the_fork_server(served, local_file,
                                                                                          tmp_path):
    # Each case in a fresh process: whether a process made requests itself is its history
    # (a test run before this one in the same pytest worker may have).
    head = ("import numpy as np\nfrom torch.utils.data import DataLoader\n"
            "from h5batch.remote.client import ObjectClient, runtime_started\nfrom h5batch.torch import H5Dataset, collate\n")
    # The reader's main process makes its requests in the helper process: forked workers
    # (a plain DataLoader's) read, with a cache too small to hold anything.
    reads = head + (
        f"ds = H5Dataset({URL!r}, split='train', cache_dir={str(tmp_path / 'c1')!r}, cache_dir_bytes=1)\n"
        "loader = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=collate, multiprocessing_context='fork')\n"
        "got = np.concatenate([b['data'].numpy() for b in loader])\n"
        f"local = H5Dataset({str(local_file)!r}, split='train')\n"
        "assert np.array_equal(got, np.stack([local[i]['data'] for i in range(len(local))]))\n"
        "assert not runtime_started()\nprint('read', len(got))\n")
    # A process that made a request itself: its forked worker is told to use the fork server,
    # and ds.loader() does so by itself.
    refused = head + (
        f"ObjectClient({URL!r}).head()\n"
        f"ds = H5Dataset({URL!r}, split='train', cache_dir={str(tmp_path / 'c2')!r}, cache_dir_bytes=1)\n"
        "assert sum(len(b['data']) for b in ds.loader(batch_size=64, num_workers=1)) == 256\n"
        "try:\n"
        "    next(iter(DataLoader(ds, batch_size=8, num_workers=1, collate_fn=collate, multiprocessing_context='fork')))\n"
        "except RuntimeError as e:\n"
        "    print(e)\n")
    for code, want in ((reads, "read 256"), (refused, "multiprocessing_context='forkserver'")):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
        assert r.returncode == 0, r.stderr
        assert want in r.stdout


def test_a_killed_helper_process_fails_its_request_naming_the_url_and_a_new_one_serves(served, local_file,
                                                                                      tmp_path):
    from h5batch.errors import RemoteError
    from h5batch.remote import helper

    ds = H5Dataset(URL, split="train", cache_dir=tmp_path / "cache")
    h = helper.helper()
    assert h.proc.poll() is None  # the dataset's HEAD and metadata went through it
    client = ds._object.client
    os.kill(h.proc.pid, signal.SIGKILL)
    h.proc.wait()
    with pytest.raises(RemoteError, match="s3://bench/p.h5"):
        h.call(client, "head")
    got = np.concatenate([b["data"].numpy() for b in ds.loader(batch_size=64, shuffle=False)])
    assert helper.helper() is not h
    with H5Dataset(local_file, split="train") as local:
        assert np.array_equal(got, np.stack([local[i]["data"] for i in range(len(local))]))


def test_batch_samplers_orders_are_prefetched(served, local_file, tmp_path):
    from h5batch.torch import BucketingBatchSampler, GlobalBatchSampler
    from h5batch.torch.loader import make_loader

    ds = H5Dataset(URL, split="train", cache_dir=tmp_path / "cache")
    local = H5Dataset(local_file, split="train")
    for make in (lambda d: GlobalBatchSampler(d, 16, seed=2), lambda d: BucketingBatchSampler(d, max_frames=16 * 16000, seed=2)):
        got = [b["data"].numpy().copy() for b in make_loader(ds, shuffle=False, batch_sampler=make(ds))]
        want = [b["data"].numpy().copy() for b in make_loader(local, shuffle=False, batch_sampler=make(local))]
        assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert os.path.exists(os.path.join(ds._object.dir, "order.npy"))  # the prefetcher knew the order
