"""Object storage: h5batch's ``s3://`` reader against LitData's ``StreamingDataset``, one server.

``python benchmarks/s3_reader.py [--pairs N] [--work DIR]`` (run from the repository root;
needs the ``s3`` extra, moto and LitData: ``make peers``) starts moto's S3 server on loopback
behind a request-counting proxy (``tests/support/s3server.py``), converts the bench's
paired-audio corpus (2 s 16 kHz int16 pairs) with ``h5batch convert`` and with
``litdata.optimize`` (64 MB chunks), uploads both, and prints one JSON line per measurement:

* ``first_epoch``: samples/s of a cold first epoch, batch 64, 2 workers, shuffled, for
  h5batch (``ds.loader``, ``as_float=False``) and LitData (``StreamingDataLoader``; through
  boto3: LitData's optional obstore path failed with "builder error" on the http endpoint), with
  the GETs the server saw and the bytes they returned over the bytes stored;
* ``second_epoch_fresh_process``: a new process with the same ``cache_dir``: its GETs;
* ``bounded_cache``: ``cache_dir_bytes`` at a quarter of the file, a fresh dataset per epoch
  (only the node cache carries over): bytes fetched per epoch over the file's bytes.

Not part of ``h5batch bench`` (its code is capped at 1,500 lines); not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.getcwd())  # tests.support.s3server, from the repository root

H5_EPOCH = """
import json, sys, time
from h5batch.torch import H5Dataset
def main():
    ds = H5Dataset(sys.argv[1], split="train", as_float=False, cache_dir=sys.argv[2])
    t = time.perf_counter()
    n = sum(len(b["data"]) for b in ds.loader(batch_size=64, shuffle=True, num_workers=2, seed=int(sys.argv[3])))
    print(json.dumps({"samples": n, "seconds": time.perf_counter() - t}))
if __name__ == "__main__":
    main()
"""

LIT_EPOCH = """
import json, sys, time
import litdata as ld
import litdata.streaming.downloader as dl
dl._OBSTORE_AVAILABLE = False  # LitData's boto3 path: its obstore path fails on an http:// endpoint
def main():
    ds = ld.StreamingDataset(sys.argv[1], shuffle=True, seed=0, cache_dir=sys.argv[2],
                             storage_options={"endpoint_url": sys.argv[3]})
    t = time.perf_counter()
    n = sum(len(b["data"]) for b in ld.StreamingDataLoader(ds, batch_size=64, num_workers=2))
    print(json.dumps({"samples": n, "seconds": time.perf_counter() - t}))
if __name__ == "__main__":
    main()
"""


def _run(code: str, *args: str, env: dict) -> dict:
    r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=1800)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=2048)
    ap.add_argument("--work", default=None)
    a = ap.parse_args()
    from h5batch.bench import corpus, writers
    from tests.support.s3server import CREDS, FaultProxy, S3Server

    work = a.work or tempfile.mkdtemp(prefix="h5b-s3-")
    cp = corpus.paired_audio(os.path.join(work, "corpora"), a.pairs)
    local = os.path.join(work, "pairs.h5")
    if not os.path.exists(local):
        job = os.path.join(work, "job.json")
        with open(job, "w") as f:
            json.dump(cp.job_dict(local, "none"), f)
        subprocess.run([sys.executable, "-m", "h5batch.cli", "convert", job, "--progress", "none"], check=True)
    lit = os.path.join(work, "litdata")
    if not os.path.exists(os.path.join(lit, "index.json")):
        m = cp.manifest()
        writers.litdata_convert(corpus.item_paths(m), tuple(cp.job("x.h5").fields.items()), lit)
    srv = S3Server().start()
    proxy = FaultProxy(srv.endpoint)
    env = {**srv.env(proxy.endpoint), **CREDS, "AWS_ALLOW_HTTP": "true"}  # LitData reads through obstore too
    os.environ.update(env)
    try:
        s3 = srv.client()
        s3.upload_file(local, "bench", "pairs.h5")
        for name in os.listdir(lit):
            s3.upload_file(os.path.join(lit, name), "bench", f"litdata/{name}")
        size = os.path.getsize(local)
        lit_size = sum(os.path.getsize(os.path.join(lit, n)) for n in os.listdir(lit))

        def measured(fn):
            before = proxy.counts()
            out = fn()
            after = proxy.counts()
            return out, after.get("GET", 0) - before.get("GET", 0), after.get("GET_bytes", 0) - before.get("GET_bytes", 0)

        cache = os.path.join(work, "h5cache")
        for _ in range(2):  # alternate, cold each time
            for tool in ("h5batch", "litdata"):
                c = tempfile.mkdtemp(dir=work)
                if tool == "h5batch":
                    out, gets, got = measured(lambda c=c: _run(H5_EPOCH, "s3://bench/pairs.h5", c, "0", env=env))
                    stored = size
                    cache = c
                else:
                    out, gets, got = measured(lambda c=c: _run(LIT_EPOCH, "s3://bench/litdata", c, proxy.endpoint, env=env))
                    stored = lit_size
                print(json.dumps({"row": "first_epoch", "tool": tool, "samples": out["samples"],
                                  "samples_per_s": round(out["samples"] / out["seconds"]), "gets": gets,
                                  "bytes_over_stored": round(got / stored, 3)}), flush=True)
        out, gets, _ = measured(lambda: _run(H5_EPOCH, "s3://bench/pairs.h5", cache, "1", env=env))
        print(json.dumps({"row": "second_epoch_fresh_process", "tool": "h5batch", "gets": gets,
                          "samples_per_s": round(out["samples"] / out["seconds"])}), flush=True)
        from h5batch.torch import H5Dataset

        bounded = tempfile.mkdtemp(dir=work)
        ratios = []
        for epoch in range(3):
            ds = H5Dataset("s3://bench/pairs.h5", split="train", as_float=False, cache_dir=bounded,
                           cache_dir_bytes=size // 4)
            loader = ds.loader(batch_size=64, shuffle=True, num_workers=0, seed=0)
            loader.set_epoch(epoch)
            _, _, got = measured(lambda loader=loader: sum(len(b["data"]) for b in loader))
            ratios.append(round(got / size, 3))
        print(json.dumps({"row": "bounded_cache", "tool": "h5batch", "cache_dir_bytes": size // 4,
                          "fetched_over_file_per_epoch": ratios}), flush=True)
    finally:
        proxy.close()
        srv.stop()


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(json.dumps({"seconds": round(time.time() - t0, 1)}))
