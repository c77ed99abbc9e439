"""Views (h5batch.tools.views, ``h5batch view``, ``H5Dataset(view=...)``) on real converted files:
a view reads exactly its rows, its chunk groups keep samplers chunk-local, verify catches a
bad view, the command works, and a failed write leaves the file as it was."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from h5batch.cli import main
from h5batch.conversion.lock import OutputLock
from h5batch.errors import ConvertError, CorruptFileError
from h5batch.tools import views
from h5batch.tools.verify import verify_file
from h5batch.torch import ChunkShuffleSampler, H5Dataset, collate
from tests.test_reader import demo  # noqa: F401  -- module fixture: a real converted file


@pytest.fixture
def out(demo, tmp_path):  # noqa: F811
    """A private copy of the demo file (views are written into it)."""
    p = tmp_path / "demo.h5"
    shutil.copy(demo[0], p)
    return str(p)


def digest(path: str) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def labels(path: str, split: str = "train") -> np.ndarray:
    with h5py.File(path, "r") as f:
        return f[split]["label"][...]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_view_reads_exactly_its_rows(out, workers):
    n = views.add_view(out, "circles", "train", where='label == "circle" or index % 7 == 3')
    lab = labels(out)
    rows = np.flatnonzero((lab == 0) | (np.arange(len(lab)) % 7 == 3))
    assert n == len(rows) > 0
    full = H5Dataset(out, "train", with_source=True)
    ds = H5Dataset(out, "train", with_source=True, view="circles")
    assert len(ds) == n and "view='circles'" in repr(ds)
    for i, r in enumerate(rows.tolist()):
        a, b = ds[i], full[r]
        assert a["source"] == b["source"] and torch.equal(a["image"], b["image"])
        assert torch.equal(a["audio"], b["audio"]) and int(a["label"]) == lab[r]
    # Chunk groups of the view follow the file's: a group never spans two file chunk groups.
    starts = ds.chunk_starts()
    file_group = np.searchsorted(full.chunk_starts(), rows, side="right")
    assert starts[0] == 0 and np.all(np.diff(starts) > 0)
    for lo, hi in zip(starts, [*starts[1:], n], strict=True):
        assert len(set(file_group[lo:hi].tolist())) == 1
    assert len(starts) == len(set(file_group.tolist()))
    # Through a sampler and real DataLoader workers: every row of the view once.
    loader = DataLoader(ds, batch_size=4, sampler=ChunkShuffleSampler(ds, seed=1), collate_fn=collate,
                        num_workers=workers)
    got = [s for b in loader for s in b["source"]]
    assert sorted(got) == sorted(full[r]["source"] for r in rows.tolist())


def test_a_file_without_views_reads_and_a_missing_view_is_named(out):
    assert views.list_views(out) == {"train": {}, "test": {}}
    assert len(H5Dataset(out, "train")) == len(labels(out))
    views.add_view(out, "few", "train", rows=[3, 1, 1, 2])
    assert views.list_views(out)["train"] == {"few": 3}
    with pytest.raises(KeyError, match="no view 'nope' .*views: few"):
        H5Dataset(out, "train", view="nope")
    with pytest.raises(IndexError, match="view 'few'"):
        H5Dataset(out, "train", view="few")[3]


def test_verify_keeps_good_views_and_catches_bad_ones(out):
    views.add_view(out, "fold0", "train", where="index % 5 == 0")
    assert verify_file(out).ok
    n = len(labels(out))
    for name, rows in (("unsorted", [4, 2]), ("repeated", [1, 1]), ("outside", [0, n])):
        with h5py.File(out, "r+") as f:  # damage made on purpose, outside h5batch
            f["train"]["views"].create_dataset(name, data=np.array(rows, dtype=np.int64))
        problems = [str(p) for p in verify_file(out).problems]
        assert any(f"train/views/{name}" in p for p in problems), problems
        with pytest.raises(CorruptFileError, match=f"views/{name}"):
            H5Dataset(out, "train", view=name)
        with h5py.File(out, "r+") as f:
            del f["train"]["views"][name]
    assert verify_file(out).ok and len(H5Dataset(out, "train", view="fold0")) == -(-n // 5)


def test_the_view_command(out, tmp_path, capsys):
    rows_file = tmp_path / "rows.txt"
    rows_file.write_text("# fold rows\n5, 2\n9\n")
    assert main(["view", "add", out, "mine", "--rows", str(rows_file)]) == 0
    assert main(["view", "add", out, "tri", "--split", "test", "--where", 'label in ["triangle"]']) == 0
    assert main(["view", "list", out]) == 0
    listed = capsys.readouterr().out
    assert "train/mine\t3" in listed and "test/tri\t" in listed
    assert H5Dataset(out, "train", view="mine")._rows.tolist() == [2, 5, 9]
    assert main(["view", "add", out, "mine", "--where", "index < 2"]) == 2  # exists
    assert "already has a view 'mine'" in capsys.readouterr().err
    assert main(["view", "add", out, "mine", "--where", "index < 2", "--overwrite"]) == 0
    assert main(["view", "add", out, "x", "--where", "colour == 1"]) == 2
    assert "'colour'" in capsys.readouterr().err
    assert main(["view", "add", out, "x", "--where", "label == 'dragon'"]) == 2
    assert "no class 'dragon'" in capsys.readouterr().err
    assert main(["view", "add", out, "x", "--where", "audio.length > 16000"]) == 0
    with h5py.File(out, "r") as f:
        long = np.flatnonzero(f["train"]["audio"]["shapes"][:, 0] > 16000)
    assert H5Dataset(out, "train", view="x")._rows.tolist() == long.tolist()
    assert main(["view", "remove", out, "mine"]) == 0
    assert main(["view", "remove", out, "mine"]) == 2
    assert main(["view", "list", out, "--json"]) == 0
    assert '"x"' in capsys.readouterr().out
    assert main(["view", "add", str(tmp_path / "none.h5"), "a", "--where", "index < 1"]) == 2


def test_a_failed_write_leaves_the_file_as_it_was(out):
    views.add_view(out, "keep", "train", where="index < 4")
    before = digest(out)

    def crash(g):
        g.require_group("views").create_dataset("half", data=np.arange(3))
        raise RuntimeError("power cut")

    with pytest.raises(RuntimeError, match="power cut"):
        views._rewrite(out, "train", crash)
    assert digest(out) == before
    assert not any(p.name.endswith(views.TMP_SUFFIX) for p in Path(out).parent.iterdir())
    open(out + views.TMP_SUFFIX, "wb").write(b"stale copy of a run that died")
    views.add_view(out, "next", "train", where="index < 2")  # a stale copy is replaced
    assert set(views.list_views(out)["train"]) == {"keep", "next"} and verify_file(out).ok


def test_a_view_is_not_written_while_another_run_owns_the_output(out):
    lock = OutputLock.acquire(out, "other-run", lambda _m: None)
    try:
        with pytest.raises(ConvertError, match="is being written"):
            views.add_view(out, "v", "train", where="index < 3")
    finally:
        lock.release()
    assert views.list_views(out)["train"] == {}
