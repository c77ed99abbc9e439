"""What H5Dataset checks when it opens a file (h5batch/tools/index.py), on real files made by
the real converter and then damaged with h5py."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import h5py
import numpy as np
import pytest
from torch.utils.data import DataLoader

from h5batch import ConvertOptions, convert
from h5batch import format as fmt
from h5batch.config import load_job
from h5batch.errors import CorruptFileError
from h5batch.tools.index import check, offset_faults
from h5batch.torch import H5Dataset, collate

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def good(demo_root, tmp_path_factory) -> Path:
    """Labelled demo file: variable (T, 1) int16 audio (offsets and rank-2 shapes), fixed
    (64, 64, 3) images; several chunks per field."""
    out = tmp_path_factory.mktemp("reader-index") / "demo.h5"
    job = load_job(REPO / "jobs" / "demo.yaml",
                   [f"output.path={out}", f"source.root={demo_root}", "cluster.workers=1",
                    "output.chunk_bytes=65536", "fields.audio.channels=keep"])
    convert(job, ConvertOptions(progress=False))
    return out


@pytest.fixture
def copy(good, tmp_path) -> Path:
    dst = tmp_path / "copy.h5"
    shutil.copy(good, dst)
    return dst


def _offsets_decrease(g):  # two offsets overwritten: sample 4 ends before it starts
    o = g["audio/offsets"]
    o[5], o[6] = 0, 0
    return "/train/audio/offsets", 4


def _offsets_past_values(g):
    o = g["audio/offsets"]
    o[10:] = o[10:] + g["audio/values"].shape[0]  # still monotonic; sample 9 ends past the end
    return "/train/audio/offsets", 9


def _offsets_not_from_zero(g):
    o = g["audio/offsets"]
    o[0] = 1
    return "/train/audio/offsets", 0


def _label_999(g):
    g["label"][7] = 999
    return "/train/label", 7


def _negative_label(g):
    g["label"][2] = -2  # -1 means "no label" (as verify has it); below that is corrupt
    return "/train/label", 2


def _shape_row_inconsistent(g):
    s = g["audio/shapes"]
    row = s[3]
    s[3] = [row[0] + 1, row[1]]
    return "/train/audio/shapes", 3


def _shape_overflows_to_a_match(g):
    # (2**32, 2**32) is 0 in int64: an empty sample's offsets would "agree" with it
    o = g["audio/offsets"]
    o[12] = o[11]
    s = g["audio/shapes"]
    s[11] = [2**32, 2**32]
    return "/train/audio/shapes", 11


def _checksum_short(g):
    n = int(g.attrs[fmt.ATTR_NUM_SAMPLES])
    g["checksum"].resize(n - 2, axis=0)
    return "/train/checksum", n - 2


def _fixed_field_long(g):
    n = int(g.attrs[fmt.ATTR_NUM_SAMPLES])
    g["image"].resize(n + 1, axis=0)
    return "/train/image", n


def _source_short(g):
    n = int(g.attrs[fmt.ATTR_NUM_SAMPLES])
    g["source"].resize(n - 1, axis=0)
    return "/train/source", n - 1


CORRUPTIONS = [_offsets_decrease, _offsets_past_values, _offsets_not_from_zero, _label_999,
               _negative_label, _shape_row_inconsistent, _shape_overflows_to_a_match,
               _checksum_short, _fixed_field_long, _source_short]


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__.strip("_"))
def test_a_damaged_index_is_refused_naming_dataset_and_row(copy, corrupt):
    with h5py.File(copy, "r+") as f:
        where, row = corrupt(f["train"])
    with pytest.raises(CorruptFileError) as info:
        H5Dataset(copy, "train")
    err = info.value
    assert isinstance(err, ValueError)
    assert (err.where, err.row) == (where, row)
    msg = str(err)
    assert str(copy) in msg and where in msg and f"row {row}:" in msg
    assert f"h5batch verify {copy}" in msg
    # the error survives the trip from a DataLoader worker
    assert str(pickle.loads(pickle.dumps(err))) == msg


def test_a_field_not_read_only_has_its_row_count_checked(copy):
    with h5py.File(copy, "r+") as f:
        _offsets_decrease(f["train"])
    ds = H5Dataset(copy, "train", fields=["image"])  # audio's offsets are not relied on
    assert ds[4]["image"].shape == (64, 64, 3)
    ds.close()
    with h5py.File(copy, "r+") as f:
        f["train/audio/offsets"].resize(f["train"].attrs[fmt.ATTR_NUM_SAMPLES], axis=0)
    with pytest.raises(CorruptFileError, match=r"/train/audio/offsets, row \d+: has \d+ rows"):
        H5Dataset(copy, "train", fields=["image"])


def test_the_other_split_is_not_affected(copy):
    with h5py.File(copy, "r+") as f:
        _label_999(f["train"])
    ds = H5Dataset(copy, "test")
    assert len(ds) and ds[len(ds) - 1]["label"].item() < len(ds.class_names)


def test_a_good_file_reads_and_opens_lazily_per_process(good):
    ds = H5Dataset(good, "train", with_source=True)
    assert ds._file is None  # the constructor closed its handle
    with h5py.File(good, "r") as f:
        n = int(f["train"].attrs[fmt.ATTR_NUM_SAMPLES])
        labels = f["train/label"][...]
        sources = Counter(tuple(s) for s in f["train/source"].asstr()[...])
    assert len(ds) == n
    assert ds[n - 1]["label"].item() == labels[n - 1]
    loader = DataLoader(ds, batch_size=5, num_workers=2, collate_fn=collate)
    seen = Counter(src for b in loader for src in b["source"])
    assert seen == sources


def test_each_process_checks_the_arrays_it_loads(copy):
    """The constructing process checks once and keeps the arrays (forked workers share them);
    a copy that arrives without them (spawn workers unpickle one) loads and checks again."""
    ds = H5Dataset(copy, "train")
    clone = pickle.loads(pickle.dumps(ds))
    assert clone._index == {} and clone._file is None
    with h5py.File(copy, "r+") as f:
        _label_999(f["train"])
    assert ds[7]["label"].item() < len(ds.class_names)  # checked when it was built
    with pytest.raises(CorruptFileError, match=r"/train/label, row 7: label 999"):
        clone[0]


def test_a_partial_says_it_is_still_being_written(good, tmp_path):
    final = tmp_path / "x.h5"
    partial = tmp_path / "x.h5.partial"
    shutil.copy(good, partial)
    with h5py.File(partial, "r+") as f:
        f.attrs[fmt.ATTR_COMPLETE] = False
    expected = f"{partial} is still being written (or was interrupted); the finished file will be {final}"
    with pytest.raises(FileNotFoundError) as info:
        H5Dataset(partial)
    assert expected in str(info.value)
    with pytest.raises(FileNotFoundError, match="does not exist yet") as info:
        H5Dataset(final)  # only the partial is there yet
    assert expected in str(info.value)


def test_an_incomplete_final_file_says_so(copy):
    with h5py.File(copy, "r+") as f:
        f.attrs[fmt.ATTR_COMPLETE] = False
    with pytest.raises(CorruptFileError, match="not complete") as info:
        H5Dataset(copy)
    assert "rejected" in str(info.value) and f"{copy}.partial" in str(info.value)


HOLD_OPEN = """
import sys, h5py
f = h5py.File(sys.argv[1], "r+")
print("open", flush=True)
sys.stdin.read()
"""


@pytest.mark.skipif(os.environ.get("HDF5_USE_FILE_LOCKING", "").upper() == "FALSE",
                    reason="HDF5 file locking is turned off")
def test_a_file_another_process_writes_says_so(copy):
    writer = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, str(copy)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "open"
        with pytest.raises(BlockingIOError) as info:
            H5Dataset(copy)
        msg = str(info.value)
        assert f"{copy} is being written by another process" in msg
        assert "unable to lock file" not in msg  # not h5py's words
        assert isinstance(info.value.__cause__, BlockingIOError)
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)
    assert len(H5Dataset(copy)) > 0  # readable once the writer is gone


@pytest.mark.skipif(os.environ.get("HDF5_USE_FILE_LOCKING", "").upper() == "FALSE",
                    reason="HDF5 file locking is turned off")
def test_a_partial_being_written_says_it_is_a_partial(good, tmp_path):
    partial = tmp_path / "x.h5.partial"
    shutil.copy(good, partial)
    writer = subprocess.Popen([sys.executable, "-c", HOLD_OPEN, str(partial)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "open"
        with pytest.raises(FileNotFoundError, match="is still being written"):
            H5Dataset(partial)
    finally:
        writer.stdin.close()
        writer.wait(timeout=30)


def test_offsets_check_of_millions_of_samples_names_the_first_bad_one():
    """Two million offsets (a large split's index), checked whole: a good index passes, and a
    bad one near the end is reported at its row, whichever check finds it. (Its speed is
    the bench's business, not this test's.)"""
    offs = np.cumsum(np.random.default_rng(0).integers(0, 20000, 2_000_001), dtype=np.int64)
    offs[0] = 0
    check("x.h5", "/train/audio/offsets", offset_faults(offs, int(offs[-1])))
    down = offs.copy()
    down[1_999_001] = down[1_999_000] - 1  # sample 1,999,000 ends before it starts
    with pytest.raises(CorruptFileError, match="offsets decrease: sample 1999000 ") as e:
        check("x.h5", "/train/audio/offsets", offset_faults(down, int(offs[-1])))
    assert e.value.row == 1_999_000
    with pytest.raises(CorruptFileError, match="past the end of values") as e:
        check("x.h5", "/train/audio/offsets", offset_faults(offs, int(offs[-2])))  # the last sample's values missing
    assert e.value.row == 1_999_999
