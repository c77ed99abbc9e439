"""What the tests share and the product does not ship: test corpora, output comparison,
process helpers.

The rule: a module whose only users are tests lives here, not in ``h5batch/``, so the
installed package holds what users run and nothing it does not need, and a test helper can
change without touching the product. Modules:

* :mod:`.run`: ``h5batch`` (``convert`` above all) as a child process, the way a user runs it;
* :mod:`.h5compare`: are two outputs the same, dataset by dataset;
* :mod:`.fingerprint`: a recorded digest of an output (``tests/golden/``);
* :mod:`.torture`: a corpus of every kind of broken input, mixed with good files;
* :mod:`.memory`: resident memory of a DataLoader's processes over an epoch;
* :mod:`.cluster_helpers`: real ``dask scheduler``/``dask worker`` processes, TLS files.
"""
