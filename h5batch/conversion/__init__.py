"""One conversion, stage by stage, in the order the data flows.

=====================  ==================================================================
stage                  where
=====================  ==================================================================
generate (optional)    :mod:`h5batch.generate`: a named corpus made when ``source.generate``
discover               :mod:`h5batch.layouts`: files -> a :class:`~h5batch.manifest.Manifest`
own the output         :mod:`.lock`: one run per output; :mod:`.signals`: SIGTERM = Ctrl-C
decide what to do      :mod:`.partial`: done already, refuse, resume, or start afresh
plan                   :mod:`.plan` (+ :mod:`.auto`): codecs, batches, the writer's spec;
                       :mod:`.head_start`: the first in-process batches decode meanwhile
cluster                :mod:`.cluster`: a LocalCluster, a scheduler, or dask-jobqueue;
                       :mod:`.inprocess` (+ :mod:`.spares`): a small job in the driver
preflight              :mod:`.preflight`: every worker can read the corpus and the segments
drive                  :mod:`.driver`: submit, isolate crashes, forward in manifest order
worker decode          :mod:`.worker` (runs on Dask workers; decoders in :mod:`h5batch.fields`)
                       :mod:`.direct`: the fields a batch reads without a decoder library
                       :mod:`.direct_chunks`: decoders on the writer's host write its chunks
                       :mod:`.fence`: no late copy of a batch writes them after its store
                       :mod:`.worker_compress`: whole chunks compressed in the workers
transport              :mod:`h5batch.transport`: shared memory, descriptors through a pipe
writer                 :mod:`h5batch.writer`: one process appends, commits, finalizes
=====================  ==================================================================

:func:`.pipeline.convert` is the whole pipeline; ``docs/architecture.md`` draws it.

This package's ``__init__`` imports nothing: a Dask worker unpickling its task imports
:mod:`.worker`, and must not pay for the driver, the writer and h5py's writer side.
"""
