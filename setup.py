"""Build of h5batch's one optional C extension (the rest of the metadata is in pyproject.toml).

``h5batch._stat_many`` (``h5batch/_stat_many.c``) is the fast path of a sync's stat pass;
``optional=True``: where no C compiler is at hand the install goes on without it and
:func:`h5batch.walker.stat_blob` uses its Python fallback, which gives the same answers.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("h5batch._stat_many", ["h5batch/_stat_many.c"], optional=True)])
