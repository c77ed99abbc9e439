"""``h5batch preview OUT.h5 --html DIR``: a static page of an output (h5batch.tools.preview
writes it; this module parses and reports)."""

from __future__ import annotations

import sys

NAME = "preview"
HELP = "write a static HTML page of an output: class counts, lengths, decoded samples, rejects"
DESCRIPTION = ("Write DIR/index.html, a page that opens from the file system (no server): per split "
               "the samples per class (the 20 largest by name, then one 'others' row), audio "
               "lengths and image sizes, a grid of N decoded samples spread over the split "
               "(thumbnails; waveform, spectrogram and a WAV player for audio) with their label "
               "name, text, value and metadata fields, then the rejects, the job and the versions. "
               "Everything it shows is written under DIR/preview-files/.")


def add_arguments(p) -> None:
    p.add_argument("path", help="an h5batch output file")
    p.add_argument("--html", required=True, metavar="DIR", help="folder of the page (created)")
    p.add_argument("--split", action="append", metavar="S",
                   help="split to show (repeat for several; default every split)")
    p.add_argument("--n", type=int, default=48, metavar="N", help="samples shown per split (default 48)")


def run(args) -> int:
    import os

    os.environ.setdefault("MPLBACKEND", "Agg")  # never a display, whatever the user's default
    try:
        import matplotlib  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        from ..errors import EXIT_BAD_INPUT, ConvertError

        raise ConvertError(f"needs matplotlib and torch ({e}): pip install 'h5batch[preview]'",
                           EXIT_BAD_INPUT) from None
    from ..tools.preview import build_preview

    s = build_preview(args.path, args.html, args.split, args.n)
    shown = ", ".join(f"{k} {v}" for k, v in s.shown.items())
    print(f"h5batch preview: wrote {s.index} ({shown} samples shown, {s.files} files) in {s.seconds:.1f} s",
          file=sys.stderr)
    return 0
