"""Annotation tables, split rules and exclusions at discovery, and the text / value /
multilabel field kinds they feed, through to a real conversion and back."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import soundfile as sf

from h5batch import ConvertOptions, convert
from h5batch.config import job_from_dict
from h5batch.errors import ConfigError
from h5batch.layouts import discover, resolved_job
from h5batch.layouts.splits import fraction

AUDIO = {"type": "audio", "extensions": [".wav"], "sample_rate": 8000}


def _job(root: Path, source: dict, fields: dict | None = None, **extra):
    return job_from_dict({"source": {"root": str(root), **source}, "fields": fields or {"audio": AUDIO},
                          "output": {"path": str(root.parent / f"{root.name}.h5")}, "cluster": {"workers": 1},
                          **extra}, "test.yaml")


def _wav(path: Path, n: int = 400, seed: int = 0) -> np.ndarray:
    path.parent.mkdir(parents=True, exist_ok=True)
    x = (np.random.default_rng(seed).standard_normal(n) * 3000).astype(np.int16)
    sf.write(path, x, 8000, subtype="PCM_16")
    return x


def _flat(root: Path, n: int) -> list[str]:
    names = [f"clips/c{i:03d}.wav" for i in range(n)]
    for _i, rel in enumerate(names):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x")
    return names


PATTERN = {"layout": "pattern", "pattern": r"clips/(?P<name>c(?P<num>\d+))\.wav"}


def test_hash_split_is_stable_when_the_corpus_grows(tmp_path):
    root = tmp_path / "c"
    _flat(root, 200)
    rule = {"split": {"hash": {"val": 0.2, "test": 0.1}}}
    first = {it.paths[0]: it.split for it in discover(_job(root, {**PATTERN, **rule})).items}
    counts = {s: list(first.values()).count(s) for s in ("train", "val", "test")}
    assert 0.6 * 200 < counts["train"] < 0.8 * 200 and 0.1 * 200 < counts["val"] < 0.3 * 200
    _flat(root, 400)  # the corpus doubles: no file of the first 200 moves
    grown = {it.paths[0]: it.split for it in discover(_job(root, {**PATTERN, **rule})).items}
    assert {p: grown[p] for p in first} == first
    assert discover(_job(root, {**PATTERN, **rule})).splits == ("train", "val", "test")
    assert 0 <= fraction("a") < 1 and fraction("a") == fraction("a") != fraction("b")


def test_hash_split_on_a_column_keeps_groups_together(tmp_path):
    root = tmp_path / "c"
    _flat(root, 60)
    (root / "meta.csv").write_text("file,speaker\n" + "".join(f"c{i:03d}.wav,s{i % 7}\n" for i in range(60)))
    m = discover(_job(root, {**PATTERN, "tables": [{"path": "meta.csv"}],
                             "split": {"hash": {"test": 0.3}, "hash_key": "speaker"}}))
    by_speaker: dict[str, set] = {}
    for it in m.items:
        by_speaker.setdefault(f"s{int(it.key[-3:]) % 7}", set()).add(it.split)
    assert all(len(s) == 1 for s in by_speaker.values())
    assert {next(iter(s)) for s in by_speaker.values()} == {"train", "test"}
    assert m.annotations == ("meta.csv",) and not m.rejects  # the table is an input, not a reject


def test_list_files_and_a_path_listed_twice(tmp_path):
    root = tmp_path / "c"
    names = _flat(root, 6)
    (root / "val.txt").write_text(f"{names[0]}\n{names[1]}\n\n")
    (root / "test.txt").write_text(f"{names[1]}\n{names[2]}\nclips/not_there.wav\n")
    m = discover(_job(root, {**PATTERN, "split": {"lists": {"val": "val.txt", "test": "test.txt"}}}))
    assert {it.paths[0]: it.split for it in m.items} == {
        names[0]: "val", names[2]: "test", names[3]: "train", names[4]: "train", names[5]: "train"}
    assert [(r.path, r.reason) for r in m.rejects] == [(names[1], "listed in several split lists: val.txt, test.txt")]
    assert m.splits == ("train", "val", "test")


def test_exclude_patterns_and_the_reject_bound(tmp_path):
    root = tmp_path / "c"
    for i in range(3):
        _wav(root / "clips" / f"c{i:03d}.wav", seed=i)
    for i in range(6):  # more excluded files than samples: still no failure
        _wav(root / "_noise_" / f"n{i}.wav", seed=10 + i)
    (root / "README.md").write_text("hi")
    job = _job(root, {**PATTERN, "exclude": ["_noise_", "*.md"]}, policy={"max_reject_fraction": 0.0})
    m = discover(job)
    assert len(m.items) == 3 and {r.stage for r in m.rejects} == {"excluded"} and len(m.rejects) == 7
    s = convert(job, ConvertOptions(progress=False))
    assert s.counts == {"train": 3} and s.excluded == 7 and s.rejects == 7 and s.ok


def test_value_errors_are_rejects_naming_table_line_and_field(tmp_path):
    root = tmp_path / "c"
    _flat(root, 4)
    (root / "meta.csv").write_text("file,fold,kind\nc000.wav,1,a\nc001.wav,two,b\nc002.wav,,a\nc003.wav,3,zzz\n")
    fields = {"audio": AUDIO, "fold": {"type": "value", "column": "fold"},
              "kind": {"type": "value", "column": "kind", "dtype": "category", "categories": ["a", "b"]}}
    m = discover(_job(root, {**PATTERN, "tables": [{"path": "meta.csv"}]}, fields))
    reasons = {r.path: r.reason for r in m.rejects}
    assert [it.paths[0] for it in m.items] == ["clips/c000.wav"]
    assert reasons["clips/c001.wav"] == "field 'fold': not an integer: 'two' (meta.csv:3)"
    assert reasons["clips/c002.wav"].startswith("field 'fold': empty value") and "meta.csv:4" in reasons["clips/c002.wav"]
    assert reasons["clips/c003.wav"].startswith("field 'kind': category 'zzz' is not one of categories")


def test_a_missing_column_or_table_is_a_config_error(tmp_path):
    root = tmp_path / "c"
    _flat(root, 2)
    (root / "meta.csv").write_text("file,fold\nc000.wav,1\nc001.wav,2\n")
    with pytest.raises(ConfigError, match=r"fields\.speaker\.column: no column 'speaker' in the annotations \(columns: name, num, file, fold"):
        discover(_job(root, {**PATTERN, "tables": [{"path": "meta.csv"}]},
                      {"audio": AUDIO, "speaker": {"type": "value", "column": "speaker"}}))
    with pytest.raises(ConfigError, match=r"source\.tables\[0\]\.path: no file 'nope\.csv'"):
        discover(_job(root, {**PATTERN, "tables": [{"path": "nope.csv"}]}))
    with pytest.raises(ConfigError, match=r"source\.split\.hash: give one split rule, not lists and hash"):
        _job(root, {**PATTERN, "split": {"lists": {"val": "v.txt"}, "hash": {"val": 0.1}}})
    with pytest.raises(ConfigError, match=r"fields\.t: a text field takes its text from sidecar files"):
        _job(root, PATTERN, {"audio": AUDIO, "t": {"type": "text"}})
    (root / "dup.csv").write_text("file,fold\nc000.wav,1\nc000.wav,2\n")
    with pytest.raises(ConfigError, match=r"dup\.csv:3: key 'c000\.wav' is already in a row of dup\.csv:2"):
        discover(_job(root, {**PATTERN, "tables": [{"path": "dup.csv"}]}))


def test_unlisted_samples_reject_or_exclude(tmp_path):
    root = tmp_path / "c"
    _flat(root, 3)
    (root / "meta.tsv").write_text("path\tx\nc000.wav\t1\n")
    for unlisted, stage in (("reject", "discover"), ("exclude", "excluded")):
        m = discover(_job(root, {**PATTERN, "tables": [{"path": "meta.tsv", "unlisted": unlisted}]}))
        assert [it.paths[0] for it in m.items] == ["clips/c000.wav"]
        assert {r.stage for r in m.rejects} == {stage} and len(m.rejects) == 2
        assert "no row for this sample in meta.tsv" in m.rejects[0].reason


def test_sidecar_text_manifest_columns_and_multilabel_round_trip(tmp_path):
    """class_folders with a .txt beside each .wav, a manifest-layout corpus with value
    columns, and tags in one cell: converted, stored and read back."""
    root = tmp_path / "corpus"
    texts = {"train/yes/a": "héllo wörld\n", "train/no/b": "  second line ok ", "train/no/c": "third"}
    for i, (stem, t) in enumerate(texts.items()):
        _wav(root / f"{stem}.wav", seed=i)
        (root / f"{stem}.txt").write_bytes(t.encode())
    _wav(root / "train/no/bad.wav", seed=9)
    (root / "train/no/bad.txt").write_bytes(b"caf\xe9")  # latin-1, not UTF-8
    job = _job(root, {"layout": "class_folders"},
               {"audio": AUDIO, "caption": {"type": "text", "extensions": [".txt"]}}, policy={"max_reject_fraction": 0.5})
    s = convert(job, ConvertOptions(progress=False))
    assert s.counts == {"train": 3}
    with h5py.File(job.output.path) as f:
        g = f["train"]
        assert g["source"].shape == (3, 2)  # one path per field of files
        got = {}
        for i, (_audio, txt) in enumerate(g["source"].asstr()[...]):
            a, b = g["caption/offsets"][i], g["caption/offsets"][i + 1]
            got[txt[:-4]] = bytes(g["caption/values"][a:b]).decode()
        assert got == {k: v.strip() for k, v in texts.items()}
        rej = dict(zip(f["rejects/path"].asstr()[...], f["rejects/reason"].asstr()[...]))
        assert rej["train/no/bad.txt"] == "text is not valid UTF-8 (byte 3: b'\\xe9')"
        assert rej["train/no/bad.wav"].startswith("paired file train/no/bad.txt was rejected")

    root2 = tmp_path / "m"
    rows = [("a.wav", "dog,bark", "0.5", "x"), ("b.wav", "cat", "1.25", "y"), ("c.wav", "", "2", "x")]
    for i, (p, *_rest) in enumerate(rows):
        _wav(root2 / p, seed=i)
    (root2 / "list.csv").write_text("audio,tags,duration,who,split\n" + "".join(f"{p},\"{t}\",{d},{w},train\n" for p, t, d, w in rows))
    job2 = _job(root2, {"layout": "manifest", "manifest": str(root2 / "list.csv")},
                {"audio": AUDIO, "tags": {"type": "multilabel", "column": "tags"},
                 "duration": {"type": "value", "column": "duration", "dtype": "float32"},
                 "who": {"type": "value", "column": "who", "dtype": "category"}})
    m = discover(job2)
    resolved = resolved_job(job2, m)
    assert resolved.fields["tags"].names == ["bark", "cat", "dog"] and resolved.fields["who"].categories == ["x", "y"]
    convert(job2, ConvertOptions(progress=False))
    with h5py.File(job2.output.path) as f:
        g = f["train"]
        assert list(g["tags"].attrs["names"]) == ["bark", "cat", "dog"]
        assert g["tags"][...].tolist() == [[1, 0, 1], [0, 1, 0], [0, 0, 0]]
        assert g["duration"][...].tolist() == [0.5, 1.25, 2.0] and g["duration"].dtype == np.float32
        assert g["who"][...].tolist() == [0, 1, 0] and list(g["who"].attrs["categories"]) == ["x", "y"]
        assert g["source"].shape == (3,) and json.loads(g["source"].attrs["fields"]) == ["audio"]
        assert json.loads(f.attrs["job"])["fields"]["who"]["categories"] == ["x", "y"]


def test_old_jobs_keep_their_hash():
    """Settings added for annotations are left out of the hash at their default, so a
    partial output of an older version still resumes (and tests/golden/ still matches)."""
    from h5batch.config import load_job
    from tests.conftest import REPO

    job = load_job(REPO / "jobs" / "fsdd.yaml", check_paths=False)
    golden = json.loads((REPO / "tests" / "golden" / "fsdd.json").read_text())
    assert job.hash() == golden["/"]["attrs"]["job_hash"]
