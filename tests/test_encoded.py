"""``store: encoded`` (h5batch/fields/encoded.py, transcode.py, torch/fieldinfo.py): the file
keeps the source's bytes (or their transcode), a file that does not decode is still a
reject, ``H5Dataset`` returns what decoded storage of the same files returns (and what
Pillow / soundfile give on the sources), in the main process and in DataLoader workers,
and ``verify --sources`` compares the bytes."""

from __future__ import annotations

import io
import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import soundfile as sf
import torch
import yaml
from PIL import Image

from h5batch import format as fmt
from h5batch.config import job_from_dict
from h5batch.errors import ConfigError
from h5batch.fields.audio import AudioField, decode_audio
from h5batch.fields.image import ImageField, decode_image
from h5batch.fields.transcode import ImageTranscode, encode_image
from h5batch.tools.verify import verify_file
from h5batch.torch import H5Dataset, collate
from tests.support.run import convert

IMAGE_SIZES = [(40, 30), (64, 48), (50, 70), (33, 33), (80, 20), (45, 61)]


def _write_images(root: Path) -> None:
    rng = np.random.default_rng(7)
    for split, cls in (("train", "a"), ("train", "b"), ("test", "a"), ("test", "b")):
        d = root / split / cls
        d.mkdir(parents=True)
        for k, (w, h) in enumerate(IMAGE_SIZES):
            arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
            arr[: h // 2] //= 3  # some structure, so JPEG is not all noise
            Image.fromarray(arr).save(d / f"{cls}{k}.jpg", quality=85)
        rgba = rng.integers(0, 256, (24, 36, 4), dtype=np.uint8)
        Image.fromarray(rgba, "RGBA").save(d / f"{cls}_alpha.png")  # composited on white
        Image.fromarray(rng.integers(0, 256, (20, 28), dtype=np.uint8), "L").save(d / f"{cls}_grey.png")
    good = (root / "train" / "a" / "a0.jpg").read_bytes()
    (root / "train" / "a" / "broken.jpg").write_bytes(good[: len(good) // 3])  # truncated: a reject


@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("enc_images") / "corpus"
    _write_images(root)
    return root


def _job(tmp: Path, name: str, root: Path, fields: dict, layout: str = "class_folders") -> Path:
    job = {"name": name, "source": {"root": str(root), "layout": layout, "splits": ["train", "test"]},
           "fields": fields, "output": {"path": str(tmp / f"{name}.h5"), "chunk_bytes": 16384, "codec": "none"},
           "cluster": {"kind": "local", "batch_size": 4}, "policy": {"max_reject_fraction": 0.5}}
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job, sort_keys=False))  # fields in this order
    return path


def _run(tmp: Path, name: str, root: Path, fields: dict, layout: str = "class_folders") -> Path:
    convert(_job(tmp, name, root, fields, layout), workers=2, check=True)
    return tmp / f"{name}.h5"


@pytest.fixture(scope="module")
def native(tmp_path_factory, image_root) -> tuple[Path, Path]:
    """The same images stored decoded and encoded, at their own sizes (variable shape)."""
    tmp = tmp_path_factory.mktemp("enc_native")
    image = {"type": "image", "extensions": [".jpg", ".png"]}
    return (_run(tmp, "decoded", image_root, {"image": image}),
            _run(tmp, "encoded", image_root, {"image": {**image, "store": "encoded"}}))


def _all(ds: H5Dataset):
    return ds.__getitems__(list(range(len(ds))))


def test_encoded_bytes_are_the_source_bytes_and_the_file_is_format_2(native, image_root):
    dec, enc = native
    with h5py.File(enc) as f, h5py.File(dec) as g:
        assert f.attrs[fmt.ATTR_FORMAT] == 2 and g.attrs[fmt.ATTR_FORMAT] == 1
        node = f["train/image"]
        assert node.attrs["store"] == "encoded" and node.attrs["encoded_format"] == "source"
        assert json.loads(node.attrs["decode"])["mode"] == "RGB"
        assert node["values"].dtype == np.uint8 and node.attrs["kind"] == "variable"
        offs, values = node["offsets"][...], node["values"]
        for i, rel in enumerate(f["train/source"].asstr()[...]):
            assert values[offs[i]:offs[i + 1]].tobytes() == (image_root / rel).read_bytes()
        assert list(f["rejects/path"].asstr()[...]) == ["train/a/broken.jpg"]
        assert list(f["rejects/reason"].asstr()[...]) == list(g["rejects/reason"].asstr()[...])  # as decoded


@pytest.mark.parametrize("split", ["train", "test"])
def test_encoded_reads_like_decoded_storage_and_like_pillow(native, image_root, split):
    dec, enc = native
    for kw in ({}, {"as_float": False}, {"channels_first": True}):
        a, b = _all(H5Dataset(dec, split, **kw)), _all(H5Dataset(enc, split, **kw))
        assert torch.equal(a.columns["image"].padded, b.columns["image"].padded)
        assert np.array_equal(a.columns["image"].shapes, b.columns["image"].shapes)
        assert torch.equal(a.label, b.label)
    ds = H5Dataset(enc, split, as_float=False, with_source=True)
    for i in range(len(ds)):
        s = ds[i]
        src = image_root / s["source"]
        with Image.open(src) as im:
            if im.mode in ("RGB", "L"):  # plain files: Pillow's own decode, nothing composited
                expect = np.asarray(im.convert("RGB"))
            else:
                expect = decode_image(str(src), ImageField())
        assert np.array_equal(s["image"].numpy(), expect), s["source"]


@pytest.fixture(scope="module")
def transcoded(tmp_path_factory, image_root) -> Path:
    image = {"type": "image", "extensions": [".jpg", ".png"], "size": [24, 20], "store": "encoded",
             "transcode": {"format": "jpeg", "quality": 80, "max_size": 48}}
    return _run(tmp_path_factory.mktemp("enc_jpeg"), "transcoded", image_root, {"image": image})


@pytest.mark.parametrize("workers", [0, 2])
def test_encoded_fixed_size_in_dataloader_workers(tmp_path, image_root, transcoded, workers):
    """A fixed ``size`` stays a (B, H, W, C) tensor batch; transcoded bytes are Pillow's
    JPEG of the decoded picture, and the reader decodes them with the field's settings."""
    out = transcoded
    fc = ImageField(extensions=[".jpg", ".png"], size=[24, 20])
    t = ImageTranscode(format="jpeg", quality=80, max_size=48)
    with h5py.File(out) as f:
        node = f["train/image"]
        assert node.attrs["encoded_format"] == "jpeg"
        offs, values, sources = node["offsets"][...], node["values"], f["train/source"].asstr()[...]
        stored = [values[offs[i]:offs[i + 1]].tobytes() for i in range(len(sources))]
    for rel, data in zip(sources, stored):
        native = decode_image(str(image_root / rel), ImageField())
        assert data == encode_image(rel, native, t)
        with Image.open(io.BytesIO(data)) as im:
            assert max(im.size) <= 48 and im.format == "JPEG"
    ds = H5Dataset(out, "train", as_float=False)
    loader = torch.utils.data.DataLoader(ds, batch_size=5, num_workers=workers, collate_fn=collate)
    got = torch.cat([b["image"] for b in loader])
    assert got.shape == (len(sources), 24, 20, 3) and got.dtype == torch.uint8
    for j, data in enumerate(stored):
        tmp = tmp_path / f"t{j}.jpg"
        tmp.write_bytes(data)
        assert np.array_equal(got[j].numpy(), decode_image(str(tmp), fc))
    if workers == 0:
        assert verify_file(str(out), sources=True).ok


def _write_audio(root: Path) -> None:
    """Per stem a WAV (16- or 24-bit) or MP3, and a FLAC or Ogg Vorbis file: two fields."""
    rng = np.random.default_rng(3)
    for split in ("train", "test"):
        d = root / split / "tone"
        d.mkdir(parents=True)
        for k in range(4):
            n = 4000 + 900 * k
            x = (0.3 * np.sin(np.arange(n) * (0.01 + 0.01 * k)) + 0.05 * rng.standard_normal(n)).astype(np.float32)
            if k == 3:
                sf.write(d / f"s{k}.mp3", x, 16000, format="MP3")
            else:
                sf.write(d / f"s{k}.wav", x, 16000, subtype="PCM_16" if k % 2 == 0 else "PCM_24")
            if k % 2 == 0:
                sf.write(d / f"s{k}.flac", x[::-1].copy(), 16000, subtype="PCM_16")
            else:
                sf.write(d / f"s{k}.ogg", x[::-1].copy(), 16000, format="OGG", subtype="VORBIS")


@pytest.fixture(scope="module")
def audio(tmp_path_factory) -> tuple[Path, Path]:
    """Field ``wav`` keeps the WAV / MP3 bytes (variable length); field ``comp`` transcodes the
    FLAC / Ogg files, decoded to 6000 int16 frames, to FLAC."""
    tmp = tmp_path_factory.mktemp("enc_audio")
    root = tmp / "audio"
    _write_audio(root)
    fields = {"wav": {"type": "audio", "extensions": [".wav", ".mp3"], "sample_rate": 16000, "store": "encoded"},
              "comp": {"type": "audio", "extensions": [".flac", ".ogg"], "sample_rate": 16000, "length": 6000,
                       "store": "encoded", "transcode": {"format": "flac"}}}
    return root, _run(tmp, "audio_enc", root, fields)


@pytest.mark.parametrize("workers", [0, 2])
def test_encoded_audio_reads_like_decoded_storage_and_soundfile(audio, workers):
    root, out = audio
    wav = AudioField(extensions=[".wav", ".mp3"], sample_rate=16000)
    ds = H5Dataset(out, "train", as_float=False, with_source=True)
    loader = torch.utils.data.DataLoader(ds, batch_size=3, num_workers=workers, collate_fn=collate)
    seen, formats = 0, set()
    for batch in loader:
        for j, (rel, _) in enumerate(batch["source"]):
            got = batch["wav"][j][: int(batch["wav_lengths"][j])].numpy()
            path = str(root / rel)
            assert np.array_equal(got, decode_audio(path, wav)), rel  # what decoded storage stores
            if sf.info(path).subtype == "PCM_16":  # soundfile's own int16, exactly
                assert np.array_equal(got, sf.read(path, dtype="int16")[0]), rel
            seen += 1
            formats.add(sf.info(path).format)
    assert seen == 4 and formats == {"WAV", "MP3"}


def test_audio_transcode_to_flac_is_lossless_for_int16(audio):
    root, out = audio
    comp = AudioField(extensions=[".flac", ".ogg"], sample_rate=16000, length=6000)
    with h5py.File(out) as f:
        node = f["train/comp"]
        assert node.attrs["encoded_format"] == "flac" and f["train/wav"].attrs["encoded_format"] == "source"
        offs, values = node["offsets"][...], node["values"]
        assert bytes(values[offs[0]:offs[0] + 4]) == b"fLaC"
    ds = H5Dataset(out, "train", as_float=False, with_source=True)
    batch = ds.__getitems__(list(range(len(ds))))
    assert batch.columns["comp"].shape == (len(ds), 6000)  # a fixed length: a plain tensor
    for j, (_, rel) in enumerate(batch.source):
        assert np.array_equal(batch.columns["comp"][j].numpy(), decode_audio(str(root / rel), comp)), rel
    f32 = H5Dataset(out, "train").__getitems__([0]).columns["comp"]
    assert f32.dtype == torch.float32 and torch.equal(f32[0], batch.columns["comp"][0].float() / 32768)
    report = verify_file(str(out), sources=True)
    assert report.ok and report.sources_compared == 2 * 8, report.problems


@pytest.mark.parametrize("extra, key", [
    ({"store": "encoded", "transform": "math:sqrt"}, "fields.image.transform"),
    ({"transcode": {"format": "jpeg"}}, "fields.image.transcode"),
    ({"store": "encoded", "transcode": {"format": "jpeg", "quality": 0}}, "fields.image.transcode.quality"),
    ({"store": "packed"}, "fields.image.store"),
])
def test_bad_encoded_settings_name_the_key(tmp_path, extra, key):
    job = {"source": {"root": str(tmp_path)}, "fields": {"image": {"type": "image", **extra}},
           "output": {"path": str(tmp_path / "x.h5")}}
    with pytest.raises(ConfigError) as e:
        job_from_dict(job, "job.yaml")
    assert e.value.key == key, str(e.value)


def test_defaults_leave_the_job_hash_and_config_alone(tmp_path):
    """``store: decoded`` (the default) is not written into the hash: jobs and outputs of
    before encoded storage keep their hashes (tests/golden)."""
    base = {"source": {"root": str(tmp_path)}, "fields": {"image": {"type": "image"}},
            "output": {"path": str(tmp_path / "x.h5")}}
    explicit = json.loads(json.dumps(base))
    explicit["fields"]["image"]["store"] = "decoded"
    encoded = json.loads(json.dumps(base))
    encoded["fields"]["image"]["store"] = "encoded"
    h = [job_from_dict(j, "job.yaml").hash() for j in (base, explicit, encoded)]
    assert h[0] == h[1] != h[2]
