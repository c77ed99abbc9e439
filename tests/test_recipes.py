"""The recipes in jobs/ (Speech Commands, LibriSpeech, Common Voice, ESC-50, CelebA) convert
miniature replicas of their corpora's real layouts (tests/support/replicas.py), and the
output holds what the corpus' own files say: transcripts equal to the transcript files,
metadata equal to the CSV/TSV cells, splits equal to the list files and tables, the
attribute matrix equal to list_attr_celeba.txt, and every other file listed as excluded."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import soundfile as sf

from h5batch import ConvertOptions, convert, verify_file
from h5batch.config import load_job
from tests.conftest import REPO
from tests.support.replicas import CELEBA_ATTRS, REPLICAS


def _convert(name: str, tmp_path):
    root = tmp_path / name
    root.mkdir()
    expect = REPLICAS[name](root)
    out = tmp_path / f"{name}.h5"
    job = load_job(REPO / "jobs" / f"{name}.yaml", [f"source.root={root}", f"output.path={out}", "cluster.workers=1"])
    summary = convert(job, ConvertOptions(progress=False))
    report = verify_file(str(out), sources=True)
    assert report.ok, report.problems
    return root, out, expect, summary


def _samples(f: h5py.File):
    """{source path: (split, row)} over every split."""
    out = {}
    for split in json.loads(f.attrs["splits"]):
        for i, p in enumerate(f[split]["source"].asstr()[...]):
            out[p] = (split, i)
    return out


def _text(g: h5py.Group, i: int) -> str:
    a, b = g["offsets"][i], g["offsets"][i + 1]
    return bytes(g["values"][a:b]).decode("utf-8")


def _names(ds) -> list[str]:
    return json.loads(ds.attrs["categories"]) if isinstance(ds.attrs["categories"], str) else list(ds.attrs["categories"])


def _attr_list(node, key):
    v = node.attrs[key]
    return json.loads(v) if isinstance(v, str) else [str(x) for x in v]


def test_speech_commands_splits_from_list_files(tmp_path):
    root, out, expect, s = _convert("speech_commands", tmp_path)
    assert s.excluded == expect["excluded"] and s.rejects == s.excluded
    with h5py.File(out) as f:
        where = _samples(f)
        assert {p: sp for p, (sp, _) in where.items()} == expect["split"]
        classes = list(f["class_names"].asstr()[...])
        for p, (split, i) in where.items():
            g = f[split]
            assert classes[g["label"][i]] == expect["label"][p]
            assert _attr_list(g["speaker"], "categories")[g["speaker"][i]] == expect["speaker"][p]
            x, _ = sf.read(root / p, dtype="int16")
            row = g["audio"][i]
            assert row.shape == (16000,) and np.array_equal(row[:len(x)], x) and not row[len(x):].any()
        stages = dict(zip(f["rejects/path"].asstr()[...], f["rejects/stage"].asstr()[...]))
        assert stages == {"LICENSE": "excluded", "README.md": "excluded",
                          "_background_noise_/README.md": "excluded", "_background_noise_/white_noise.wav": "excluded"}
        assert _attr_list(f, "annotations") == ["validation_list.txt", "testing_list.txt"]


def test_librispeech_transcripts_speaker_chapter(tmp_path):
    root, out, expect, s = _convert("librispeech", tmp_path)
    assert s.excluded == expect["excluded"]
    with h5py.File(out) as f:
        where = _samples(f)
        assert set(where) == set(expect["text"])
        for p, (split, i) in where.items():
            g = f[split]
            assert split == expect["split"][p]
            assert _text(g["transcript"], i) == expect["text"][p]
            assert g["speaker"][i] == expect["speaker"][p] and g["chapter"][i] == expect["chapter"][p]
        assert sorted(_attr_list(f, "annotations")) == sorted(
            str(p.relative_to(root)) for p in root.rglob("*.trans.txt"))
    # The reader gives the transcripts as str, in samples, batches and through DataLoader workers.
    from h5batch.torch import H5Dataset

    ds = H5Dataset(out, split="train-clean-100", with_source=True)
    assert ds[0]["transcript"] == expect["text"][ds[0]["source"]]
    for workers in (0, 2):
        got = {}
        for b in ds.loader(batch_size=4, shuffle=True, num_workers=workers):
            assert isinstance(b["transcript"], list) and b["audio"].ndim == 2
            got.update(zip(b["source"], b["transcript"]))
        assert got == {p: t for p, t in expect["text"].items() if p.startswith("train-clean-100/")}


def test_common_voice_tsv_metadata_and_unlisted_clips(tmp_path):
    root, out, expect, s = _convert("common_voice", tmp_path)
    rows = expect["rows"]
    with h5py.File(out) as f:
        where = _samples(f)
        assert set(where) == set(rows)
        assert json.loads(f.attrs["splits"]) == ["train", "val", "test"]
        for p, (split, i) in where.items():
            g, r = f[split], rows[p]
            assert split == r["split"]
            assert _text(g["sentence"], i) == r["sentence"]  # quotes and commas kept as written
            assert _attr_list(g["client_id"], "categories")[g["client_id"][i]] == r["client_id"]
            assert _attr_list(g["age"], "categories")[g["age"][i]] == (r["age"] or "unknown")
            assert _attr_list(g["gender"], "categories")[g["gender"][i]] == (r["gender"] or "unknown")
            assert g["up_votes"][i] == int(r["up_votes"])
        stage = dict(zip(f["rejects/path"].asstr()[...], f["rejects/stage"].asstr()[...]))
        for clip in expect["excluded"]:  # in other.tsv only
            assert stage[clip] == "excluded"
        assert set(stage.values()) == {"excluded"}


def test_esc50_labels_and_metadata_from_csv(tmp_path):
    root, out, expect, s = _convert("esc50", tmp_path)
    assert s.excluded == expect["excluded"]
    with h5py.File(out) as f:
        classes = list(f["class_names"].asstr()[...])
        assert classes == sorted({r["category"] for r in expect["rows"].values()})
        g = f["train"]
        for p, (_, i) in _samples(f).items():
            r = expect["rows"][p]
            assert classes[g["label"][i]] == r["category"]
            assert g["fold"][i] == r["fold"] and g["target"][i] == r["target"]
            assert _attr_list(g["esc10"], "categories")[g["esc10"][i]] == r["esc10"]
        assert len(_samples(f)) == len(expect["rows"])


def test_celeba_attribute_matrix_partition_identity(tmp_path):
    root, out, expect, s = _convert("celeba", tmp_path)
    with h5py.File(out) as f:
        where = _samples(f)
        assert {p: sp for p, (sp, _) in where.items()} == expect["split"]
        for p, (split, i) in where.items():
            g = f[split]
            assert _attr_list(g["attributes"], "names") == CELEBA_ATTRS
            assert g["attributes"].shape[1:] == (40,) and g["attributes"].dtype == np.uint8
            assert np.array_equal(g["attributes"][i], expect["attrs"][p])
            assert g["identity"][i] == expect["identity"][p]
        assert _attr_list(f, "annotations") == ["list_attr_celeba.txt", "list_eval_partition.txt", "identity_CelebA.txt"]


@pytest.mark.parametrize("name", sorted(REPLICAS))
def test_recipe_root_is_source_root(name):
    job = load_job(REPO / "jobs" / f"{name}.yaml", ["source.root=/elsewhere"], check_paths=False)
    assert job.source.root == "/elsewhere"
