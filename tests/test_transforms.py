"""User transforms and built-in features (h5batch/fields/transform.py, features.py): run on
the Dask workers after decoding; the stored log-mel is librosa's own call; an exception or
a wrong shape is a reject naming the file; a function that cannot be imported is a
ConfigError naming the key; a changed function is refused on resume (its source is in the
job hash)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import h5py
import librosa
import numpy as np
import pytest
import soundfile as sf
import yaml

from h5batch.config import job_from_dict
from h5batch.errors import ConfigError, DecodeError
from h5batch.fields import decode_field, fixed_sample_shape, needed_packages
from h5batch.fields.audio import AudioField
from h5batch.torch import H5Dataset
from tests.support.processes import kill_group, wait_for
from tests.support.run import convert, convert_cmd, run, start

USERTF = '''
import numpy as np

GAIN = {gain}


def scale(x):
    """Peak-normalise a clip, times GAIN; a silent clip is an error."""
    peak = float(np.abs(x).max())
    if peak == 0:
        raise ValueError("silent clip")
    return (GAIN * x / peak).astype(np.float32)


def halve(x):
    return x[: len(x) // 2]
'''

SR = 16000


def _module(where: Path, gain: float = 1.0) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    (where / "usertf.py").write_text(USERTF.format(gain=gain))
    return where


def _clip(k: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(k)
    t = np.arange(n) / SR
    return (0.4 * np.sin(2 * np.pi * (200 + 90 * k) * t) + 0.02 * rng.standard_normal(n)).astype(np.float32)


def _corpus(root: Path, per_split: int, pair: bool) -> None:
    """``<split>/tone/cK.wav`` (and the same audio as ``cK.flac``); c0 of train is silent."""
    for split in ("train", "test"):
        d = root / split / "tone"
        d.mkdir(parents=True, exist_ok=True)
        for k in range(per_split):
            x = np.zeros(5000, np.float32) if (split, k) == ("train", 0) else _clip(k, 4000 + 250 * k)
            sf.write(d / f"c{k}.wav", x, SR, subtype="PCM_16")
            if pair:
                sf.write(d / f"c{k}.flac", x, SR, subtype="PCM_16")


def _job(path: Path, root: Path, out: Path, fields: dict, **cluster) -> Path:
    job = {"name": path.stem, "source": {"root": str(root), "splits": ["train", "test"]}, "fields": fields,
           "output": {"path": str(out), "chunk_bytes": 16384, "codec": "none"},  # no trial decode in the driver
           "cluster": {"kind": "local", "batch_size": 4, **cluster}, "policy": {"max_reject_fraction": 0.5, "commit_every": 0}}
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def _env(mod: Path) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join([str(mod), os.environ.get("PYTHONPATH", "")])}


# ------------------------------------------------------------------ in process


def test_a_transform_that_cannot_be_imported_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(_module(tmp_path / "mods")))
    base = {"source": {"root": str(tmp_path)}, "output": {"path": str(tmp_path / "x.h5")}}
    cases = {"no_such_module_xyz:f": "cannot import module 'no_such_module_xyz'",
             "usertf:nothing": "has no attribute 'nothing'", "usertf.scale": "must be 'package.module:function'",
             "usertf:GAIN": "is a float, not a function"}
    for ref, why in cases.items():
        with pytest.raises(ConfigError) as e:
            job_from_dict({**base, "fields": {"audio": {"type": "audio", "transform": ref}}}, "job.yaml")
        assert e.value.key == "fields.audio.transform" and why in e.value.message, str(e.value)
    job = job_from_dict({**base, "fields": {"audio": {"type": "audio", "transform": "usertf:scale"}}}, "job.yaml")
    assert job.fields["audio"].transform == "usertf:scale"


def test_transform_errors_are_decode_errors_naming_the_file(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(_module(tmp_path / "mods")))
    silent, tone = tmp_path / "silent.wav", tmp_path / "tone.wav"
    sf.write(silent, np.zeros(800, np.float32), SR, subtype="PCM_16")
    sf.write(tone, _clip(1, 800), SR, subtype="PCM_16")
    fc = AudioField(sample_rate=SR, dtype="float32", transform="usertf:scale")
    with pytest.raises(DecodeError) as e:
        decode_field(str(silent), fc)
    assert e.value.path == str(silent) and "usertf:scale raised ValueError: silent clip" in e.value.reason
    got = decode_field(str(tone), fc)
    assert got.dtype == np.float32 and np.abs(got).max() == 1.0
    fixed = AudioField(sample_rate=SR, length=600, transform="usertf:halve")  # (600,) int16 -> (300,)
    assert fixed_sample_shape(fixed) == ((600,), np.dtype(np.int16))
    with pytest.raises(DecodeError) as e:
        decode_field(str(tone), fixed)
    assert "returned int16 (300,), but the field stores int16 (600,)" in e.value.reason
    assert decode_field(str(tone), AudioField(sample_rate=SR, transform="usertf:halve")).shape == (400,)


def test_log_mel_in_process_equals_librosa(tmp_path):
    path = tmp_path / "a.wav"
    sf.write(path, _clip(3, 7000), SR, subtype="PCM_16")
    y = sf.read(path, dtype="int16")[0].astype(np.float32) / 32768
    settings = {"type": "log_mel", "n_fft": 512, "hop_length": 128, "n_mels": 40, "fmax": 7000.0, "top_db": 60.0}
    job = job_from_dict({"source": {"root": str(tmp_path)}, "output": {"path": str(tmp_path / "x.h5")},
                         "fields": {"audio": {"type": "audio", "sample_rate": SR, "length": 6400,
                                              "features": settings}}}, "job.yaml")
    fc = job.fields["audio"]
    got = decode_field(str(path), fc)
    S = librosa.feature.melspectrogram(y=y[:6400], sr=SR, n_fft=512, hop_length=128, n_mels=40, fmax=7000.0)
    assert np.array_equal(got, librosa.power_to_db(S, ref=1.0, amin=1e-10, top_db=60.0).T.astype(np.float32))
    assert fixed_sample_shape(fc) == ((1 + 6400 // 128, 40), np.dtype(np.float32)) == (got.shape, got.dtype)
    assert "librosa" in needed_packages(fc)


@pytest.mark.parametrize("fields, key", [
    ({"type": "audio", "features": "log_mel"}, "fields.audio.sample_rate"),
    ({"type": "audio", "sample_rate": SR, "channels": "keep", "features": "log_mel"}, "fields.audio.channels"),
    ({"type": "audio", "sample_rate": SR, "features": {"n_mels": 0}}, "fields.audio.features.n_mels"),
    ({"type": "audio", "sample_rate": SR, "features": {"fmax": 9000.0}}, "fields.audio.features.fmax"),
    ({"type": "audio", "sample_rate": SR, "features": "mfcc"}, "fields.audio.features"),
])
def test_bad_feature_settings_name_the_key(tmp_path, fields, key):
    with pytest.raises(ConfigError) as e:
        job_from_dict({"source": {"root": str(tmp_path)}, "output": {"path": str(tmp_path / "x.h5")},
                       "fields": {"audio": fields}}, "job.yaml")
    assert e.value.key == key, str(e.value)


# ------------------------------------------------------------------ conversions


def test_conversion_stores_log_mel_and_the_transform_and_rejects_its_failures(tmp_path):
    mod = _module(tmp_path / "mods", gain=0.5)
    root = tmp_path / "corpus"
    _corpus(root, 4, pair=True)
    fields = {"mel": {"type": "audio", "extensions": [".wav"], "sample_rate": SR, "length": 4800,
                      "features": {"type": "log_mel", "n_fft": 400, "hop_length": 160, "n_mels": 32}},
              "norm": {"type": "audio", "extensions": [".flac"], "sample_rate": SR, "dtype": "float32",
                       "transform": "usertf:scale"}}
    out = tmp_path / "out.h5"
    res = convert(_job(tmp_path / "tf.yaml", root, out, fields), workers=2, env_extra=_env(mod))
    assert res.returncode == 0, res.stderr
    with h5py.File(out) as f:
        rejects = dict(zip(f["rejects/path"].asstr()[...], f["rejects/reason"].asstr()[...]))
        assert f["train/mel"].shape == (3, 1 + 4800 // 160, 32) and f["train/mel"].attrs["axes"] == "frame,mel"
        assert f["train/norm"].attrs["transform"] == "usertf:scale"
        assert json.loads(f.attrs["job"])["fields"]["norm"]["transform"] == "usertf:scale"
    assert rejects["train/tone/c0.flac"] == "transform usertf:scale raised ValueError: silent clip"
    assert "paired file train/tone/c0.flac was rejected" in rejects["train/tone/c0.wav"]
    spec = importlib.util.spec_from_file_location("usertf_half", mod / "usertf.py")
    usertf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(usertf)  # this run's module (another test imported a usertf)
    for split in ("train", "test"):
        ds = H5Dataset(out, split, with_source=True)
        for i in range(len(ds)):
            s = ds[i]
            wav, flac = (str(root / p) for p in s["source"])
            y = sf.read(wav, dtype="int16")[0].astype(np.float32) / 32768
            y = np.concatenate([y, np.zeros(max(0, 4800 - len(y)), np.float32)])[:4800]
            S = librosa.feature.melspectrogram(y=y, sr=SR, n_fft=400, hop_length=160, n_mels=32)
            expect = librosa.power_to_db(S, ref=1.0, amin=1e-10, top_db=80.0).T.astype(np.float32)
            assert np.array_equal(s["mel"].numpy(), expect), wav
            assert np.array_equal(s["norm"].numpy(), usertf.scale(sf.read(flac, dtype="float32")[0])), flac
            assert float(s["norm"].abs().max()) == 0.5


def test_resume_refuses_a_changed_transform(tmp_path):
    mod = _module(tmp_path / "mods", gain=1.0)
    root = tmp_path / "corpus"
    _corpus(root, 24, pair=False)
    out = tmp_path / "out.h5"
    fields = {"audio": {"type": "audio", "sample_rate": SR, "dtype": "float32", "transform": "usertf:scale"}}
    job = _job(tmp_path / "tf.yaml", root, out, fields)
    proc = start(convert_cmd(job, workers=2), {**_env(mod), "H5BATCH_FAULTS": "pause_at=commit:2"},
                 new_session=True)
    try:
        wait_for(Path(str(out) + ".partial.paused"), proc)
    finally:
        kill_group(proc)
    Path(str(out) + ".partial.paused").unlink()
    assert Path(str(out) + ".partial.commit.json").exists()
    _module(mod, gain=0.25)  # the same name, another function
    res = run(convert_cmd(job, workers=2), _env(mod))
    assert res.returncode == 2, res.stderr
    assert "different job file" in res.stderr and "--restart" in res.stderr
    res = run(convert_cmd(job, "--restart", workers=2), _env(mod))
    assert res.returncode == 0, res.stderr
    ds = H5Dataset(out, "test")
    assert all(float(ds[i]["audio"].abs().max()) == 0.25 for i in range(len(ds)))
