"""``h5batch bench``: conversion and read throughput, memory and scaling, side by side.

Modules: :mod:`corpus` (what is converted), :mod:`baselines` (naive HDF5 recipe, raw files,
memmap), :mod:`strict` (the strict read limit and the storages judged against it),
:mod:`peers` (WebDataset, LitData), :mod:`measure` (timing, process-tree RSS),
:mod:`decode_only` (the decode-only floor), :mod:`suite` (the run), :mod:`report` (JSON,
markdown, PNG), :mod:`cli` (the arguments of ``h5batch bench``, whose command is
:mod:`h5batch.commands.bench`). See docs/benchmarks.md.
"""
