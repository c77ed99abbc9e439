"""``h5batch preview`` in a real headless Chromium, and ``h5batch inspect --sample``, on real
outputs converted here: a labelled audio job with a text field and a labelled image job of
native sizes with a value field, each with rejects.

The page is loaded from ``file://`` by ``chromium --headless`` (Debian's package: installed
with apt-get when missing and we are root, as tests/cluster/slurm_local.sh installs slurm;
skipped only when that is impossible). Checked: the page loads and its own check finishes,
no console message and no script error, every ``<img>`` and ``<audio>`` decodes in the
browser and points at a file inside the folder that decodes in Python (each WAV equal to
the sample H5Dataset gives), the class counts and rejects shown are the file's, and the page
does not scroll sideways in a 1280 px wide window. A job of 120 classes checks that the
page stays short (the largest classes by name, one "others" row) and prints float32 values
at their own precision; an older mixed-rate audio output (``sample_rate`` 0) that lengths are then
in samples, and a per-sample rate column that it is used.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import h5py
import numpy as np
import pytest
import soundfile as sf
from PIL import Image

from h5batch import ConvertOptions, convert
from h5batch.cli import main
from h5batch.config import job_from_dict
from h5batch.torch import H5Dataset
from tests.support.run import run_h5batch

BROWSERS = ("chromium", "chromium-browser")
N = 6  # samples per split on the page
TOP = 20  # classes the counts table shows one by one (preview_page.TOP_CLASSES)


def _find_browser() -> str | None:
    return next((p for p in map(shutil.which, BROWSERS) if p), None)


@pytest.fixture(scope="module")
def chromium() -> str:
    found = _find_browser()
    if found:
        return found
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("no chromium binary, and not root with apt-get to install Debian's package")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-qq", "chromium"]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True)
        res = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            pytest.skip(f"apt-get install chromium failed: {res.stderr.strip()[-300:]}")
    found = _find_browser()
    if not found:
        pytest.skip("apt-get installed chromium but no chromium binary is on PATH")
    return found


def _wav(path: Path, n: int, freq: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = np.arange(n) / 8000
    sf.write(path, (np.sin(2 * np.pi * freq * t) * 9000).astype(np.int16), 8000, subtype="PCM_16")


def _audio_job(root: Path):
    for split, k in (("train", 4), ("test", 2)):
        for c, cls in enumerate(("no", "yes")):
            for i in range(k + c):  # unequal classes
                _wav(root / split / cls / f"{cls}{i}.wav", 2000 + 400 * i, 300 + 50 * i)
                (root / split / cls / f"{cls}{i}.txt").write_text(f"{cls} <b>{i}</b> & more")
    (root / "train/no/broken.wav").write_bytes(b"RIFF\x00\x00not a wav")
    (root / "train/no/broken.txt").write_text("orphan")
    return {"source": {"root": str(root), "layout": "class_folders"},
            "fields": {"audio": {"type": "audio", "extensions": [".wav"], "sample_rate": 8000},
                       "caption": {"type": "text", "extensions": [".txt"]}}}


def _image_job(root: Path):
    rng, rows = np.random.default_rng(1), ["file,score"]
    for split, k in (("train", 5), ("val", 2)):
        for cls in ("cat", "dog"):
            for i in range(k):
                p = root / split / cls / f"{split}{cls}{i}.png"
                p.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(rng.integers(0, 256, (12 + 4 * i, 20 + 3 * i, 3), dtype=np.uint8)).save(p)
                rows.append(f"{p.name},{i * 0.5}")
    (root / "train/dog/bad.png").write_bytes(b"\x89PNG\r\n\x1a\nbroken")
    (root / "meta.csv").write_text("\n".join([*rows, "bad.png,9"]) + "\n")
    return {"source": {"root": str(root), "layout": "class_folders", "tables": [{"path": "meta.csv"}]},
            "fields": {"image": {"type": "image", "extensions": [".png"], "mode": "RGB"},
                       "score": {"type": "value", "column": "score", "dtype": "float32"}}}


def _many_classes_job(root: Path):
    """120 classes of tiny PNGs, 1 to 5 samples each, with a float32 value column."""
    rows = ["file,gain"]
    for k in range(120):
        for i in range(1 + (7 * k) % 5):
            long = "x" * 200 if k == 0 else ""  # a source path too long for the page's width
            p = root / "train" / f"genre {k:03d} & co" / f"g{k}_{i}{long}.png"
            p.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(np.full((4, 6, 3), k, dtype=np.uint8)).save(p)
            rows.append(f"{p.name},{-14.312 + k}")
    (root / "meta.csv").write_text("\n".join(rows) + "\n")
    return {"source": {"root": str(root), "layout": "class_folders", "tables": [{"path": "meta.csv"}]},
            "fields": {"image": {"type": "image", "extensions": [".png"], "mode": "RGB"},
                       "gain": {"type": "value", "column": "gain", "dtype": "float32"}}}


def _mixed_rate_job(root: Path):
    """Clips of two lengths per class; the fixture then sets the field's ``sample_rate`` to 0,
    what an older h5batch wrote for a corpus of mixed rates (one today is refused)."""
    for cls, sr in (("low", 8000), ("high", 16000)):
        for i in range(3):
            p = root / "train" / cls / f"{cls}{i}.wav"
            p.parent.mkdir(parents=True, exist_ok=True)
            sf.write(p, (np.sin(np.arange(sr // 4 + 100 * i) * 0.05) * 9000).astype(np.int16), 8000)
    return {"source": {"root": str(root), "layout": "class_folders"},
            "fields": {"audio": {"type": "audio", "extensions": [".wav"]}}}


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("preview")
    out = {}
    for name, make in (("audio", _audio_job), ("image", _image_job), ("many", _many_classes_job),
                       ("mixed", _mixed_rate_job)):
        spec = make(d / name)
        spec.update(output={"path": str(d / f"{name}.h5"), "chunk_bytes": 4096}, cluster={"kind": "inprocess"},
                    policy={"max_reject_fraction": 0.5})
        convert(job_from_dict(spec, f"{name}.yaml"), ConvertOptions(progress=False))
        out[name] = d / f"{name}.h5"
        if name == "mixed":
            with h5py.File(out[name], "r+") as f:
                f["train/audio"].attrs["sample_rate"] = 0
    return out


class Page(HTMLParser):
    """What the test reads back from the DOM Chromium dumps."""

    def __init__(self):
        super().__init__()
        self.media: list[tuple[str, str]] = []  # (tag, src)
        self.counts: dict[str, dict[str, int]] = {}
        self.rejects: list[tuple[str, str]] = []
        self.check = ""
        self.cards: dict[str, int] = {}
        self._split = self._pre = None
        self._section = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("img", "audio"):
            self.media.append((tag, a.get("src", "")))
        if tag == "table" and a.get("class") == "counts":
            self._split = a["data-split"]
        if tag == "tr" and "data-count" in a and self._split is not None:
            self.counts.setdefault(self._split, {})[a["data-class"]] = int(a["data-count"])
        if tag == "tr" and a.get("class") == "reject":
            self.rejects.append((a["data-path"], a["data-stage"]))
        if tag == "h2" and a.get("id", "").startswith("split-"):
            self._section = a["id"][6:]
        if tag == "figure":
            self.cards[self._section] = self.cards.get(self._section, 0) + 1
        self._pre = a.get("id") == "h5b-check" if tag == "pre" else self._pre

    def handle_endtag(self, tag):
        if tag == "table":
            self._split = None
        if tag == "pre":
            self._pre = False

    def handle_data(self, data):
        if self._pre:
            self.check += data


def _load(chromium: str, index: Path, tmp: Path) -> tuple[Page, str, str]:
    res = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                          "--v=0", f"--user-data-dir={tmp / 'profile'}", "--virtual-time-budget=20000",
                          "--window-size=1280,900",
                          "--dump-dom", index.as_uri()], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    page = Page()
    page.feed(res.stdout)
    return page, res.stdout, res.stderr


def _file_facts(path: Path):
    with h5py.File(path) as f:
        names = list(f["class_names"].asstr()[...])
        counts = {s: {names[k]: int(c) for k, c in enumerate(np.bincount(f[s]["label"][...], minlength=len(names)))}
                  for s in json.loads(f.attrs["splits"])}
        rejects = sorted(zip(f["rejects/path"].asstr()[...], f["rejects/stage"].asstr()[...]))
    return counts, rejects


@pytest.mark.parametrize("kind", ["audio", "image"])
def test_the_page_loads_in_chromium_and_shows_the_file(kind, outputs, chromium, tmp_path):
    out, site = outputs[kind], tmp_path / "site"
    res = run_h5batch("preview", str(out), "--html", str(site), "--n", str(N), timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"wrote {site / 'index.html'}" in res.stderr
    page, dom, log = _load(chromium, site / "index.html", tmp_path)
    # The page's own check ran to the end: every image and clip decoded, no script error.
    check = json.loads(page.check)
    assert check["images"] == check["images_ok"] > 0 and not check["bad_images"], check
    assert check["audio"] == check["audio_ok"] and not check["bad_audio"] and not check["errors"], check
    assert not [ln for ln in log.splitlines() if ":CONSOLE" in ln or "Uncaught" in ln]
    assert check["width"] == 1280 and check["scroll_width"] <= 1280, check  # no sideways scroll
    # Every src is a relative path to a file inside the folder that decodes here too.
    assert len(page.media) == check["images"] + check["audio"]
    ds = {s: H5Dataset(out, s, as_float=False) for s in page.counts}
    wavs = 0
    for tag, src in page.media:
        assert src and not src.startswith(("/", "file:", "http")) and ".." not in src, src
        p = site / src
        assert p.is_file() and p.resolve().is_relative_to(site.resolve()), src
        if tag == "img":
            with Image.open(p) as im:
                im.load()
                assert im.format == "PNG" and min(im.size) > 0
            continue
        got, sr = sf.read(p, dtype="int16")
        split, stem = src.split("/")[-2:]
        i, field = re.fullmatch(r"(\d+)-(\w+)\.wav", stem).groups()
        want = ds[split][int(i)][field].numpy()
        assert sr == 8000 and got.dtype == want.dtype and np.array_equal(got, want), src
        wavs += 1
    assert wavs == (check["audio"] if kind == "audio" else 0) and (kind != "audio" or wavs > 0)
    # Content: the counts and rejects shown are the file's; N samples a split.
    counts, rejects = _file_facts(out)
    assert page.counts == counts
    assert sorted(page.rejects) == rejects and len(rejects) >= 1
    assert all(page.cards[s] == min(N, len(ds[s])) for s in ds)
    if kind == "audio":  # the text field, escaped: its markup is text on the page
        assert "yes &lt;b&gt;1&lt;/b&gt; &amp; more" in dom and "<b>1</b>" not in dom
        assert "broken.wav" in dom and "malformed WAV" in dom
    else:
        assert "<td>0.5</td>" in dom and "Pillow cannot identify it" in dom
    assert "<td>h5py</td>" in dom and "class_folders" in dom  # versions, job


def test_many_classes_show_the_largest_by_name_and_one_others_row(outputs, chromium, tmp_path):
    out, site = outputs["many"], tmp_path / "site"
    res = run_h5batch("preview", str(out), "--html", str(site), "--n", str(N), timeout=120)
    assert res.returncode == 0, res.stderr
    page, dom, _log = _load(chromium, site / "index.html", tmp_path)
    check = json.loads(page.check)
    assert check["images"] == check["images_ok"] > 0 and not check["errors"], check
    assert check["width"] == 1280 and check["scroll_width"] <= 1280, check
    # The counts: the 20 largest classes by name (ties in label order), then one "others" row.
    counts = _file_facts(out)[0]["train"]
    ranked = sorted(counts, key=lambda k: -counts[k])
    rest = ranked[TOP:]
    assert len(counts) == 120 and len(page.counts["train"]) == TOP + 1
    assert page.counts["train"] == {**{k: counts[k] for k in ranked[:TOP]},
                                    f"others ({len(rest)} classes)": sum(counts[k] for k in rest)}
    assert all(f"<td>{html.escape(k)}</td>" in dom for k in ranked[:TOP])  # names, as text
    assert "<summary>others (100 classes)</summary>" in dom
    # A card shows its label name and its value field, a float32 at its own precision.
    card = re.search(r'<figure class="card" data-sample="0">(.*?)</figure>', dom, re.S).group(1)
    assert "genre 000 &amp; co" in card and "gain: -14.312<" in card, card
    assert "<td>-14.312</td>" in dom and "-14.3120" not in dom


def test_unknown_sample_rate_gives_samples_and_a_rate_column_is_used(outputs, tmp_path):
    from h5batch.tools.preview import build_preview

    out = outputs["mixed"]
    lengths = [len(x["audio"]) for x in H5Dataset(out, "train")]
    with h5py.File(out) as f:
        assert f["train/audio"].attrs["sample_rate"] == 0  # what an older convert wrote for mixed rates
        rates = np.array([16000 if "high" in str(p) else 8000 for p in f["train/source"].asstr()[...]])
    text = Path(build_preview(str(out), str(tmp_path / "a"), n=100).index).read_text()
    assert all(f"{n} int16, {n} samples, sample rate unknown" in text for n in lengths)
    assert f"audio: {min(lengths)} samples to {max(lengths)} samples (sample rate unknown)" in text
    assert "<audio" not in text and "no player" in text  # a clip of unknown rate cannot play right
    # A per-sample rate column, and the true lengths of padded samples, where the file has them.
    copy = tmp_path / "rates.h5"
    shutil.copy(out, copy)
    with h5py.File(copy, "r+") as f:
        f["train"].create_dataset("audio_sample_rate", data=rates)
        f["train"].create_dataset("audio_lengths", data=np.array(lengths) - 50)
    s = build_preview(str(copy), str(tmp_path / "b"), n=100)
    text = Path(s.index).read_text()
    assert "sample rate unknown" not in text
    assert all(f", {(n - 50) / r:.2f} s at {r} Hz" in text for n, r in zip(lengths, rates))
    for i, (n, r) in enumerate(zip(lengths, rates)):
        info = sf.info(tmp_path / f"b/preview-files/train/{i:06d}-audio.wav")
        assert (info.frames, info.samplerate) == (n - 50, r)


def test_tombstoned_rows_are_left_out(outputs, tmp_path):
    from h5batch.tools.preview import build_preview

    out = tmp_path / "a.h5"
    shutil.copy(outputs["audio"], out)
    with h5py.File(out, "r+") as f:  # what `h5batch sync` leaves for two removed files
        f["train"].create_dataset("tombstones", data=np.array([0, 2], dtype=np.int64))
        labels = np.delete(f["train/label"][...], [0, 2])
        names = list(f["class_names"].asstr()[...])
    s = build_preview(str(out), str(tmp_path / "site"), ["train"], n=100)
    assert s.shown == {"train": len(labels)}
    page = Page()
    page.feed(Path(s.index).read_text())
    assert page.counts["train"] == {n: int((labels == k).sum()) for k, n in enumerate(names)}
    rows = re.findall(r"<tr><td>(\d+)</td><td>(\d+)</td>", Path(s.index).read_text())
    assert [int(r) for _i, r in rows] == [r for r in range(len(labels) + 2) if r not in (0, 2)]


def test_bad_input_is_one_line_and_exit_code_2(outputs, tmp_path, capsys):
    text = tmp_path / "notes.h5"
    text.write_text("hello")
    plain = tmp_path / "plain.h5"
    h5py.File(plain, "w").close()
    cases = [([str(text)], f"{text}: not an h5batch file"), ([str(plain)], f"{plain}: not an h5batch file"),
             ([str(tmp_path / "none.h5")], "no such file"),
             ([str(outputs["image"]), "--split", "dev"], "no split 'dev' (splits: train, val)"),
             ([str(outputs["image"]), "--n", "0"], "--n must be at least 1")]
    for args, message in cases:
        assert main(["preview", *args, "--html", str(tmp_path / "site")]) == 2, args
        err = capsys.readouterr().err
        assert err.startswith("h5batch preview: ") and message in err and err.count("\n") == 1, err
    assert main(["inspect", str(outputs["image"]), "--sample", "99"]) == 2
    assert "split 'train' has 10 samples; no sample 99" in capsys.readouterr().err
    assert main(["inspect", str(outputs["image"]), "--sample", "0", "--split", "dev"]) == 2
    assert "no split 'dev'" in capsys.readouterr().err


def test_inspect_one_sample(outputs, capsys):
    out = outputs["audio"]
    with h5py.File(out) as f:
        src = list(f["train/source"].asstr()[3])
        crc = f["train/checksum"][3]
        label = f["class_names"].asstr()[f["train/label"][3]]
    assert main(["inspect", str(out), "--sample", "3"]) == 0
    text = capsys.readouterr().out
    assert f"sample 3 of {len(H5Dataset(out, 'train'))} (file row 3)" in text and f"({label})" in text
    assert all(f"source: {p}" in text for p in src)
    assert f"audio={int(crc[0]):08x}, caption={int(crc[1]):08x}" in text
    want = H5Dataset(out, "train", as_float=False)[3]["audio"].numpy()
    assert f"shape ({len(want)},) int16, min {want.min()}, max {want.max()}" in text
    assert "caption (text): 'no <b>3</b> & more'" in text
    assert main(["inspect", str(outputs["image"]), "--sample", "-1", "--split", "val", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["sample"] == 3 and rec["split"] == "val" and rec["label_name"] == "dog"
    assert rec["fields"]["score"] == {"modality": "value", "shape": [], "dtype": "float32", "value": 0.5}
    assert rec["fields"]["image"]["shape"][2] == 3 and rec["source"] == ["val/dog/valdog1.png"]
    # float32 at its own precision, as the preview's cards print it
    assert main(["inspect", str(outputs["many"]), "--sample", "0"]) == 0
    text = capsys.readouterr().out
    assert "-14.312" in text and "-14.3120" not in text
