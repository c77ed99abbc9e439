"""``h5batch convert DIR``, ``init DIR`` and the class_folders readings of the trees people
have (h5batch/folder_job.py, h5batch/layouts/class_folders.py), on replicas written here:
torchvision ImageFolder flat and with split folders, a Hugging Face audiofolder with
``metadata.csv``, a nested music-style corpus, mixed audio+image stems, stray files.
Every test reads the output back and checks labels, splits and fields against the tree."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from tests.support.run import clean_env, h5batch_cmd


def _png(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((6, 5, 3), value, np.uint8)).save(path)


def _wav(path: Path, n: int, rate: int = 8000) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, (np.arange(n) % 200 - 100).astype(np.int16), rate, subtype="PCM_16")


def _run(*args: str, cwd: Path, ok: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run(h5batch_cmd(*args), cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=300)
    if ok:
        assert res.returncode == 0, res.stderr
    return res


def _samples(path: Path) -> dict[str, dict[str, str]]:
    """split -> source path -> label name, read from the output."""
    out: dict[str, dict[str, str]] = {}
    with h5py.File(path, "r") as f:
        names = [n.decode() for n in f["class_names"][:]] if "class_names" in f else []
        for split in json.loads(f.attrs["splits"]):
            src = f[split]["source"][:]
            src = [s.decode() for s in (src[:, 0] if src.ndim == 2 else src)]
            labels = f[split]["label"][:] if "label" in f[split] else [-1] * len(src)
            out[split] = {s: (names[i] if i >= 0 else None) for s, i in zip(src, labels)}
    return out


def _excluded(path: Path) -> list[str]:
    with h5py.File(path, "r") as f:
        return sorted(p.decode() for p, s in zip(f["rejects/path"][:], f["rejects/stage"][:]) if s == b"excluded")


def test_imagefolder_flat_convert_dir_then_init(tmp_path: Path) -> None:
    root = tmp_path / "pets"
    for cls, n in (("cat", 3), ("dog", 2)):
        for i in range(n):
            _png(root / cls / f"{i}.png", 10 * i)
    (root / "README.md").write_text("a readme")
    (root / "LICENSE").write_text("cc-by")
    res = _run("convert", "pets", "--progress", "none", cwd=tmp_path)
    assert "2 class folders" in res.stderr and "layout: class_folders" in res.stderr
    got = _samples(tmp_path / "pets.h5")
    assert got == {"train": {"cat/0.png": "cat", "cat/1.png": "cat", "cat/2.png": "cat",
                             "dog/0.png": "dog", "dog/1.png": "dog"}}
    assert _excluded(tmp_path / "pets.h5") == ["LICENSE", "README.md"]
    with h5py.File(tmp_path / "pets.h5", "r") as f:
        assert json.loads(f.attrs["job"])["name"] == "pets"
        first = f["train/image/values"][:] if "values" in f["train/image"] else f["train/image"][:]
    # init prints the same job: converting it gives the same values.
    job = _run("init", "pets", "--output", "again.h5", cwd=tmp_path).stdout
    (tmp_path / "pets.yaml").write_text(job)
    _run("convert", "pets.yaml", "--progress", "none", cwd=tmp_path)
    assert _samples(tmp_path / "again.h5") == got
    with h5py.File(tmp_path / "again.h5", "r") as f:
        again = f["train/image/values"][:] if "values" in f["train/image"] else f["train/image"][:]
    np.testing.assert_array_equal(first, again)
    # verify --sources re-decodes from the job stored in the output.
    _run("verify", "pets.h5", "--sources", cwd=tmp_path)


def test_imagefolder_with_split_folders_keeps_their_names(tmp_path: Path) -> None:
    root = tmp_path / "birds"
    for split in ("Train", "Val"):
        for cls in ("owl", "tit", "wren"):
            _png(root / split / cls / f"{split}{cls}.png", 1)
    _run("convert", "birds", "--output", "b.h5", "--progress", "none", cwd=tmp_path)
    got = _samples(tmp_path / "b.h5")
    assert sorted(got) == ["Train", "Val"]
    assert got["Val"] == {f"Val/{c}/Val{c}.png": c for c in ("owl", "tit", "wren")}


def test_flat_imagefolder_with_a_hash_split(tmp_path: Path) -> None:
    root = tmp_path / "c"
    for i in range(40):
        _png(root / ("a" if i % 2 else "b") / f"{i}.png", i)
    _run("convert", "c", "--set", "source.split.hash.val=0.3", "--progress", "none", cwd=tmp_path)
    got = _samples(tmp_path / "c.h5")
    assert sorted(got) == ["train", "val"] and sum(map(len, got.values())) == 40
    assert all(lab == path.split("/")[0] for s in got.values() for path, lab in s.items())


def test_audiofolder_with_metadata_csv(tmp_path: Path) -> None:
    root = tmp_path / "speech"
    rows = [("a.wav", "hello there", 7, 0.5), ("b.wav", "good bye", 9, 1.25), ("c.wav", "yes", 7, 2.0)]
    for i, (name, *_rest) in enumerate(rows):
        _wav(root / name, 100 + i)
    (root / "metadata.csv").write_text("file_name,transcription,speaker_id,score\n"
                                       + "".join(f"{n},{t},{s},{x}\n" for n, t, s, x in rows))
    res = _run("init", "speech", cwd=tmp_path)
    assert "metadata.csv" in res.stdout and "transcription" in res.stdout
    _run("convert", "speech", "--progress", "none", cwd=tmp_path)
    with h5py.File(tmp_path / "speech.h5", "r") as f:
        g = f["train"]
        assert [s.decode() for s in g["source"][:]] == ["a.wav", "b.wav", "c.wav"]
        assert g["speaker_id"][:].tolist() == [7, 9, 7]
        assert g["score"][:].tolist() == [0.5, 1.25, 2.0]
        text = g["transcription"]
        got = [bytes(text["values"][a:b]).decode() for a, b in zip(text["offsets"][:-1], text["offsets"][1:])]
        assert got == ["hello there", "good bye", "yes"]
        assert [int(n) for n in np.diff(g["audio/offsets"][:])] == [100, 101, 102]


def test_nested_corpus_is_refused_then_read_with_nested(tmp_path: Path) -> None:
    # Music-corpus style: dataset folders, files 1-3 folders below them.
    root = tmp_path / "music"
    _wav(root / "gtzan" / "a.wav", 50)
    _wav(root / "gtzan" / "rock" / "b.wav", 51)
    _wav(root / "medley" / "2018" / "x" / "c.wav", 52)
    res = _run("convert", "music", "--progress", "none", cwd=tmp_path, ok=False)
    assert res.returncode == 2 and "varying depths" in res.stderr and "source.nested" in res.stderr
    assert not (tmp_path / "music.h5").exists() and not list(tmp_path.glob("music.h5*"))
    _run("convert", "music", "--set", "source.nested=true", "--progress", "none", cwd=tmp_path)
    assert _samples(tmp_path / "music.h5") == {"train": {"gtzan/a.wav": "gtzan", "gtzan/rock/b.wav": "gtzan",
                                                         "medley/2018/x/c.wav": "medley"}}


def test_top_folders_mixing_split_names_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "m"
    _png(root / "train" / "cat" / "1.png", 1)
    _png(root / "extra" / "cat" / "2.png", 2)
    res = _run("convert", "m", "--progress", "none", cwd=tmp_path, ok=False)
    assert res.returncode == 2 and "mix split names (train)" in res.stderr and "extra" in res.stderr


def test_explicit_class_folders_refuses_more_splits_than_classes(tmp_path: Path) -> None:
    root = tmp_path / "d"
    for ds in ("ds1", "ds2", "ds3"):
        _png(root / ds / "song" / "1.png", 1)
    job = tmp_path / "j.yaml"
    job.write_text(f"source: {{root: {root}, layout: class_folders}}\nfields: {{image: {{type: image}}}}\n"
                   f"output: {{path: {tmp_path / 'd.h5'}}}\n")
    res = _run("convert", str(job), "--progress", "none", cwd=tmp_path, ok=False)
    assert res.returncode == 2 and "3 split folders" in res.stderr and "source.split_folders" in res.stderr
    _run("convert", str(job), "--set", "source.splits=[ds1,ds2,ds3]", "--progress", "none", cwd=tmp_path)
    assert sorted(_samples(tmp_path / "d.h5")) == ["ds1", "ds2", "ds3"]


def test_audio_and_image_paired_by_stem_or_majority(tmp_path: Path) -> None:
    root = tmp_path / "av"
    for cls in ("x", "y"):
        for i in range(3):
            _wav(root / cls / f"{i}.wav", 40 + i)
            _png(root / cls / f"{i}.png", i)
    _run("convert", "av", "--progress", "none", cwd=tmp_path)
    with h5py.File(tmp_path / "av.h5", "r") as f:
        assert {"audio", "image"} <= set(f["train"]) and f["train/label"].shape == (6,)
    # Few shared stems: the majority kind, the rest excluded.
    root2 = tmp_path / "mostly_audio"
    for i in range(4):
        _wav(root2 / "k" / f"{i}.wav", 40)
    _png(root2 / "k" / "cover.png", 1)
    res = _run("convert", "mostly_audio", "--progress", "none", cwd=tmp_path)
    assert "the 1 image files are excluded" in res.stderr
    assert _excluded(tmp_path / "mostly_audio.h5") == ["k/cover.png"]
    assert len(_samples(tmp_path / "mostly_audio.h5")["train"]) == 4


def test_a_folder_without_media_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("x")
    res = _run("convert", "docs", cwd=tmp_path, ok=False)
    assert res.returncode == 2 and "no audio" in res.stderr and "among 1 files" in res.stderr


@pytest.mark.parametrize("layout", ["sync", "init"])
def test_other_commands_take_the_folder(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "s"
    _png(root / "a" / "1.png", 1)
    _png(root / "b" / "2.png", 2)
    if layout == "sync":
        _run("convert", "s", "--progress", "none", cwd=tmp_path)
        _png(root / "b" / "3.png", 3)
        _run("sync", "s", "--progress", "none", cwd=tmp_path)
        assert _samples(tmp_path / "s.h5")["train"] == {"a/1.png": "a", "b/2.png": "b", "b/3.png": "b"}
    else:
        out = _run("init", "s", cwd=tmp_path).stdout
        assert "split_folders: false" in out and out.startswith("# The job h5batch uses for")


def test_a_text_file_named_mp3_is_said_to_be_text(tmp_path: Path) -> None:
    root = tmp_path / "t"
    _wav(root / "a" / "ok.wav", 80)
    (root / "a" / "fake.mp3").write_text("this is not audio\n")
    _run("convert", "t", "--set", "policy.max_reject_fraction=1.0", "--progress", "none", cwd=tmp_path)
    with h5py.File(tmp_path / "t.h5", "r") as f:
        reasons = dict(zip(f["rejects/path"].asstr()[...], f["rejects/reason"].asstr()[...]))
    assert reasons == {"a/fake.mp3": "not an audio file: its content looks like text"}


def test_limit_is_a_spread_trial_and_a_later_full_run_needs_overwrite(tmp_path: Path) -> None:
    root = tmp_path / "lim"
    for split in ("train", "test"):
        for cls in ("a", "b", "c", "d"):
            for i in range(8 if split == "train" else 3):
                _png(root / split / cls / f"{i}.png", i)
    _run("convert", "lim", "--limit", "20", "--progress", "none", cwd=tmp_path)
    got = _samples(tmp_path / "lim.h5")
    assert sum(map(len, got.values())) == 20
    for split in ("train", "test"):
        assert {lab for lab in got[split].values()} == {"a", "b", "c", "d"}
    # Evenly spaced within a class, not its first files.
    assert sorted(p for p, lab in got["train"].items() if lab == "a") != [f"train/a/{i}.png" for i in range(3)]
    excluded = _excluded(tmp_path / "lim.h5")
    assert len(excluded) == 4 * 8 + 4 * 3 - 20
    with h5py.File(tmp_path / "lim.h5", "r") as f:
        assert json.loads(f.attrs["job"])["source"]["limit"] == 20
        reasons = set(f["rejects/reason"].asstr()[...])
    assert reasons == {"left out by --limit 20 (source.limit)"}
    res = _run("convert", "lim", "--progress", "none", cwd=tmp_path, ok=False)
    assert res.returncode != 0 and "--overwrite" in res.stderr
    _run("convert", "lim", "--overwrite", "--progress", "none", cwd=tmp_path)
    assert sum(map(len, _samples(tmp_path / "lim.h5").values())) == 44


def test_dry_run_writes_nothing_and_reports_the_plan(tmp_path: Path) -> None:
    root = tmp_path / "dr"
    for cls in ("a", "b"):
        for i in range(5):
            _png(root / cls / f"{i}.png", i)
    (root / "notes.txt").write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    res = _run("convert", "dr", "--dry-run", "--json", cwd=tmp_path)
    report = json.loads(res.stdout)
    assert report["samples"] == 10 and report["splits"] == {"train": {"a": 5, "b": 5}}
    assert report["excluded"] == 1 and report["codecs"] == {"image": "none"}
    assert report["estimated_bytes"] == 10 * 6 * 5 * 3
    assert "nothing written" in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    # A generated corpus is not generated by a dry run.
    job = tmp_path / "gen.yaml"
    job.write_text(f"source: {{root: {tmp_path / 'gen'}, layout: class_folders, generate: demo}}\n"
                   "fields: {image: {type: image, extensions: [.png]}}\n"
                   f"output: {{path: {tmp_path / 'gen.h5'}}}\n")
    res = _run("convert", str(job), "--dry-run", "--json", cwd=tmp_path)
    assert json.loads(res.stdout)["would_generate"]["corpus"] == "demo"
    assert not (tmp_path / "gen").exists() and not list(tmp_path.glob("gen.h5*"))


def test_sample_rates_are_never_lost(tmp_path: Path) -> None:
    # One rate: the output says it (the job, as written, says nothing).
    root = tmp_path / "one"
    for i in range(4):
        _wav(root / "k" / f"{i}.wav", 100, rate=22050)
    _run("convert", "one", "--progress", "none", cwd=tmp_path)
    with h5py.File(tmp_path / "one.h5", "r") as f:
        assert f["train/audio"].attrs["sample_rate"] == 22050
        assert "sample_rate" not in json.loads(f.attrs["job"])["fields"]["audio"] or \
            json.loads(f.attrs["job"])["fields"]["audio"]["sample_rate"] is None
    _run("preview", "one.h5", "--html", "pv", cwd=tmp_path)
    # Mixed rates: refused before anything is written, naming the key and the way out.
    mixed = tmp_path / "mixed"
    for i in range(6):
        _wav(mixed / "k" / f"{i}.wav", 100, rate=8000 if i % 2 else 44100)
    res = _run("convert", "mixed", "--progress", "none", cwd=tmp_path, ok=False)
    assert res.returncode == 2 and "fields.audio.sample_rate" in res.stderr
    assert "8000 Hz, 44100 Hz" in res.stderr and "resample" in res.stderr
    assert not list(tmp_path.glob("mixed.h5*"))
    _run("convert", "mixed", "--set", "fields.audio.sample_rate=16000", "--set", "fields.audio.resample=true",
         "--progress", "none", cwd=tmp_path)
    with h5py.File(tmp_path / "mixed.h5", "r") as f:
        assert f["train/audio"].attrs["sample_rate"] == 16000 and f["train/source"].shape == (6,)


def test_max_seconds_crops_and_keeps_variable_lengths(tmp_path: Path) -> None:
    root = tmp_path / "crop"
    lengths = {"a/short.wav": 3000, "a/long.wav": 20000, "b/exact.wav": 8000, "b/huge.wav": 4_600_000}
    for rel, n in lengths.items():
        _wav(root / rel, n)  # 8 kHz; huge.wav (9.2 MB) streams into shared memory
    (root / "b" / "x.flac").parent.mkdir(exist_ok=True)
    sf.write(root / "b" / "x.flac", (np.arange(30000) % 200 - 100).astype(np.int16), 8000)
    lengths["b/x.flac"] = 30000
    _run("convert", "crop", "--set", "fields.audio.max_seconds=1", "--progress", "none", cwd=tmp_path)
    with h5py.File(tmp_path / "crop.h5", "r") as f:
        g = f["train"]
        src = list(g["source"].asstr()[...])
        got = dict(zip(src, np.diff(g["audio/offsets"][:]).tolist()))
        assert "first 1 s" in g["audio"].attrs["length_rule"]
        values = g["audio/values"]
        offsets = g["audio/offsets"][:]
        first = values[offsets[src.index("a/long.wav")]: offsets[src.index("a/long.wav") + 1]]
    assert got == {rel: min(n, 8000) for rel, n in lengths.items()}
    np.testing.assert_array_equal(first, (np.arange(8000) % 200 - 100).astype(np.int16))
    res = _run("convert", "crop", "--set", "fields.audio.max_seconds=1", "--set", "fields.audio.length=100",
               "--overwrite", cwd=tmp_path, ok=False)
    assert res.returncode == 2 and "give one of length" in res.stderr


def _storage(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, o.id.get_storage_size()) if isinstance(o, h5py.Dataset) else None)
    return out


def test_no_dead_space_small_columns_and_mostly_rejected_runs(tmp_path: Path) -> None:
    root = tmp_path / "small"
    rows = []
    for i in range(200):
        _wav(root / f"{i}.wav", 800)
        rows.append(f"{i}.wav,{i % 7},{i * 0.5},word{i}\n")
    (root / "metadata.csv").write_text("file_name,speaker,score,text\n" + "".join(rows))
    _run("convert", "small", "--progress", "none", cwd=tmp_path)
    sizes = _storage(tmp_path / "small.h5")
    small = {n: b for n, b in sizes.items() if n.startswith("train/") and n != "train/audio/values"}
    assert len(small) == 9 and max(small.values()) <= 64 << 10, small
    assert sizes["train/audio/values"] <= 1.15 * 200 * 1600
    # ~90 % rejects: the file stays near its data (+ HDF5's and h5batch's own metadata).
    bad = tmp_path / "bad"
    for i in range(100):
        if i % 10 == 0:
            _wav(bad / "k" / f"{i}.wav", 20000)
        else:
            (bad / "k" / f"{i}.wav").write_bytes(b"RIFF" + bytes(40))
    _run("convert", "bad", "--set", "policy.max_reject_fraction=1.0", "--progress", "none", cwd=tmp_path)
    data = 10 * 20000 * 2
    assert (tmp_path / "bad.h5").stat().st_size <= 1.25 * data + (2 << 20)


def test_files_without_class_folders_have_no_labels(tmp_path: Path) -> None:
    flat = tmp_path / "flat"
    for i in range(3):
        _wav(flat / f"{i}_x.wav", 50 + i)
    _run("convert", "flat", "--progress", "none", cwd=tmp_path)
    assert _samples(tmp_path / "flat.h5") == {"train": {f"{i}_x.wav": None for i in range(3)}}
    split = tmp_path / "split"
    for s in ("train", "test"):
        _wav(split / s / f"{s}.wav", 60)
    _run("convert", "split", "--progress", "none", cwd=tmp_path)
    assert _samples(tmp_path / "split.h5") == {"test": {"test/test.wav": None}, "train": {"train/train.wav": None}}


def test_length_pads_and_keeps_the_true_lengths(tmp_path: Path) -> None:
    from h5batch.torch import H5Dataset

    root = tmp_path / "pad"
    frames = {"a/short.wav": 3000, "a/long.wav": 12000, "b/huge.wav": 4_600_000}  # huge streams
    for rel, n in frames.items():
        _wav(root / rel, n)
    sf.write(root / "b" / "x.flac", (np.arange(7000) % 200 - 100).astype(np.int16), 8000)
    frames["b/x.flac"] = 7000
    _run("convert", "pad", "--set", "fields.audio.length=8000", "--progress", "none", cwd=tmp_path)
    want = {rel: min(n, 8000) for rel, n in frames.items()}
    with h5py.File(tmp_path / "pad.h5", "r") as f:
        got = dict(zip(f["train/source"].asstr()[...], f["train/audio_lengths"][...].tolist()))
        assert f["train/audio"].shape == (4, 8000) and "audio_lengths" not in json.loads(f.attrs["job"])["fields"]
    assert got == want
    ds = H5Dataset(tmp_path / "pad.h5", "train", with_source=True)
    batch = next(iter(ds.loader(batch_size=4)))
    assert dict(zip(batch["source"], batch["audio_lengths"].tolist())) == want
    _run("verify", "pad.h5", "--sources", cwd=tmp_path)
    i = list(got).index("a/short.wav")  # the file's row order
    shown = _run("inspect", "pad.h5", "--sample", str(i), cwd=tmp_path).stdout
    assert "shape (8000,) int16" in shown and "0.375 s at 8000 Hz" in shown  # 3000 true frames
