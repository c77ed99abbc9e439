"""``h5batch bench``: conversion and DataLoader reads against baselines and peers, side by side.

Modules: :mod:`corpus` (what is converted and the decoded reference), :mod:`writers` (the
conversion rows: the job file of ``h5batch convert``, the naive recipe, WebDataset, LitData),
:mod:`loaders` (the read rows: h5batch, the naive file, raw files, the memmap limit, the
peers), :mod:`measure` (a row in a process of its own, timed from outside), :mod:`suite`
(the run), :mod:`report` (targets, ``results.md``, ``results.json``, plots); the command
and its arguments are :mod:`h5batch.commands.bench`. Studies and probes that are not part of the suite live in the repository's ``benchmarks/`` folder. See
docs/benchmarks.md.
"""
