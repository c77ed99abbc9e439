"""``h5batch convert --output s3://...``: built in the staging folder, then uploaded to a
real moto server on loopback; the key is the commit."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

pytest.importorskip("obstore")
pytest.importorskip("moto")

from tests.conftest import REPO  # noqa: E402
from tests.support.run import convert_cmd, h5batch_cmd, run  # noqa: E402
from tests.support.s3server import FaultProxy, server_fixture  # noqa: E402

s3 = pytest.fixture(scope="module")(server_fixture)
JOB = REPO / "jobs" / "paired_audio.yaml"
URL = "s3://bench/out/paired.h5"


def _convert(s3, root: Path, cache: Path, cwd: Path, *extra: str, endpoint: str | None = None, url: str = URL):
    env = {**s3.env(endpoint), "H5BATCH_CACHE_DIR": str(cache)}
    return run(convert_cmd(JOB, *extra, output=url, root=root, workers=1), env=env, cwd=cwd)


def _values(path: Path) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: out.__setitem__(name, obj[...]) if isinstance(obj, h5py.Dataset) else None)
    return out


def test_convert_to_s3_uploads_the_local_result_once(s3, paired_root, tmp_path):
    cache = tmp_path / "cache"
    r = _convert(s3, paired_root, cache, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "uploading" in r.stderr and URL in r.stderr
    assert "out/paired.h5" in s3.keys() and s3.uploads() == []
    assert not (tmp_path / "s3:").exists()  # a URL is never a local folder
    got = tmp_path / "got.h5"
    s3.client().download_file("bench", "out/paired.h5", str(got))
    local = tmp_path / "local.h5"
    r2 = run(convert_cmd(JOB, output=local, root=paired_root, workers=1), cwd=tmp_path)
    assert r2.returncode == 0, r2.stderr
    a, b = _values(got), _values(local)
    skip = {k for k in a if "inventory" in k}  # stat times of the runs
    assert sorted(a) == sorted(b)
    for k in sorted(set(a) - skip):
        assert np.array_equal(a[k], b[k]), k
    staged = cache / "staging" / "bench" / "out" / "paired.h5"
    assert staged.exists() and staged.stat().st_size == got.stat().st_size

    again = _convert(s3, paired_root, cache, tmp_path)  # already complete: nothing uploaded
    assert again.returncode == 0 and "already uploaded" in again.stderr

    fresh = _convert(s3, paired_root, tmp_path / "other-cache", tmp_path)  # not ours: refused
    assert fresh.returncode == 2 and f"{URL} already exists; pass --overwrite" in fresh.stderr
    over = _convert(s3, paired_root, tmp_path / "other-cache", tmp_path, "--overwrite")
    assert over.returncode == 0, over.stderr
    assert "uploading" in over.stderr


def test_failed_upload_leaves_no_object_and_a_rerun_uploads(s3, paired_root, tmp_path):
    url = "s3://bench/out/failed.h5"
    proxy = FaultProxy(s3.endpoint, "500-put")
    try:
        r = _convert(s3, paired_root, tmp_path / "cache", tmp_path, endpoint=proxy.endpoint, url=url)
    finally:
        proxy.close()
    assert r.returncode == 1
    # the rejects file goes first, the .h5 last: the first PUT fails, naming its URL
    assert "s3://bench/out/failed.rejects.jsonl: PUT of" in r.stderr and "failed after 10 tries" in r.stderr
    assert "testing-secret" not in r.stderr
    assert "out/failed.h5" not in s3.keys() and s3.uploads() == []
    again = _convert(s3, paired_root, tmp_path / "cache", tmp_path, url=url)  # the local build is kept
    assert again.returncode == 0, again.stderr
    assert "already complete" in again.stderr and "uploading" in again.stderr
    assert "out/failed.h5" in s3.keys()


def test_tools_read_an_object_and_refuse_to_change_it(s3, paired_root, tmp_path):
    url = "s3://bench/out/tools.h5"
    cache = tmp_path / "cache"
    assert _convert(s3, paired_root, cache, tmp_path, url=url).returncode == 0
    env = {**s3.env(), "H5BATCH_CACHE_DIR": str(cache)}
    v = run(h5batch_cmd("verify", url), env=env, cwd=tmp_path)
    assert v.returncode == 0 and ": OK: " in v.stderr, v.stderr
    i = run(h5batch_cmd("inspect", url, "--json"), env=env, cwd=tmp_path)
    assert i.returncode == 0 and '"train"' in i.stdout
    copies = list((cache / "objects").glob("*/whole.h5"))
    assert len(copies) == 1  # one download per node and version
    for args in (["compact", url], ["view", "add", url, "odd", "--split", "train", "--rows", "1"]):
        r = run(h5batch_cmd(*args), env=env, cwd=tmp_path)
        assert r.returncode == 2 and "cannot change an object in place" in r.stderr, (args, r.stderr)
    s = run(h5batch_cmd("sync", str(JOB), "--set", f"source.root={paired_root}", "--output", url), env=env, cwd=tmp_path)
    assert s.returncode == 2 and "cannot change an object in place" in s.stderr
