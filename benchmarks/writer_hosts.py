"""Convert throughput with the writers on the workers' hosts (issue 47, item 1): a real
``dask scheduler`` on 127.0.0.1 and ``--workers-per-host`` single-threaded ``dask worker``
processes on each of 127.0.0.2 and 127.0.0.3 (two hosts for Dask, one machine), converting
generated pairs (``jobs/paired_audio.yaml``), in alternating rounds:

* ``1 writer, network``: the one writer on the driver's host, every decoded byte through
  Dask to it (``cluster.transport: network``), what two real hosts do with one writer;
* ``1 writer, shm``: the same writer fed through shared memory (possible only because the
  "hosts" share a machine: the floor of what moving bytes costs here);
* ``2 writers on their hosts``: ``output.writers: 2``, a writer on each host fed by its
  worker through that host's shared memory.

MB/s decoded is ``bytes_decoded / seconds`` of ``h5batch convert --json`` (the run from
connecting to the scheduler to the joined file).

    .venv/bin/python benchmarks/writer_hosts.py --pairs 3000 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
HOSTS = ("127.0.0.2", "127.0.0.3")
CASES = {
    "1 writer, network": ("output.writers=1", "cluster.transport=network"),
    "1 writer, shm": ("output.writers=1",),
    "2 writers on their hosts": ("output.writers=2",),
}


def _cluster(tmp: Path, per_host: int) -> tuple[str, list[subprocess.Popen]]:
    sched_file = tmp / "scheduler.json"
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    while not sched_file.exists():
        time.sleep(0.1)
    for host in HOSTS:
        procs.append(subprocess.Popen([str(BIN / "dask"), "worker", "--scheduler-file", str(sched_file),
                                       "--nworkers", str(per_host), "--nthreads", "1", "--no-nanny",
                                       "--host", host, "--dashboard-address", f"{host}:0"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp))
    time.sleep(0.5)
    return json.loads(sched_file.read_text())["address"], procs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=3000, help="train pairs of 2 s (a fifth as many test pairs)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers-per-host", type=int, default=1)
    p.add_argument("--dir", type=Path, default=None, help="where the corpus and outputs go (default: a temp dir)")
    args = p.parse_args()
    sys.path.insert(0, str(REPO))
    from h5batch.generate.paired_audio import make_paired_audio

    tmp = args.dir or Path(tempfile.mkdtemp(prefix="h5b-writer-hosts-"))
    root = tmp / f"pairs{args.pairs}"
    if not root.exists():
        make_paired_audio(root, n_train=args.pairs, n_test=args.pairs // 5, seed=1)
    address, procs = _cluster(tmp, args.workers_per_host)
    rates: dict[str, list[float]] = {name: [] for name in CASES}
    try:
        for _ in range(args.rounds):
            for k, (name, settings) in enumerate(CASES.items()):
                cmd = [str(BIN / "h5batch"), "convert", str(REPO / "jobs" / "paired_audio.yaml"), "--scheduler", address,
                       "--set", f"source.root={root}", "--output", str(tmp / f"out{k}.h5"), "--json",
                       "--progress", "none"]
                for old in tmp.glob(f"out{k}.*"):  # from scratch: complete shards would be kept
                    old.unlink()
                for s in settings:
                    cmd += ["--set", s]
                res = subprocess.run(cmd, capture_output=True, text=True)
                if res.returncode != 0:
                    raise SystemExit(f"{name}: exit {res.returncode}\n{res.stderr}")
                s = json.loads(res.stdout)
                rates[name].append(s["bytes_decoded"] / 1e6 / s["seconds"])
                print(f"{name}: {rates[name][-1]:.0f} MB/s ({s['bytes_decoded'] / 1e6:.0f} MB in {s['seconds']:.1f} s)",
                      file=sys.stderr, flush=True)
    finally:
        for proc in reversed(procs):
            proc.terminate()
            proc.wait(timeout=30)
    print(json.dumps({name: [round(r) for r in r_] for name, r_ in rates.items()}))


if __name__ == "__main__":
    main()
