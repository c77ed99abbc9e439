"""``h5batch bench``: conversion and DataLoader reads against baselines and peers, side by side.

:mod:`.suite` runs it on :mod:`.corpus`'s corpora, with :mod:`.writers`' conversions and
:mod:`.loaders`' reads, each row timed in a process of its own by :mod:`.measure`;
:mod:`.report` renders it. The command is :mod:`h5batch.commands.bench`; studies outside the
suite live in the repository's ``benchmarks/`` folder. See docs/benchmarks.md.
"""
