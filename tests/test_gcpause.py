"""The console command's set-up runs without the cyclic collector (h5batch.gcpause): real
subprocesses, a real conversion of the demo corpus."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

DEMO = REPO / "jobs" / "demo.yaml"

# Records, for every collection of the main process, how many objects were frozen then,
# and at exit (quick_exit runs the atexit functions) the collector's state.
_PROBE = """
import atexit, gc, json, sys
starts = []
gc.callbacks.append(lambda phase, info: phase == "start" and starts.append(gc.get_freeze_count()))
report, how, argv = sys.argv[1], sys.argv[2], sys.argv[3:]

def done():
    with open(report, "w") as fh:
        json.dump({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count(),
                   "unfrozen_collections": starts.count(0), "collections": len(starts)}, fh)

atexit.register(done)
from h5batch import cli
starts.clear()  # from the command's start on (importing the cli module comes before it)
if how == "entry":
    sys.argv = ["h5batch", *argv]
    cli.entry()
else:
    code = cli.main(argv)
    done()
    sys.exit(code)
"""


def _probe(tmp_path: Path, demo_root: Path, how: str) -> dict:
    report = tmp_path / f"{how}.json"
    argv = ["convert", str(DEMO), "--output", str(tmp_path / f"{how}.h5"), "--set", f"source.root={demo_root}",
            "--progress", "none"]
    r = subprocess.run([sys.executable, "-c", _PROBE, str(report), how, *argv], capture_output=True, text=True,
                       timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / f"{how}.h5").is_file()
    return json.loads(report.read_text())


def test_the_console_command_sets_up_without_collections_and_runs_with_them(demo_root, tmp_path):
    got = _probe(tmp_path, demo_root, "entry")
    # No collection traversed the set-up's objects (imports, job, manifest): they were
    # frozen when collection came back on for the run.
    assert got["unfrozen_collections"] == 0, got
    assert got["enabled"] and got["frozen"] > 10_000, got


def test_a_library_call_leaves_the_callers_collector_alone(demo_root, tmp_path):
    got = _probe(tmp_path, demo_root, "main")
    assert got["enabled"] and got["frozen"] == 0, got
    assert got["unfrozen_collections"] > 0, got  # the imports collected as usual


_LIBRARY = """
import gc, json, sys, weakref
from h5batch.config import load_job
from h5batch.conversion.options import ConvertOptions
from h5batch.conversion.pipeline import convert

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # the caller's cyclic garbage, made before the call
gone = []
weakref.finalize(a, gone.append, "a")
del a, b
gc.disable(); gc.enable()
job = load_job(sys.argv[1], ["source.root=" + sys.argv[2], "output.path=" + sys.argv[3]])
during = []
gc.callbacks.append(lambda phase, info: phase == "start" and during.append(gc.get_freeze_count()))
convert(job, ConvertOptions(progress="none"))
gc.callbacks.clear()
after = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}
gc.collect()
print(json.dumps({"during": during, "after": after, "gone": gone}))
"""


def test_a_library_call_pauses_the_collector_and_gives_it_back(demo_root, tmp_path):
    """convert() called from Python: no collection scans the set-up (what the run froze is
    unfrozen at the end), and the caller's own cycles are collected afterwards."""
    r = subprocess.run([sys.executable, "-c", _LIBRARY, str(DEMO), str(demo_root), str(tmp_path / "lib.h5")],
                       capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert all(frozen > 10_000 for frozen in got["during"]), got["during"]
    assert got["after"] == {"enabled": True, "frozen": 0}, got
    assert got["gone"] == ["a"], got  # the caller's cycle, collected once the call was over
    assert (tmp_path / "lib.h5").is_file()


def test_a_process_forked_during_the_pause_resumes_on_its_own():
    code = """
import gc, json, os
from h5batch import gcpause
gcpause.resume()  # not paused: nothing happens
assert gc.isenabled() and gc.get_freeze_count() == 0
gcpause.pause()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    gcpause.resume()
    os.write(w, json.dumps([gc.isenabled(), gc.get_freeze_count() > 0]).encode())
    os._exit(0)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 100))
print(json.dumps({"child": child, "parent": gc.isenabled()}))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"child": [True, True], "parent": False}
