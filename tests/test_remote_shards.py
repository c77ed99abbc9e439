"""A sharded output (``output.writers: 2``) on object storage, against a real moto server on
loopback: the shards upload first and ``OUT.h5`` last, a rerun uploads only what is missing,
the reader on ``s3://.../OUT.h5`` yields the local sharded file's samples, and a missing
shard object is an error naming its URL."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")
pytest.importorskip("torch")

from h5batch.errors import CorruptFileError  # noqa: E402
from h5batch.torch import H5Dataset  # noqa: E402
from tests.conftest import REPO  # noqa: E402
from tests.support.run import convert_cmd, h5batch_cmd, run  # noqa: E402
from tests.support.s3server import CREDS, server_fixture  # noqa: E402

s3 = pytest.fixture(scope="module")(server_fixture)
JOB = REPO / "jobs" / "paired_audio.yaml"
URL = "s3://bench/sh/paired.h5"
SHARDS = ["sh/paired.shard-0-of-2.h5", "sh/paired.shard-1-of-2.h5"]
TWO = ["output.writers=2", "output.chunk_bytes=65536"]  # several chunks per shard


def _convert(s3, root, cache, cwd, output=URL):
    env = {**s3.env(), "H5BATCH_CACHE_DIR": str(cache)}
    return run(convert_cmd(JOB, output=output, root=root, workers=1, settings=TWO), env=env, cwd=cwd)


def _same(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        x, y = a[k], b[k]
        if hasattr(x, "padded"):
            x, y = x.padded, y.padded
        assert np.array_equal(np.asarray(x), np.asarray(y)), k


def test_sharded_output_on_s3_uploads_shards_first_and_reads_as_the_local_one(s3, paired_root, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    r = _convert(s3, paired_root, cache, tmp_path)
    assert r.returncode == 0, r.stderr
    ups = [line for line in r.stderr.splitlines() if line.startswith("uploading")]
    assert [u.rsplit(" to ", 1)[1] for u in ups] == [f"s3://bench/{k}" for k in SHARDS] + [URL]  # OUT.h5 last
    assert {"sh/paired.h5", *SHARDS} <= set(s3.keys()) and s3.uploads() == []
    again = _convert(s3, paired_root, cache, tmp_path)
    assert again.returncode == 0 and "already uploaded" in again.stderr and "uploading" not in again.stderr

    # Killed after the first shard's upload: the rerun uploads the second shard and OUT.h5 only.
    for key in ("sh/paired.h5", SHARDS[1]):
        s3.client().delete_object(Bucket="bench", Key=key)
    resumed = _convert(s3, paired_root, cache, tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert SHARDS[0] not in resumed.stderr and SHARDS[1] in resumed.stderr and f"to {URL}" in resumed.stderr

    local = tmp_path / "local.h5"
    r2 = run(convert_cmd(JOB, output=local, root=paired_root, workers=1, settings=TWO), cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr
    for k, v in {**CREDS, "AWS_ENDPOINT_URL": s3.endpoint}.items():
        monkeypatch.setenv(k, v)
    for split in ("train", "test"):
        remote = H5Dataset(URL, split, cache_dir=tmp_path / "read-cache")
        mine = H5Dataset(local, split)
        assert remote._shards is not None and len(remote) == len(mine) > 0
        for i in range(len(mine)):
            _same(remote[i], mine[i])
        loader = remote.loader(batch_size=5, seed=2)  # shuffled: a prefetcher per shard
        got, want = list(loader), list(mine.loader(batch_size=5, seed=2))
        assert type(loader._prefetcher).__name__ == "ShardPrefetch"
        assert all(p._object.gets for p in remote._shards.parts)  # each shard read from its own object
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            _same(a, b)

    # Forked DataLoader workers read the shard objects themselves (a fresh process: whether a
    # process made requests itself is its history).
    code = ("import numpy as np\nfrom h5batch.torch import H5Dataset\n"
            f"ds = H5Dataset({URL!r}, 'train', cache_dir={str(tmp_path / 'fork-cache')!r})\n"
            "got = np.concatenate([b['data'].numpy() for b in ds.loader(batch_size=4, shuffle=False, num_workers=2)])\n"
            f"mine = H5Dataset({str(local)!r}, 'train')\n"
            "assert np.array_equal(got, np.stack([mine[i]['data'] for i in range(len(mine))]))\nprint('read', len(got))\n")
    forked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert forked.returncode == 0 and "read 24" in forked.stdout, forked.stderr

    env = {**s3.env(), "H5BATCH_CACHE_DIR": str(tmp_path / "tool-cache")}
    v = run(h5batch_cmd("verify", URL), env=env, cwd=tmp_path)  # on local copies, the shards' linked beside
    assert v.returncode == 0 and ": OK: " in v.stderr, v.stdout + v.stderr

    s3.client().put_object(Bucket="bench", Key=SHARDS[1], Body=b"not the shard")  # another size
    with pytest.raises(CorruptFileError, match=f"shard s3://bench/{SHARDS[1]}: 13 bytes, the output recorded"):
        H5Dataset(URL, "train", cache_dir=tmp_path / "read-cache")
    s3.client().delete_object(Bucket="bench", Key=SHARDS[1])
    with pytest.raises(FileNotFoundError, match=f"its shard s3://bench/{SHARDS[1]} is missing"):
        H5Dataset(URL, "train", cache_dir=tmp_path / "read-cache")
    gone = run(h5batch_cmd("verify", URL), env=env, cwd=tmp_path)
    assert gone.returncode == 1 and f"s3://bench/{SHARDS[1]}: no such object: a shard of {URL}" in gone.stderr
