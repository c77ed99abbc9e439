"""The decode-only floor of the benchmark: what decoding alone costs on the cluster.

:func:`decode_only` runs as a Dask task on the same batches a conversion submits and decodes
every file of them, without packing, shared memory or writing. A conversion can be no
faster than this; the benchmark reports how close it comes. It lives here, not with the
worker's task, because nothing but the benchmark (and ``tests/cluster/measure_writer.py``)
runs it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..errors import DecodeError
from ..fields import decode_field, reads_files

if TYPE_CHECKING:
    from ..batches import BatchTask


def decode_only(task: BatchTask) -> tuple[int, int]:
    """Decode every item of ``task``; ``(samples decoded, bytes decoded)``.

    A file that does not decode is skipped, as the conversion would reject it.
    """
    n = nbytes = 0
    files = [fc for _, fc in task.fields if reads_files(fc)]  # annotation values cost nothing
    for paths, _label, _values in task.items:
        try:
            for fc, rel in zip(files, paths):
                nbytes += decode_field(os.path.join(task.root, rel), fc).nbytes
            n += 1
        except DecodeError:
            pass
    return n, nbytes
