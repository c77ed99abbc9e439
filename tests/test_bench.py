"""h5batch.bench: its pieces, and a tiny end-to-end run (no timing is asserted: the bench checks
speed targets, tests only check that what it measures and writes is right)."""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import time

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from h5batch import commands
from h5batch.bench import baselines, corpus, fresh_reads, loaders, measure, peers, report, strict
from h5batch.bench.records import STRICT_STORAGES
from h5batch.bench.suite import Bench, quick_config
from h5batch.cli import build_parser


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """A 16-pair paired-audio corpus (0.5 s, so tiny) as a bench Corpus + its decoded reference."""
    cache = tmp_path_factory.mktemp("bench-cache")
    c = corpus.paired_audio(cache, 16)
    m = c.manifest()
    return c, m, corpus.decode_items(c, m)


def test_corpus_job_and_reference(pairs):
    c, m, ref = pairs
    assert len(m.items) == 16
    assert set(ref) == {"data", "target"}
    assert ref["data"].shape == (16, corpus.AUDIO_LENGTH) and ref["data"].dtype == np.int16
    assert corpus.sample_nbytes(ref) == 2 * corpus.AUDIO_LENGTH * 2
    job = c.job("/tmp/never-written.h5", "gzip")
    assert job.output.codec == "gzip" and job.fields["data"].length == corpus.AUDIO_LENGTH


def test_paired_audio_at_another_rate(tmp_path):
    """``--rate 32000`` (the rate of issue 3's reference corpus): 2 s clips of 64,000 samples,
    a corpus of its own name, and the job's fixed length follows."""
    c = corpus.paired_audio(tmp_path, 4, 32000)
    assert c.name == "paired_audio_4_32k" and c.extra["length"] == 64000
    ref = corpus.decode_items(c, c.manifest())
    assert ref["data"].shape == (4, 64000) and ref["target"].shape == (4, 64000)
    assert c.job("/tmp/never-written.h5").fields["data"].length == 64000
    assert corpus.paired_audio(tmp_path, 4).name == "paired_audio_4"  # the default rate keeps its name


def test_naive_baseline_equals_source(pairs, tmp_path):
    c, m, ref = pairs
    items = corpus.item_paths(m)
    fields = tuple(c.job(str(tmp_path / "x.h5")).fields.items())
    out = tmp_path / "naive.h5"
    r = baselines.naive_convert(items, fields, str(out))
    assert r["samples"] == 16 and r["bytes_decoded"] == ref["data"].nbytes + ref["target"].nbytes
    import h5py

    with h5py.File(out, "r") as f:
        g = f[baselines.NAIVE_GROUP]
        assert len(g) == 16
        ds = g["00000003"]["data"]
        assert ds.compression == "gzip" and ds.chunks is not None  # the recipe: gzip, chunks=True
    for name in ("data", "target"):
        got = baselines.naive_read_all(str(out), name)
        assert all(np.array_equal(a, b) for a, b in zip(got, ref[name], strict=True))
    # Read back through a DataLoader: float32 scaled like H5Dataset(as_float=True).
    ds = baselines.NaiveDataset(str(out), ["data", "target"], 16)
    batch = next(iter(DataLoader(ds, batch_size=16, collate_fn=baselines.float_collate)))
    assert batch["data"].dtype == torch.float32
    np.testing.assert_array_equal(batch["data"].numpy(), ref["data"].astype(np.float32) / 32768)


def test_raw_and_memmap_datasets_match(pairs, tmp_path):
    c, m, ref = pairs
    fields = tuple(c.job(str(tmp_path / "x.h5")).fields.items())
    raw = baselines.RawFileDataset(corpus.item_paths(m), fields)
    mm = baselines.MemmapDataset(baselines.write_memmaps(ref, str(tmp_path / "mm")))
    assert len(raw) == len(mm) == 16
    a = baselines.float_collate([raw[i] for i in (5, 2, 9)])
    b = mm.__getitems__([5, 2, 9])
    for name in ("data", "target"):
        assert torch.equal(a[name], b[name])
    loader = DataLoader(mm, batch_size=8, shuffle=True, collate_fn=baselines.passthrough)
    assert measure.drain(loader) == 16
    # The way most scripts read raw files (soundfile, default_collate): the same batches.
    typical = baselines.TypicalRawDataset(corpus.item_paths(m), fields)
    assert baselines.TypicalRawDataset.supports(fields)
    got = next(iter(DataLoader(typical, batch_size=16, num_workers=1)))
    for name in ("data", "target"):
        assert torch.equal(got[name], mm.__getitems__(range(16))[name])


def test_strict_memmap_is_one_sorted_float32_gather(pairs, tmp_path):
    """The strict limit: float32 x / 32768 of the same samples, rows in ascending index order,
    as plain (not shared) tensors; through a 2-worker DataLoader torch copies them over."""
    c, m, ref = pairs
    ds = strict.StrictMemmapDataset(strict.write_float_memmaps(ref, str(tmp_path / "strict")))
    got = ds.__getitems__([9, 2, 5])
    for name in ("data", "target"):
        assert got[name].dtype == torch.float32 and not got[name].is_shared()
        np.testing.assert_array_equal(got[name].numpy(), ref[name][[2, 5, 9]].astype(np.float32) / 32768)
    loader = DataLoader(ds, batch_size=8, shuffle=True, num_workers=2, collate_fn=baselines.passthrough)
    assert measure.drain(loader) == 16
    with pytest.raises(ValueError, match="float32"):
        strict.write_float_memmaps({"x": np.zeros((2, 3), np.float32)}, str(tmp_path / "bad"))


def test_strict_targets_ask_07x_in_process_and_15x_with_workers():
    res = _fake_results(h5_read=1000.0, naive_read=50.0)
    res["config"]["workers"] = [0, 2]
    for nw, limit, h in ((0, 2000.0, 1500.0), (2, 1000.0, 1400.0)):
        res["records"].append({"phase": "read", "corpus": "c", "method": "memmap-strict", "codec": "",
                               "variant": "random", "workers": nw, "runs": [{}], "rate": {"median": limit}})
        res["records"] += [{"phase": "read", "corpus": "c", "method": "h5batch", "codec": "auto",
                            "variant": f"ds.loader {d} {'fixed' if f else 'variable'}", "workers": nw,
                            "runs": [{}], "rate": {"median": h}} for d, f in STRICT_STORAGES]
    t = {x["target"]: x for x in report.targets(res)}
    a = t["read float32 variable >= 0.7x strict memmap (num_workers=0)"]
    assert a["met"] is True and a["value"] == pytest.approx(0.75)
    b = t["read int16 fixed >= 1.5x strict memmap (num_workers=2)"]
    assert b["met"] is False and b["value"] == pytest.approx(1.4)
    # a run from before issue 19 (its memmap row was called "memmap") still renders
    res["records"].append({"phase": "read", "corpus": "c", "method": "memmap", "codec": "", "variant": "random",
                           "workers": 0, "runs": [{}], "rate": {"median": 1250.0}})
    assert t and {x["target"]: x for x in report.targets(res)}[
        "read >= 0.5x memmap int16 row-wise (num_workers=0)"]["value"] == pytest.approx(0.8)


def test_read_rows_are_recipes_that_pickle_and_read_the_same_samples(pairs, tmp_path):
    """Every read row is a Recipe (a module-level builder and its arguments): pickled, it
    builds the same loader, which reads every sample of the corpus once."""
    c, m, ref = pairs
    fields = tuple(c.job(str(tmp_path / "x.h5")).fields.items())
    mm = baselines.write_memmaps(ref, str(tmp_path / "mm"))
    for recipe in (loaders.Recipe(loaders.memmap_rowwise, {"paths": mm, "workers": 0, "batch": 5}),
                   loaders.Recipe(loaders.raw_strict, {"items": corpus.item_paths(m), "fields": fields,
                                                       "workers": 0, "batch": 5})):
        again = pickle.loads(pickle.dumps(recipe))
        assert again == recipe and "items=" not in str(recipe)
        got = torch.cat([b["data"] for b in again()]).numpy()
        want = ref["data"].astype(np.float32) / 32768
        assert sorted(map(bytes, got)) == sorted(map(bytes, want)), recipe


def test_a_zero_worker_row_runs_in_a_child_forked_from_a_clean_interpreter(pairs, tmp_path):
    c, m, ref = pairs
    mm = baselines.write_memmaps(ref, str(tmp_path / "mm"))
    row = fresh_reads.FreshRead(loaders.Recipe(loaders.memmap_rowwise, {"paths": mm, "workers": 0, "batch": 5}))
    bad = fresh_reads.FreshRead(loaders.Recipe(loaders.memmap_rowwise, {"paths": {"data": str(tmp_path / "no.npy")},
                                                                         "workers": 0, "batch": 5}))
    with fresh_reads.Zygote() as zygote:
        a, b = row.run(zygote, 3), row.run(zygote, 3)
        assert a["samples"] == b["samples"] == 48 and a["warmup_samples"] == 16
        assert len({a["pid"], b["pid"], os.getpid()}) == 3  # a process of its own per row
        with pytest.raises(RuntimeError, match=r"memmap_rowwise\(.*no\.npy.*failed in its own process.*"
                                               r"FileNotFoundError"):
            bad.run(zygote, 1)
        s = row.sample(zygote, 2, 10.0)  # the zygote outlives a failed row
    assert s.items == 32 and s.nbytes == 320.0 and s.seconds > 0 and s.peak_rss >= s.baseline_rss > 0
    assert s.extra["fresh_process"] and s.extra["warmup_samples"] == 16 and s.extra["faults_per_batch"] >= 0


def test_a_conversion_row_runs_in_a_child_after_its_warm_up(pairs, tmp_path):
    """bench/converts.py: a conversion row is timed in a child forked from a clean interpreter,
    after an untimed conversion of a small corpus whose output it removes; the zygote samples
    the child's tree RSS from the moment timing starts."""
    import h5py

    from h5batch.bench import convert_child as converts
    from h5batch.bench import zygote

    c, m, ref = pairs
    small = corpus.paired_audio(tmp_path / "cache", 4)
    out, warm_out = str(tmp_path / "out.h5"), str(tmp_path / "warm.h5")
    job = {"fn": converts.h5batch_convert, "args": (c.job(out, "none", {"kind": "auto"}),),
           "warm": (small.job(warm_out, "none", {"kind": "auto"}),), "warm_out": warm_out}
    with zygote.Zygote(preload=zygote.CONVERT_PRELOAD) as z:
        r = z.call(converts.convert_row, job, "h5batch-auto")
        (tmp_path / "a-file").write_text("")  # an output folder that cannot be made
        bad = {**job, "args": (c.job(str(tmp_path / "a-file" / "x.h5"), "none", {"kind": "auto"}),)}
        with pytest.raises(RuntimeError, match="h5batch-auto failed in its own process"):
            z.call(converts.convert_row, bad, "h5batch-auto")
        again = z.call(converts.convert_row, {**job, "warm": None}, "h5batch-auto")  # outlives a failed row
    assert r["pid"] != os.getpid() and again["pid"] not in (r["pid"], os.getpid())
    assert r["result"]["samples"] == 16 and r["seconds"] > 0 and r["cpu_seconds"] > 0
    assert r["torch_imported"] is False  # h5batch's rows run without torch, as `h5batch convert` does
    # the machine's CPU time by state over the timed run (/proc/stat), beside the row's own
    m = r["machine"]
    assert set(m) == {"busy", "idle", "iowait", "steal"} and m["busy"] > 0 and min(m.values()) >= 0
    assert m["busy"] + m["idle"] + m["iowait"] + m["steal"] <= 2.5 * (os.cpu_count() or 1) * r["seconds"] + 0.1
    assert r["peak_rss"] >= r["baseline_rss"] > 0
    assert not os.path.exists(warm_out)  # the warm-up's output is gone, the timed one is there
    with h5py.File(out, "r") as f:
        got = np.concatenate([f[s]["data"][()] for s in json.loads(f.attrs["splits"])])
    assert sorted(map(bytes, got)) == sorted(map(bytes, ref["data"]))


def test_conversion_rounds_begin_with_an_untimed_one(tmp_path):
    """bench/converts.py: with warm-up on, every row runs once untimed on the main corpus,
    then ``reps`` timed rounds, the order rotated each round; with it off, only the latter."""
    from types import SimpleNamespace

    for warmup, want in ((True, [("a", False), ("b", False), ("b", True), ("a", True), ("a", True), ("b", True)]),
                         (False, [("a", True), ("b", True), ("b", True), ("a", True)])):
        bench = Bench(quick_config(reps=2, warmup=warmup, out_root=str(tmp_path)), log=open(os.devnull, "w"))
        calls: list = []
        bench._convert_plan = lambda spec, peer_ok, c=calls: [(n, lambda timed, n=n: c.append((n, timed))) for n in "ab"]
        bench._convert_phase({"corpus": SimpleNamespace(name="c")}, {})
        assert calls == want, warmup


def test_float_collate_pads_variable_lengths():
    out = baselines.float_collate([{"a": np.array([1, 2, 3], np.int16), "k": "x"},
                                   {"a": np.array([4], np.int16), "k": "y"}])
    assert out["a"].shape == (2, 3) and out["k"] == ["x", "y"]
    assert out["a_lengths"].tolist() == [3, 1]
    assert out["a"][1].tolist() == [4 / 32768, 0.0, 0.0]


def test_peak_rss_sees_a_child_process():
    import subprocess
    import sys

    code = "import time; b = bytearray(200 * 2**20); time.sleep(0.6)"
    with measure.PeakRss(interval=0.02) as mem:
        subprocess.run([sys.executable, "-c", code], check=True)
    assert mem.peak - mem.baseline > 150 * 2**20
    assert mem.peak_procs >= 2


def test_measure_command_reports_the_whole_trees_peak_and_exit_code(capsys):
    """``python -m h5batch.bench.measure -- CMD``: a grandchild holding 200 MB counts, and the
    command's exit code comes back."""
    child = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
             "'import time; b = bytearray(200_000_000); time.sleep(1.0)']); sys.exit(3)")
    code = measure.main(["--", sys.executable, "-c", child])
    out = capsys.readouterr().out
    assert code == 3
    peak_mb = float(out.split("process tree ")[1].split(" MB")[0].replace(",", ""))
    assert peak_mb >= 200, out
    assert "(2 processes)" in out, out


def test_drain_can_consume_every_batch():
    assert measure.touch({"x": torch.ones(2, 3), "label": torch.tensor([1, 2]), "__key__": ["a", "b"]}) == 9.0
    assert measure.touch((torch.ones(4), np.ones(2))) == 6.0

    summed = []

    class Column:  # a tensor-like column that records being read
        ndim = 2

        def __init__(self, name):
            self.name = name

        def sum(self):
            summed.append(self.name)
            return 1.0

    batches = [{"x": Column(f"x{i}"), "__key__": ["k"] * 4} for i in range(3)]
    assert measure.drain(batches, count=lambda b: 4) == 12 and summed == []
    assert measure.drain(batches, count=lambda b: 4, consume=True) == 12 and summed == ["x0", "x1", "x2"]


def test_summarize_and_timed():
    s = measure.summarize([3.0, 1.0, 2.0])
    assert s == {"median": 2.0, "min": 1.0, "max": 3.0, "spread": 1.0, "n": 3}
    sample, result = measure.timed(lambda: time.sleep(0.01) or 7, lambda r: r, 70.0)
    assert result == 7 and sample.items == 7 and sample.seconds >= 0.01 and sample.rate > 0


@pytest.mark.skipif(not peers.available("webdataset")[0], reason="webdataset not installed (requirements-peers.txt)")
def test_webdataset_peer_roundtrip(pairs, tmp_path):
    c, m, ref = pairs
    fields = tuple(c.job(str(tmp_path / "x.h5")).fields.items())
    r = peers.wds_convert(corpus.item_paths(m), fields, str(tmp_path / "wds"), processes=2, maxcount=4)
    assert r["samples"] == 16 and r["shards"] >= 4
    for assembly in peers.ASSEMBLIES:  # the documented default_collation, and h5batch's collate
        loader = peers.wds_loader(str(tmp_path / "wds"), ["data", "target"], 0, 5, keys=True, assembly=assembly)
        v = peers.verify(loader, ref, 16)
        assert v == {"ok": True, "samples": 16, "missing": 0, "duplicates": 0, "mismatched": 0}, assembly
        batch = next(iter(loader))
        assert batch["data"].dtype == torch.float32 and batch["data"].shape == (5, *ref["data"].shape[1:])


@pytest.mark.skipif(not peers.available("litdata")[0], reason="litdata not installed (requirements-peers.txt)")
def test_litdata_peer_roundtrip(pairs, tmp_path):
    c, m, ref = pairs
    fields = tuple(c.job(str(tmp_path / "x.h5")).fields.items())
    out = str(tmp_path / "lit")
    r = peers.litdata_convert(corpus.item_paths(m), fields, out, num_workers=2, start_method="fork")
    assert r["samples"] == 16 and r["output_bytes"] > ref["data"].nbytes
    for assembly in peers.ASSEMBLIES:
        for batch_decode in ("auto", 0):
            loader = peers.litdata_loader(out, ["data", "target"], 0, 5, keys=True, batch_decode=batch_decode,
                                          cache_dir=str(tmp_path / f"cache-{assembly}-{batch_decode}"),
                                          assembly=assembly)
            v = peers.verify(loader, ref, 16)
            assert v == {"ok": True, "samples": 16, "missing": 0, "duplicates": 0, "mismatched": 0}, \
                (assembly, batch_decode)
    with pytest.raises(ValueError, match="assembly"):
        peers.litdata_loader(out, ["data"], 0, assembly="mine")


def test_verify_catches_duplicates_and_mismatches():
    ref = {"x": np.arange(12, dtype=np.int16).reshape(3, 4)}
    good = [{"__key__": ["00000000", "00000002"], "x": torch.from_numpy(ref["x"][[0, 2]] / np.float32(32768))},
            {"__key__": ["00000001"], "x": torch.from_numpy(ref["x"][[1]] / np.float32(32768))}]
    assert peers.verify(good, ref, 3)["ok"]
    bad = [good[0], good[0]]
    v = peers.verify(bad, ref, 3)
    assert not v["ok"] and v["missing"] == 1 and v["duplicates"] == 2
    wrong = [{"__key__": ["00000000"], "x": torch.zeros(1, 4)}]
    assert peers.verify(wrong, ref, 1)["mismatched"] == 1


def _fake_results(h5_read: float, naive_read: float) -> dict:
    def rec(phase, method, rate, codec="", variant="", workers=None):
        return {"phase": phase, "corpus": "c", "method": method, "codec": codec, "variant": variant,
                "workers": workers, "runs": [{}], "rate": {"median": rate}}

    records = [rec("read", "h5batch", h5_read, "auto", "chunk-shuffle", 0),
               rec("read", "naive", naive_read, "gzip", "random", 0),
               rec("convert", "h5batch", 100.0, "auto"), rec("convert", "naive", 20.0, "gzip")]
    return {"main_corpus": "c", "records": records,
            "config": {"workers": [0], "peers": False, "dask_workers": 2}}


def test_targets_are_marked_met_or_missed():
    t = {x["target"]: x for x in report.targets(_fake_results(h5_read=1000.0, naive_read=50.0))}
    assert t["read >= 10x naive HDF5 (num_workers=0)"]["met"] is True
    assert t["read >= 2x raw files (num_workers=0)"]["met"] is None  # not measured
    assert t["conversion auto >= 10x naive"]["met"] is False  # 5x
    assert t["conversion auto >= 10x naive"]["value"] == pytest.approx(5.0)
    t = {x["target"]: x for x in report.targets(_fake_results(h5_read=400.0, naive_read=50.0))}
    assert t["read >= 10x naive HDF5 (num_workers=0)"]["met"] is False


def test_writer_targets_take_the_best_peer_and_the_read_write_bound():
    """Issue 19's conversion targets, warm and cold: >= 2x the fastest peer writer row
    (whichever it is) and >= 0.8x the read+write bound row."""
    res = _fake_results(h5_read=1000.0, naive_read=50.0)
    res["records"] += [{"phase": "convert", "corpus": "c", "method": m, "codec": codec, "variant": "",
                        "workers": None, "runs": [{}], "rate": {"median": rate}}
                       for m, codec, rate in (("h5batch-auto", "auto", 300.0), ("webdataset-2p", "", 90.0),
                                              ("litdata-fork", "", 120.0), ("webdataset-1p", "", 50.0),
                                              (report.RW_BOUND, "", 200.0))]
    t = {x["target"]: x for x in report.targets(res)}
    warm = t["conversion (warm cluster) >= 2x best peer writer"]
    assert warm["met"] is False and warm["value"] == pytest.approx(100 / 120) and "litdata-fork" in warm["detail"]
    cold = t["conversion (cold, kind auto as `h5batch convert` runs) >= 2x best peer writer"]
    assert cold["met"] is True and cold["value"] == pytest.approx(2.5)
    assert t["conversion (warm cluster) >= 0.8x read+write bound"]["value"] == pytest.approx(0.5)
    assert t["conversion (cold, kind auto as `h5batch convert` runs) >= 0.8x read+write bound"]["met"] is True


def test_a_verdict_inside_the_spread_is_flagged():
    """9.6x naive from medians, but 8.0-12.0x over the repetitions: MISSED, within the spread;
    a wide margin is not flagged."""
    res = _fake_results(h5_read=960.0, naive_read=100.0)
    res["records"][0]["rate"].update(n=2, min=880.0, max=1080.0)
    res["records"][1]["rate"].update(n=2, min=90.0, max=110.0)
    t = {x["target"]: x for x in report.targets(res)}["read >= 10x naive HDF5 (num_workers=0)"]
    assert t["met"] is False and t["within_spread"] is True
    assert t["bounds"] == pytest.approx((8.0, 12.0))
    res["records"][0]["rate"].update(median=2000.0, min=1900.0, max=2100.0)
    t = {x["target"]: x for x in report.targets(res)}["read >= 10x naive HDF5 (num_workers=0)"]
    assert t["met"] is True and t["within_spread"] is False


def test_layout_only_compares_with_the_strict_rows():
    res = _fake_results(h5_read=1000.0, naive_read=50.0)
    res["records"] += [{"phase": "read", "corpus": "c", "method": m, "codec": "", "variant": v, "workers": 0,
                        "runs": [{}], "rate": {"median": rate}}
                       for m, v, rate in (("raw-files", "random", 200.0), (report.STRICT_RAW, "random", 500.0),
                                          ("memmap", "random", 1250.0))]
    t = {x["target"]: x for x in report.targets(res)}
    assert t["read >= 2x raw files (num_workers=0)"]["value"] == pytest.approx(5.0)  # the users' way
    (e,) = report.layout_only(res)  # no LitData row: only the raw-file comparison
    assert e["comparison"] == "read vs raw files + h5batch's collate (num_workers=0)"
    assert e["value"] == pytest.approx(2.0) and e["baseline_vs_memmap"] == pytest.approx(0.4)


def test_cli_registers_bench():
    args = build_parser().parse_args(["bench", "--quick", "--codecs", "gzip,none", "--workers", "0", "--rate", "32000"])
    assert args.handler is commands.bench.run and args.codecs == ("gzip", "none") and args.workers == (0,)
    assert args.rate == 32000
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--codecs", "brotli"])


def test_mini_bench_run_writes_json_markdown_png(tmp_path):
    # Every phase and row type, as small as it goes: one codec, one repetition, 0 workers,
    # and one Dask worker (the cold rows still start their LocalCluster inside convert, of
    # one worker: on 2 cores two workers per start cost ~60 of this test's ~100 s).
    cfg = quick_config(pairs=16, images=4, scale=2, reps=1, codecs=("auto",), workers=(0,), consume=True,
                       read_samples=16, warmup=False, dask_workers=1, cache=str(tmp_path / "cache"),
                       out_root=str(tmp_path / "results"))
    results = Bench(cfg, log=open(os.devnull, "w")).run()
    paths = report.write(results)
    data = json.loads(open(paths["json"]).read())
    assert {"meta", "config", "corpora", "records", "checks", "targets", "scaling", "plots"} <= set(data)
    assert data["checks"] and all(c["ok"] for c in data["checks"]), data["checks"]
    keys = {r["key"] for r in data["records"]}
    main = data["main_corpus"]
    for k in (f"convert/{main}/h5batch/auto", f"convert/{main}/h5batch-cold/auto", f"convert/{main}/h5batch-auto/auto",
              f"convert/{main}/floor", f"convert/{main}/{report.RW_BOUND}", f"convert/{main}/naive/gzip",
              f"convert/{main}/h5batch-cold/auto/x2",
              f"read/{main}/h5batch/auto/chunk-shuffle/w0", f"read/{main}/h5batch/auto/random/w0",
              f"read/{main}/naive/gzip/random/w0", f"read/{main}/raw-files/random/w0",
              f"read/{main}/memmap-int16-rowwise/random/w0", f"read/{main}/memmap-strict/random/w0",
              *(f"read/{main}/h5batch/auto/ds.loader {d} {'fixed' if f else 'variable'}/w0"
                for d, f in STRICT_STORAGES)):
        assert k in keys, k
    # the four storages of the strict limit read back equal to its float32 memmap
    assert sum("strict limit's float32 memmap" in c["check"] for c in data["checks"]) >= 4
    strict = [t for t in data["targets"] if "strict memmap" in t["target"]]
    assert [t["threshold"] for t in strict] == [0.7] * 4 and all(t["value"] for t in strict)
    for r in data["records"]:
        assert r["runs"] and r["rate"]["median"] > 0 and r["peak_rss"]["median"] > 0, r["key"]
        if r["phase"] == "read":
            want = r["info"]["epochs"] * r["info"]["samples_per_epoch"]
            assert all(run["items"] == want for run in r["runs"]), r["key"]
            # every 0-worker row in a process of its own (bench/fresh_reads.py)
            assert all(run.get("fresh_process") for run in r["runs"]), r["key"]
        if r["phase"] == "convert" and r["method"] in ("h5batch", "h5batch-cold", "h5batch-auto", "naive"):
            # a fresh start in a process of its own, the warm cluster's rows in the bench's
            # (bench/converts.py); the CPU of the tree counted either way
            fresh = r["method"] != "h5batch"
            assert all(run["fresh_process"] == fresh and run["cpu_seconds"] > 0 for run in r["runs"]), r["key"]
            assert all(run["machine"]["busy"] > 0 for run in r["runs"]), r["key"]
            if fresh:  # h5batch's children without torch (as the command runs), the naive recipe's with it
                assert all(run["torch_imported"] == (r["method"] == "naive") for run in r["runs"]), r["key"]
    mem = data["meta"]["memory"]  # bench.memstate's probe at the start and the end of the run
    assert set(mem) == {"start", "end"} and all(p["hot_ms"] > 0 and p["idle_ms"] > 0 for p in mem.values())
    md = open(paths["markdown"]).read()
    assert "Memory (`python -m h5batch.bench.memstate`), at start: 16 MiB written" in md
    fe = data["meta"]["first_epoch"]  # bench.first_epoch: the main corpus in one-row chunks, read twice
    assert fe["chunks"] == fe["samples"] == data["config"]["pairs"] and fe["first_s"] > 0 and fe["second_s"] > 0
    assert "Reading a file of many chunks (`python -m h5batch.bench.first_epoch`): first epoch of a file of" in md
    assert "| auto → none |" in md  # what auto chose for the generated (incompressible) audio
    assert "## Targets" in md and "### Conversion" in md and "### Read" in md and "## Scaling" in md
    assert "every batch consumed" in md
    # each round of the rows judged against the peers, with the machine's CPU by state
    assert "| method | round | wall s | own CPU-s | machine busy | idle | iowait | steal |" in md
    assert "| h5batch (cluster.kind auto, as `h5batch convert` runs) | 1 |" in md
    assert any(s in md for s in ("**met**", "**MISSED**"))
    assert "| target | measured | range | status | detail |" in md
    pngs = [p for p in data["plots"]]
    assert f"read_{main}.png" in pngs and "scaling.png" in pngs
    for p in pngs:
        with open(os.path.join(results["out_dir"], p), "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert not os.path.exists(os.path.join(results["out_dir"], "work"))  # outputs cleaned up
    # --render rebuilds the markdown and plots from results.json alone, measuring nothing.
    before = open(paths["json"]).read()
    os.remove(paths["markdown"])
    args = build_parser().parse_args(["bench", "--render", results["out_dir"]])
    assert args.handler(args) == 0
    assert open(paths["markdown"]).read() == md
    assert json.loads(open(paths["json"]).read())["records"] == json.loads(before)["records"]


def test_memstate_probe_times_writes_into_freed_memory(tmp_path):
    """bench.memstate writes into the page cache twice per round (right after a free, then
    after an idle wait) and leaves no scratch file behind; bad arguments are refused."""
    from h5batch.bench import memstate

    p = memstate.probe(str(tmp_path / "scratch"), mib=16, idle=0.05, rounds=2)
    assert p["mib"] == 16 and p["idle_s"] == 0.05 and p["hot_ms"] > 0 and p["idle_ms"] > 0
    # the ratio is of the unrounded medians; the milliseconds are rounded to 0.1
    assert abs(p["ratio"] - p["idle_ms"] / p["hot_ms"]) <= 0.1 * p["ratio"] + 0.01
    assert os.listdir(tmp_path / "scratch") == []
    assert isinstance(p["reporting"], dict)
    line = memstate.describe(p)
    assert line.startswith("16 MiB written into the page cache:") and "free for 0.05 s" in line
    with pytest.raises(ValueError):
        memstate.probe(str(tmp_path), mib=0)


def test_direct_write_bound_stores_what_convert_stores(tmp_path, capsys):
    """bench.direct_write: chunks allocated up front and filled by forked processes hold, row
    for row, what ``convert`` stores for the same corpus (the last chunk partial); a field it
    cannot take and a file its reader declines are refused, naming them."""
    import dataclasses

    import h5py

    from h5batch.bench import corpus, direct_write
    from h5batch.conversion.options import ConvertOptions
    from h5batch.conversion.pipeline import convert

    cp = corpus.paired_audio(tmp_path / "cache", 40, 8000)  # 32,000-byte rows: 32 per 1 MiB chunk, so 32 + 8
    r = direct_write.timed(direct_write.direct_convert, cp.job(str(tmp_path / "direct.h5"), "none"), 2)
    assert r["samples"] == 40 and r["seconds"] > 0 and r["cpu"] > 0 and r["bytes_decoded"] == 40 * 2 * 32000
    convert(cp.job(str(tmp_path / "ref.h5"), "none", {"kind": "inprocess"}),
            ConvertOptions(overwrite=True, progress="none", log=io.StringIO()))
    with h5py.File(tmp_path / "direct.h5") as d, h5py.File(tmp_path / "ref.h5") as ref:
        for name in ("data", "target"):
            got, want = d["train"][name], ref["train"][name]
            assert got.shape == want.shape == (40, 16000) and got.chunks == (32, 16000)
            assert np.array_equal(got[:], want[:]) and np.abs(want[:]).max() > 0

    job = cp.job(str(tmp_path / "float.h5"), "none")
    job = dataclasses.replace(job, fields={**job.fields, "target": dataclasses.replace(job.fields["target"], dtype="float32")})
    with pytest.raises(ValueError, match="field 'target'"):
        direct_write.direct_convert(job)
    bad = sorted((tmp_path / "cache" / cp.name / "train" / "label").glob("*.wav"))[3]
    bad.write_bytes(b"RIFF")  # a truncated file: the direct reader declines it
    with pytest.raises(RuntimeError, match="copying processes failed"):
        direct_write.direct_convert(cp.job(str(tmp_path / "bad.h5"), "none"), processes=2)

    # the command: both ways alternating, their ratio, no output left in its scratch folder
    assert direct_write.main(["--pairs", "8", "--rounds", "1", "--cache", str(tmp_path / "cache"),
                              "--work", str(tmp_path / "work")]) == 0
    out = capsys.readouterr().out
    assert "round 1/1: " in out and "8 samples" in out and "h5batch / direct-write bound, wall: " in out
    assert os.listdir(tmp_path / "work") == []


def test_first_epoch_probe_reads_a_file_of_one_row_chunks(tmp_path, capsys):
    """bench.first_epoch: the corpus converted one row per chunk, two epochs read in a new
    interpreter, the file removed after; a bad size is refused."""
    from h5batch.bench import first_epoch

    p = first_epoch.probe(str(tmp_path / "cache"), str(tmp_path / "work"), pairs=24, rate=8000)
    assert p["chunks"] == p["samples"] == 24 and p["first_s"] > 0 and p["second_s"] > 0
    assert abs(p["ratio"] - p["first_s"] / p["second_s"]) < 1e-9
    assert os.listdir(tmp_path / "work") == []
    assert first_epoch.describe(p).startswith("first epoch of a file of 24 one-row chunks per field: ")
    with pytest.raises(ValueError):
        first_epoch.probe(str(tmp_path / "cache"), str(tmp_path / "work"), pairs=0)


def test_physics_picks_the_largest_default_rate_corpus(tmp_path):
    """A `--rate` corpus (paired_audio_<n>_32k) sits beside the 16 kHz ones in the cache; the
    physics script must skip it, not crash parsing '32k' as a number."""
    from h5batch.bench.physics import default_corpus

    assert default_corpus(str(tmp_path)) == str(tmp_path)
    for name in ("paired_audio_64", "paired_audio_4096_32k", "paired_audio_256", "images_16"):
        (tmp_path / name).mkdir()
    assert default_corpus(str(tmp_path)) == str(tmp_path / "paired_audio_256")


def test_whole_command_rows_run_fresh_interpreters(pairs, tmp_path):
    """cli_cold: ``h5batch convert`` with the job's defaults and the naive script, each in a new
    interpreter, write the same samples as the in-process naive recipe."""
    import h5py

    from h5batch.bench import cli_cold

    c, m, ref = pairs
    items = corpus.item_paths(m)
    fields = tuple(c.job(str(tmp_path / "x.h5")).fields.items())
    wall, r = cli_cold.run_naive(items, fields, str(tmp_path / "naive-cli.h5"), str(tmp_path))
    assert wall > 0 and r["samples"] == 16 and r["bytes_decoded"] == ref["data"].nbytes + ref["target"].nbytes
    with h5py.File(tmp_path / "naive-cli.h5") as f:
        got = np.stack([f[f"samples/{i:08d}/data"][()] for i in range(16)])
    assert np.array_equal(got, ref["data"])
    job = cli_cold.write_job(str(tmp_path / "job.yaml"), "cli", c.root, c.source, c.fields, str(tmp_path / "o.h5"))
    wall, s = cli_cold.run_convert(job, str(tmp_path / "o.h5"))
    assert sum(s["counts"].values()) == 16 and 0 < s["seconds"] < wall
    from h5batch.torch import H5Dataset

    ds = H5Dataset(str(tmp_path / "o.h5"), split="train", as_float=False)
    assert sorted(np.asarray(ds[i]["data"]).tobytes() for i in range(len(ds))) == sorted(a.tobytes() for a in ref["data"])
    with pytest.raises(RuntimeError, match="failed"):
        cli_cold.run_convert(str(tmp_path / "missing.yaml"), str(tmp_path / "p.h5"))


def test_cold_targets_judge_fsdd_and_the_demo():
    res = {"main_corpus": "c", "config": {"workers": [], "peers": False, "dask_workers": 2}, "records": [
        {"phase": "convert", "corpus": "fsdd", "method": m, "codec": "", "variant": "", "workers": 0,
         "runs": [{}], "rate": {"median": rate, "n": 1}} for m, rate in (("h5batch-cli", 2500.0), ("naive-cli", 1000.0))]}
    res["records"].append({"phase": "convert", "corpus": "demo", "method": "h5batch-cli", "codec": "auto",
                           "variant": "", "workers": 0, "rate": {"median": 1.0, "n": 3},
                           "seconds": {"median": 2.0}, "runs": [{"internal_seconds": s} for s in (0.8, 1.25, 0.9)]})
    t = {x["target"]: x for x in report.cold_targets(res, lambda name, a, b, thr: report._target(
        name, report._ratio(report._rate(a), report._rate(b)), thr, ""))}
    fsdd = t["FSDD whole command >= 3x the naive recipe's (fresh interpreters)"]
    assert fsdd["value"] == pytest.approx(2.5) and fsdd["met"] is False
    demo = t["demo job's conversion < 1 s (make convert; 1 s / its seconds)"]
    assert demo["value"] == pytest.approx(1 / 0.9) and demo["met"] is True
    assert demo["bounds"] == pytest.approx((0.8, 1.25)) and demo["within_spread"] is True
    assert "0.90 s median" in demo["detail"]



_WRITER_LEFT_RUNNING = """
import json, multiprocessing as mp, time
from h5batch.bench import convert_child


def spin(seconds):
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def conversion(seconds):  # what a conversion does at its end: returns while its writer works
    mp.get_context("fork").Process(target=spin, args=(seconds,), name="h5batch-writer", daemon=True).start()
    return 1


r = convert_child.convert_row({"fn": conversion, "args": (0.4,)})
print(json.dumps([r["seconds"], r["cpu_seconds"]]))
"""


def test_a_conversion_rows_cpu_counts_the_writer_it_did_not_wait_for(tmp_path):
    """convert_child.convert_row waits, after the timing, for the h5batch writer the
    conversion left running, so the row's own CPU-seconds include the writer's; the wall
    time does not. In a process of its own (a fork, as the zygote's children)."""
    import subprocess

    res = subprocess.run([sys.executable, "-c", _WRITER_LEFT_RUNNING], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert res.returncode == 0, res.stderr
    seconds, cpu = json.loads(res.stdout.strip().splitlines()[-1])
    assert seconds < 0.3  # the timing ended when the conversion returned
    assert cpu >= 0.35  # the writer's 0.4 CPU-s are counted


def test_long_recordings_phase_records_the_memory_and_judges_it(tmp_path):
    """The full bench's long-recording rows (bench.longfile), on 30-second files: every case
    converted by the real CLI ``reps`` times against its 1-second baseline, the stored sample
    compared with the file, the target judged from those very runs, the outputs removed and
    the WAVs kept in the cache (made once)."""
    from h5batch.bench import longfile

    cfg = quick_config(long_minutes=0.5, reps=2, cache=str(tmp_path / "cache"), out_root=str(tmp_path / "out"))
    bench = Bench(cfg, log=io.StringIO())
    os.makedirs(bench.work)
    longfile.bench_phase(bench)
    recs = [r.to_dict() for r in bench.records.values()]
    assert sorted(r["corpus"] for r in recs) == sorted(longfile.CASES)
    assert bench.checks and all(c["ok"] for c in bench.checks), bench.checks
    over = {}
    for r in recs:
        case = longfile.CASES[r["corpus"]]
        assert [x["bytes"] for x in r["runs"]] == [case.decoded_bytes(30)] * 2
        assert r["runs"][0]["identical"] is True and r["runs"][1]["identical"] is None
        # (a 30-second sample is 1-12 MB: within the RSS noise of a baseline, so no order here)
        assert all(x["exit_code"] == 0 and x["peak_rss"] > 50e6 and x["baseline_rss"] > 50e6 for x in r["runs"])
        over[r["corpus"]] = sorted((x["peak_rss"] - x["baseline_rss"]) / x["bytes"] for x in r["runs"])
    judged = {t["target"].split()[2]: t for t in report.memory_targets({"records": recs})}
    assert set(judged) == set(longfile.CASES)
    for name, t in judged.items():
        lo, hi = (max(x, 1e-9) for x in over[name])  # (a peak under the baseline counts as none)
        assert t["value"] == pytest.approx(1.5 / ((lo + hi) / 2))
        assert t["bounds"] == pytest.approx((1.5 / hi, 1.5 / lo)) and t["met"] == (t["value"] >= 1.0)
    md = "\n".join(longfile.markdown({"records": recs}))
    assert "| 16k-mono-int16, 0.5 min | 1 |" in md and "| 48k-stereo-float32, 0.5 min | 12 |" in md
    assert not list((tmp_path / "out").rglob("*.h5"))
    wavs = sorted(p.name for p in (tmp_path / "cache" / "longfile").rglob("*.wav"))
    assert wavs == ["long.wav", "long.wav", "tiny.wav", "tiny.wav"]
