"""Bad job files through the real CLI: one line naming the file and the key, exit code 2,
and nothing written (no output, no partial, no output folder)."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

H5BATCH = str(Path(sys.executable).with_name("h5batch"))


@pytest.fixture(autouse=True)
def no_leaked_segments():
    """Overrides conftest's check: these tests start no conversion, and segments that
    conversions run concurrently by other processes create in /dev/shm are not ours."""
    yield

BASE = {
    "name": "bad",
    "source": {"root": "corpus", "layout": "class_folders"},
    "fields": {"audio": {"type": "audio", "extensions": [".wav"], "sample_rate": 16000}},
    "output": {"path": "out/bad.h5", "codec": "gzip"},
    "cluster": {"workers": 1, "batch_size": 8},
}


def _set(d: dict, dotted: str, value) -> dict:
    d = copy.deepcopy(d)
    node = d
    parts = dotted.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return d


def _drop(d: dict, dotted: str) -> dict:
    d = copy.deepcopy(d)
    node = d
    parts = dotted.split(".")
    for p in parts[:-1]:
        node = node[p]
    del node[parts[-1]]
    return d


PATTERN = _set(_set(BASE, "source.layout", "pattern"), "source.pattern", r"(?P<label>[a-z]+)_(?P<n>\d+)\.wav")

CASES = [
    # id, job dict, key named, words of the message
    ("unknown key", _set(BASE, "output.compresion", "gzip"), "output.compresion", "unknown key"),
    ("unknown section", _set(BASE, "sorce", {"root": "corpus"}), "sorce", "unknown key"),
    ("wrong type int", _set(BASE, "cluster.batch_size", "big"), "cluster.batch_size", "must be an integer"),
    ("wrong type list", _set(BASE, "fields.audio.extensions", ".wav"), "fields.audio.extensions", "must be a list"),
    ("wrong choice", _set(BASE, "output.codec", "brotli"), "output.codec", "must be one of"),
    ("missing root", _set(BASE, "source.root", "no/such/corpus"), "source.root", "does not exist"),
    ("missing required", _drop(BASE, "output.path"), "output.path", "is required"),
    ("negative batch size", _set(BASE, "cluster.batch_size", -4), "cluster.batch_size", "must be >= 1"),
    ("bad codec level", _set(BASE, "output.level", 12), "output.level", "gzip levels are 0..9"),
    ("bad regex", _set(PATTERN, "source.pattern", r"(?P<label>[a-z+"), "source.pattern", "not a valid regex"),
    ("bad split range", _set(_set(PATTERN, "source.split.group", "n"), "source.split.ranges", {"test": [5, 1]}),
     "source.split.ranges.test", "lo <= hi"),
    ("fraction above 1", _set(BASE, "policy.max_reject_fraction", 1.5), "policy.max_reject_fraction", "within 0..1"),
    ("image size", _set(BASE, "fields.audio", {"type": "image", "size": [0, 32]}), "fields.audio.size", "[height, width] > 0"),
    ("reserved field", _set(_drop(BASE, "fields.audio"), "fields.label", {"type": "audio"}), "fields.label", "reserved"),
    ("resample without rate", _set(_set(BASE, "fields.audio.resample", True), "fields.audio.sample_rate", None),
     "fields.audio.resample", "needs sample_rate"),
    ("output url", _set(BASE, "output.path", "gs://bench/x.h5"), "output.path", "gs:// is not a storage h5batch can write"),
    ("output s3 key", _set(BASE, "output.path", "s3://bench"), "output.path", "expected s3://BUCKET/KEY"),
    ("corpus s3", _set(BASE, "source.root", "s3://bench/corpus"), "source.root", "s3:// is not a storage h5batch can read"),
    ("corpus url", _set(BASE, "source.root", "gs://b/corpus"), "source.root", "gs:// is not a storage h5batch can read"),
    ("limit", _set(BASE, "source.limit", 0), "source.limit", "must be >= 1"),
]


def _convert(tmp_path: Path, text: str, *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "corpus" / "train" / "a").mkdir(parents=True, exist_ok=True)
    job = tmp_path / "bad.yaml"
    job.write_text(text)
    return subprocess.run([H5BATCH, "convert", str(job), *extra], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)


def _assert_one_line_nothing_written(r: subprocess.CompletedProcess, tmp_path: Path, *words: str) -> str:
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert r.stdout == ""
    line = lines[0]
    assert str(tmp_path / "bad.yaml") in line, line
    for w in words:
        assert w in line, (w, line)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml", "corpus"]  # no out/, no partial
    return line


@pytest.mark.parametrize("job,key,message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_job_file(tmp_path, job, key, message) -> None:
    r = _convert(tmp_path, yaml.safe_dump(job, sort_keys=False))
    line = _assert_one_line_nothing_written(r, tmp_path, f": {key}: ", message)
    assert "Traceback" not in line


def test_invalid_yaml(tmp_path) -> None:
    r = _convert(tmp_path, "source:\n  root: corpus\n  layout: [class_folders\n")
    _assert_one_line_nothing_written(r, tmp_path, "line ", "not valid YAML")


def test_not_a_mapping(tmp_path) -> None:
    r = _convert(tmp_path, "- just\n- a list\n")
    _assert_one_line_nothing_written(r, tmp_path, "must be a YAML mapping")


def test_bad_override(tmp_path) -> None:
    r = _convert(tmp_path, yaml.safe_dump(BASE), "--set", "cluster.batch_size=-1")
    _assert_one_line_nothing_written(r, tmp_path, "cluster.batch_size", "must be >= 1")


def test_good_job_passes_validation(tmp_path, monkeypatch) -> None:
    """The base jobs are valid: each case above fails because of its one change."""
    from h5batch.config import load_job

    (tmp_path / "corpus").mkdir()
    monkeypatch.chdir(tmp_path)
    for name, job in (("ok.yaml", BASE), ("pattern.yaml", PATTERN)):
        (tmp_path / name).write_text(yaml.safe_dump(job))
        assert load_job(tmp_path / name).name == "bad"
