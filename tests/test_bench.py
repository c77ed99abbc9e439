"""``h5batch bench``: its baselines and peers hold the source's samples, its rows run in
processes of their own, its targets are judged on the right rows, and a tiny run writes its
table, checks and plots. No speed is asserted: speed is the bench's business."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from h5batch import commands
from h5batch.bench import corpus, loaders, measure, report, writers
from h5batch.bench.suite import Bench, BenchConfig, h5_equal
from h5batch.cli import build_parser

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """A 16-pair paired-audio corpus, its manifest, files, fields and decoded reference."""
    c = corpus.paired_audio(tmp_path_factory.mktemp("bench-cache"), 16)
    m = c.manifest()
    return c, corpus.item_paths(m), tuple(c.job("x.h5").fields.items()), corpus.decode_items(c, m)


def _float(ref: dict, idx) -> dict:
    return {k: np.stack([corpus.to_float(v[i]) for i in idx]) for k, v in ref.items()}


def test_corpus_job_and_reference(pairs, tmp_path):
    c, items, fields, ref = pairs
    assert len(items) == 16 and set(ref) == {"data", "target"}
    assert all(a.shape == (corpus.AUDIO_LENGTH,) and a.dtype == np.int16 for a in ref["data"])
    job = c.job_dict(str(tmp_path / "x.h5"), "gzip")
    assert job["output"] == {"path": str(tmp_path / "x.h5"), "codec": "gzip"} and "cluster" not in job
    assert c.job("x.h5").fields["data"].length == corpus.AUDIO_LENGTH
    other = corpus.paired_audio(tmp_path, 4, 32000)  # --rate 32000: a corpus of its own name
    assert other.name == "paired_audio_4_32k" and other.job("x.h5").fields["data"].length == 64000


def test_naive_recipe_stores_and_reads_the_source(pairs, tmp_path):
    c, items, fields, ref = pairs
    out = str(tmp_path / "naive.h5")
    r = writers.naive_convert(items, fields, out)
    assert r["samples"] == 16 and r["bytes_decoded"] == 16 * 2 * 2 * corpus.AUDIO_LENGTH
    with h5py.File(out, "r") as f:
        ds = f[writers.NAIVE_GROUP]["00000003"]["data"]
        assert len(f[writers.NAIVE_GROUP]) == 16 and ds.compression == "gzip" and ds.chunks is not None
    assert all(np.array_equal(a, b) for a, b in zip(writers.naive_read_all(out, "target"), ref["target"]))
    batch = next(iter(loaders.naive(out, ["data", "target"], 16, True, workers=0, batch=16)))
    order = np.argsort([bytes(row) for row in batch["data"].numpy()])  # shuffled: compare as sets
    want = _float(ref, range(16))
    assert batch["data"].dtype == torch.float32
    assert np.array_equal(batch["data"].numpy()[order], want["data"][np.argsort([bytes(x) for x in want["data"]])])


def test_raw_files_and_the_memmap_limit_deliver_the_same_samples(pairs, tmp_path):
    c, items, fields, ref = pairs
    raw = loaders.RawDataset(items, fields)
    mm = loaders.MemmapDataset(loaders.write_memmaps(ref, str(tmp_path / "mm")))
    got = mm.__getitems__([9, 2, 5])  # one sorted gather per field
    for name in ("data", "target"):
        assert torch.equal(got[name], torch.stack([raw[i][name] for i in (2, 5, 9)]))
        assert np.array_equal(got[name].numpy(), _float(ref, (2, 5, 9))[name])
    assert measure.drain(loaders.memmap(str(tmp_path / "mm"), workers=2, batch=5)) == 16
    assert measure.drain(loaders.raw(items, fields, True, workers=0, batch=5), consume=True) == 16


def test_a_read_row_runs_in_a_new_interpreter_and_reads_whole_epochs(pairs, tmp_path):
    c, items, fields, ref = pairs
    folder = loaders.write_memmaps(ref, str(tmp_path / "mm"))
    r = measure.call(measure.read_row, loaders.memmap, {"folder": folder, "workers": 0, "batch": 5}, 3)
    assert r["result"]["samples"] == 48 and r["peak_rss"] > 0 and r["wall"] > r["result"]["seconds"]
    with pytest.raises(RuntimeError, match="FileNotFoundError"):
        measure.call(measure.read_row, loaders.memmap, {"folder": str(tmp_path / "none"), "workers": 0, "batch": 5}, 1)


def test_run_samples_the_whole_trees_memory_and_counts_its_cpu():
    code = ("import json, subprocess, sys; subprocess.run([sys.executable, '-c', "
            "\"import time; b = bytearray(120_000_000); time.sleep(0.5)\"]); print(json.dumps({'ok': 1}))")
    r = measure.run([sys.executable, "-c", code])
    assert r["result"] == {"ok": 1} and r["peak_rss"] >= 120_000_000 and r["cpu_seconds"] > 0


@pytest.mark.skipif(not writers.available("webdataset")[0], reason="webdataset not installed (requirements-peers.txt)")
def test_webdataset_peer_holds_every_sample_once(pairs, tmp_path):
    c, items, fields, ref = pairs
    r = writers.wds_convert(items, fields, str(tmp_path / "wds"), processes=2, maxcount=4)
    assert r["samples"] == 16 and len(list((tmp_path / "wds").glob("*.tar"))) == 4
    loader = loaders.webdataset(str(tmp_path / "wds"), ["data", "target"], 2, 5, keys=True)
    assert loaders.verify(loader, ref) == {"ok": True, "samples": 16, "missing": 0, "duplicates": 0, "mismatched": 0}


@pytest.mark.skipif(not writers.available("litdata")[0], reason="litdata not installed (requirements-peers.txt)")
def test_litdata_peer_holds_every_sample_once(pairs, tmp_path):
    c, items, fields, ref = pairs
    assert writers.litdata_convert(items, fields, str(tmp_path / "lit"), num_workers=2)["samples"] == 16
    loader = loaders.litdata(str(tmp_path / "lit"), ["data", "target"], 0, 5, keys=True)
    assert loaders.verify(loader, ref)["ok"]


def test_verify_catches_duplicates_and_mismatches():
    ref = {"x": list(np.arange(12, dtype=np.int16).reshape(3, 4))}
    f = {k: np.stack([corpus.to_float(a) for a in v]) for k, v in ref.items()}["x"]
    good = [{"__key__": ["00000000", "00000002"], "x": torch.from_numpy(f[[0, 2]])},
            {"__key__": ["00000001"], "x": torch.from_numpy(f[[1]])}]
    assert loaders.verify(good, ref)["ok"]
    v = loaders.verify([good[0], good[0]], ref)
    assert not v["ok"] and v["missing"] == 1 and v["duplicates"] == 2
    assert loaders.verify([{"__key__": ["00000000"], "x": torch.zeros(1, 4)}], ref)["mismatched"] == 1


def _results(**rates: float) -> dict:
    """Results with one record per ``phase/method/codec/variant`` key (workers 0 for reads)."""
    records = []
    for key, rate in rates.items():
        phase, method, codec, variant = (key.split("/") + ["", ""])[:4]
        records.append({"phase": phase, "corpus": "c", "method": method, "codec": codec, "variant": variant,
                        "workers": 0 if phase == "read" else None, "runs": [{}], "rate": {"median": rate}})
    return {"main_corpus": "c", "records": records, "corpora": {"c": {}},
            "config": {"workers": [0], "peers": True}}


def test_targets_are_ratios_of_rows_of_the_same_run():
    res = _results(**{"read/h5batch/auto/chunk-shuffle": 1000.0, "read/naive/gzip/random": 50.0,
                      "read/raw-files//random": 400.0, "read/h5batch/auto/ds.loader": 1400.0,
                      "read/memmap//random": 2000.0, "read/webdataset//shard+buffer": 300.0,
                      "read/litdata//default": 500.0, "convert/h5batch/auto": 100.0, "convert/naive/gzip": 20.0,
                      "convert/webdataset-2p": 40.0, "convert/litdata": 60.0})
    t = {x["target"]: x for x in report.targets(res)}
    assert t["read >= 10x naive HDF5 (num_workers=0)"]["met"] is True
    assert t["read >= 2x raw files (num_workers=0)"]["value"] == pytest.approx(2.5)
    assert t["plain DataLoader >= 2x raw files (num_workers=0)"]["met"] is None  # not measured
    assert t["ds.loader >= 0.7x the memmap limit (num_workers=0)"]["value"] == pytest.approx(0.7)
    best = t["read >= 1.5x the best peer (num_workers=0)"]
    assert best["value"] == pytest.approx(2.0) and "litdata default" in best["detail"]
    assert t["conversion >= 10x naive"]["met"] is False and t["conversion >= 10x naive"]["value"] == pytest.approx(5)
    writer = t["conversion >= 2x the best peer writer"]
    assert writer["value"] == pytest.approx(100 / 60) and "(litdata)" in writer["detail"]
    assert "conversion gzip >= 2.5x naive" in t and not any("FSDD" in k for k in t)


def test_a_verdict_inside_the_spread_is_flagged():
    """9.6x naive from the medians, 8.0-12.0x over the repetitions: MISSED, within the spread."""
    res = _results(**{"read/h5batch/auto/chunk-shuffle": 960.0, "read/naive/gzip/random": 100.0})
    res["records"][0]["rate"].update(n=2, min=880.0, max=1080.0)
    res["records"][1]["rate"].update(n=2, min=90.0, max=110.0)
    t = {x["target"]: x for x in report.targets(res)}["read >= 10x naive HDF5 (num_workers=0)"]
    assert t["met"] is False and t["within_spread"] is True and t["bounds"] == pytest.approx((8.0, 12.0))


def test_cli_registers_bench():
    args = build_parser().parse_args(["bench", "--quick", "--codecs", "gzip,none", "--workers", "0", "--images", "0"])
    assert args.handler is commands.bench.run and args.codecs == ("gzip", "none") and args.workers == (0,)
    assert args.images == 0
    for bad in (["--codecs", "brotli"], ["--pairs", "0"], ["--images", "-1"]):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["bench", *bad])


def test_tiny_bench_writes_its_table_checks_and_plots(tmp_path):
    """Every row of the main corpus once, as small as it goes: 16 pairs, one codec, one
    repetition, no workers, no image corpus."""
    cfg = BenchConfig(pairs=16, images=0, scale=2, reps=1, codecs=("auto",), workers=(0,), read_samples=16,
                       warmup=False, keep=True, consume=True, cache=str(tmp_path / "cache"),
                       out_root=str(tmp_path / "results"))
    results = Bench(cfg, log=open(os.devnull, "w")).run()
    paths = report.write(results)
    data = json.loads(Path(paths["json"]).read_text())
    main = data["main_corpus"]
    keys = {r["key"] for r in data["records"]}
    assert keys == {f"convert/{main}/h5batch/auto", f"convert/{main}/naive/gzip", f"convert/{main}/h5batch/auto/x2",
                    *(f"read/{main}/{k}/w0" for k in ("h5batch/auto/chunk-shuffle", "h5batch/auto/random",
                                                      "h5batch/auto/plain-dataloader", "h5batch/auto/ds.loader",
                                                      "naive/gzip/random", "raw-files/random", "memmap/random"))}
    for r in data["records"]:
        run = r["runs"][0]
        assert len(r["runs"]) == 1 and run["peak_rss"] > 0 and r["rate"]["median"] > 0, r["key"]
        want = 32 if r["variant"] == "x2" else 16 * (r["info"]["epochs"] if r["phase"] == "read" else 1)
        assert run["items"] == want, r["key"]
        if r["phase"] == "convert":  # a whole command: its own work is part of its wall time
            assert 0 < run["work_seconds"] < run["seconds"] and run["output_bytes"] > 0, r["key"]
    assert [c["check"] for c in data["checks"]] == [f"{main}: h5batch auto output equals the decoded source",
                                                    f"{main}: naive output equals the decoded source"]
    assert all(c["ok"] for c in data["checks"])
    # the check compares every stored sample: one changed sample fails it
    c = corpus.paired_audio(cfg.cache, 16)
    m = c.manifest()
    ref = corpus.decode_items(c, m)
    out = os.path.join(results["out_dir"], "work", "h5", f"{main}-auto.h5")
    assert h5_equal(out, m, ref)
    ref["target"][7] = ref["target"][7] + 1
    assert not h5_equal(out, m, ref)
    md = Path(paths["markdown"]).read_text()
    t = {x["target"]: x for x in data["targets"]}
    assert t["read >= 10x naive HDF5 (num_workers=0)"]["value"] > 0 and t["conversion >= 10x naive"]["value"] > 0
    assert "| target | measured | range | status | detail |" in md and "### Conversion" in md
    assert "| h5batch | auto → none | x1 |" in md and "| memmap | — | random | 0 |" in md
    assert "every batch summed" in md and "2 of 2 checks passed" in md
    assert data["plots"] == [f"read_{main}.png", f"convert_{main}.png"]
    for p in data["plots"]:
        assert Path(results["out_dir"], p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # --render rebuilds the markdown and plots from results.json alone, measuring nothing
    os.remove(paths["markdown"])
    args = build_parser().parse_args(["bench", "--render", results["out_dir"]])
    assert args.handler(args) == 0 and Path(paths["markdown"]).read_text() == md


@pytest.mark.parametrize("script", sorted(p.name for p in (REPO / "benchmarks").glob("*.py")
                                         if "__main__" in p.read_text()))  # not the modules they share
def test_each_benchmark_script_starts(script):
    """benchmarks/ is outside the package: each script runs from the repository root."""
    r = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "usage:" in r.stdout, r.stderr


def test_s3_rows_count_the_servers_gets_and_bytes(tmp_path):
    """``--s3``: moto's recorder counts what each epoch fetched; a fresh process on the filled
    cache fetches nothing; the table and the target render."""
    pytest.importorskip("moto")
    pytest.importorskip("obstore")
    from h5batch.bench import s3

    cfg = BenchConfig(pairs=64, images=0, scale=1, reps=1, codecs=("auto",), workers=(0,), read_samples=64,
                       warmup=False, keep=True, cache=str(tmp_path / "cache"), out_root=str(tmp_path / "results"))
    bench = Bench(cfg, log=open(os.devnull, "w"))
    spec = bench._corpora()[0]
    bench._convert_phase(spec)
    h5 = bench.path("h5", f"{spec['corpus'].name}-auto.h5")
    s3.measure_rows(bench, "c", h5, None, reps=1)
    rows = {r.variant: r.runs[0] for r in bench.records.values() if r.phase == "s3"}
    assert set(rows) == {"first epoch", "second epoch, fresh process",
                         *(f"bounded cache, epoch {e}" for e in (1, 2, 3))}
    assert all(r["items"] == 64 for r in rows.values())
    # every byte once, plus the 256 KiB metadata blocks that overlap data (a larger share of a small file)
    assert rows["first epoch"]["gets"] > 0 and 0.99 <= rows["first epoch"]["fetched_over_stored"] <= 1.2
    assert rows["second epoch, fresh process"]["gets"] == 0
    results = {"records": [r.to_dict() for r in bench.records.values()]}
    assert report.s3_table(results)[2].startswith("| h5batch | first epoch |")
    last = rows["bounded cache, epoch 3"]["fetched_over_stored"]
    line = report.s3_table(results)[-1]
    assert line.startswith("| h5batch | bounded cache, epoch 3 |") and line.endswith(f"| {last:.3f} |")
