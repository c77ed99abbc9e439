"""The command line: every registered command is reachable, errors are reported one way,
``--progress`` does what it says on a terminal, and the options that were removed stay gone."""

from __future__ import annotations

import fcntl
import io
import os
import pty
import struct
import subprocess
import sys
import termios
import threading

import pytest

from h5batch import cli, commands
from h5batch.conversion.options import Progress, progress_mode
from h5batch.errors import ConfigError, ConvertError, VerifyError
from tests.conftest import REPO
from tests.support.run import clean_env, convert_cmd, run_h5batch

NAMES = [cmd.NAME for cmd in commands.COMMANDS]


def test_registry_modules_define_the_command_interface():
    assert NAMES == ["init", "convert", "sync", "compact", "inspect", "verify", "view", "preview", "export", "cluster-script",
                     "bench"]
    for cmd in commands.COMMANDS:
        assert isinstance(cmd.NAME, str) and isinstance(cmd.HELP, str) and cmd.HELP, cmd
        assert callable(cmd.add_arguments) and callable(cmd.run), cmd
    assert commands.by_name()["cluster-script"] is commands.cluster_script


def test_every_command_is_in_the_help_and_has_its_own():
    res = run_h5batch("--help", timeout=60)
    assert res.returncode == 0, res.stderr
    for cmd in commands.COMMANDS:
        assert cmd.NAME in res.stdout and cmd.HELP.split()[0] in res.stdout, (cmd.NAME, res.stdout)
    for name in NAMES:
        res = run_h5batch(name, "--help", timeout=60)
        assert res.returncode == 0, (name, res.stderr)
        assert res.stdout.startswith(f"usage: h5batch {name} "), (name, res.stdout)
        assert "%%" not in res.stdout, (name, res.stdout)  # argparse formats help, not descriptions
    res = run_h5batch("view", "add", "--help", timeout=60)
    assert "'index % 5 == 0'" in res.stdout.replace("\n", " ") and "%%" not in res.stdout


def test_the_parser_costs_no_heavy_import():
    """Commands import what they need when they run: ``h5batch --help`` loads no h5py,
    Dask, numpy, torch or matplotlib."""
    code = ("import sys; from h5batch.cli import build_parser; build_parser()\n"
            "heavy = {'h5py', 'dask', 'distributed', 'numpy', 'torch', 'matplotlib'} & set(sys.modules)\n"
            "assert not heavy, heavy\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("name,error,line,code", [
    ("verify", VerifyError("x.h5: no such file"), "h5batch verify: x.h5: no such file", 2),
    ("cluster-script", ConvertError("no dask-jobqueue", 1), "h5batch cluster-script: no dask-jobqueue", 1),
    ("convert", ConvertError("cannot write", 2), "h5batch convert: cannot write", 2),
    ("convert", ConfigError("job.yaml", "output.codec", "must be one of ..."),
     "h5batch: config error: job.yaml: output.codec: must be one of ...", 2),
    ("inspect", KeyboardInterrupt(), "h5batch: interrupted", 130),
])
def test_errors_are_mapped_once(monkeypatch, capsys, name, error, line, code):
    def fail(args):
        raise error

    monkeypatch.setattr(commands.by_name()[name], "run", fail)
    argv = {"verify": ["x.h5"], "inspect": ["x.h5"]}.get(name, ["job.yaml"])
    assert cli.main([name, *argv]) == code
    assert capsys.readouterr().err == line + "\n"


def test_resume_flag_is_gone(capsys):
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["convert", "job.yaml", "--resume"])
    assert e.value.code == 2
    assert "unrecognized arguments: --resume" in capsys.readouterr().err
    args = cli.build_parser().parse_args(["convert", "job.yaml", "--restart"])
    assert args.restart


# -- progress -----------------------------------------------------------------------


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_modes():
    assert [progress_mode(v) for v in (None, True, False, "log")] == ["auto", "auto", "none", "log"]
    with pytest.raises(ValueError):
        progress_mode("fancy")
    assert Progress(3, mode="auto", log=_Terminal()).bar is not None
    assert Progress(3, mode="auto", log=io.StringIO()).mode == "log"
    for mode, expect_line in (("log", True), ("none", False)):
        out = _Terminal()
        p = Progress(3, mode=mode, log=out, every=0.0)
        assert p.bar is None
        p.update(2)
        p.close()
        assert ("[h5batch] 2/3 files" in out.getvalue()) is expect_line, (mode, out.getvalue())


def _run_on_a_terminal(cmd: list[str]) -> tuple[int, str]:
    """Run ``cmd`` with its stderr on a pseudo-terminal of 24 x 100; (exit code, what it
    wrote there). The size matters: tqdm draws nothing on a terminal of 0 columns."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every process holding the terminal has closed it
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read, daemon=True)
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=slave,
                                env=clean_env(), cwd=REPO)
        os.close(slave)
        slave = -1
        reader.start()
        code = proc.wait(timeout=300)
        reader.join(timeout=30)
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    return code, b"".join(chunks).decode(errors="replace")


def test_progress_log_prints_log_lines_on_a_terminal(paired_root, tmp_path):
    code, seen = _run_on_a_terminal([sys.executable, "-c", "import sys; print(sys.stderr.isatty(), file=sys.stderr)"])
    assert code == 0 and seen.strip() == "True", seen  # the child really sees a terminal
    cmd = convert_cmd(REPO / "jobs" / "paired_audio.yaml", workers=1, output=tmp_path / "out.h5",
                      root=paired_root, progress="log")
    code, seen = _run_on_a_terminal(cmd)
    assert code == 0, seen
    assert "[h5batch] 32/32 files (100%)" in seen, seen  # the log line of the end of the run
    assert "\r" not in seen.replace("\r\n", "\n"), seen  # no bar redrawing itself
    assert "file/s" not in seen and "%|" not in seen, seen  # nor tqdm's rate or bar
    # The same run on the same terminal with the default, auto: a bar, no log line.
    cmd = convert_cmd(REPO / "jobs" / "paired_audio.yaml", workers=1, output=tmp_path / "out.h5",
                      root=paired_root, overwrite=True, progress="auto")
    code, seen = _run_on_a_terminal(cmd)
    assert code == 0, seen
    assert "32/32" in seen and "file/s" in seen and "[h5batch]" not in seen, seen


def test_a_bad_line_gets_the_usage_and_the_commands():
    """An unknown option gets the usage; a name that is no command gets the list of them."""
    res = run_h5batch("sync", "job.yaml", "--bogus", timeout=60)
    assert res.returncode == 2 and "unrecognized arguments: --bogus" in res.stderr
    assert res.stderr.startswith("usage: h5batch ")
    res = run_h5batch("nosuch", timeout=60)
    assert res.returncode == 2 and "invalid choice: 'nosuch'" in res.stderr
    assert all(name in res.stderr for name in NAMES)
    res = run_h5batch("--help", timeout=60)
    assert all(name in res.stdout for name in NAMES)


def test_a_reader_that_stops_early_is_not_an_error(tmp_path):
    """``h5batch init DIR | head -1``: the pipe's reader is gone before the output is flushed;
    that is no traceback and exit 0."""
    import subprocess

    import numpy as np
    from PIL import Image

    from tests.support.run import h5batch_cmd

    (tmp_path / "c" / "k").mkdir(parents=True)
    Image.fromarray(np.zeros((4, 4, 3), np.uint8)).save(tmp_path / "c" / "k" / "a.png")
    r, w = os.pipe()
    os.close(r)  # the reader has stopped: every write to the pipe fails
    try:
        res = subprocess.run(h5batch_cmd("init", str(tmp_path / "c")), stdout=w, stderr=subprocess.PIPE, text=True,
                             timeout=60)
    finally:
        os.close(w)
    assert res.returncode == 0 and "Traceback" not in res.stderr and "BrokenPipe" not in res.stderr, res.stderr
