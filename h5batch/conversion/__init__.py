"""One conversion, stage by stage, in the order the data flows.

=====================  ==================================================================
stage                  where
=====================  ==================================================================
own the output         :mod:`.lock`: one run per output; :mod:`.signals`: SIGTERM = Ctrl-C
generate (optional)    :mod:`h5batch.generate`: a named corpus made when ``source.generate``
discover               :mod:`h5batch.layouts`: files -> a :class:`~h5batch.manifest.Manifest`
decide what to do      :mod:`.partial`: done already, refuse, resume, or start afresh
start the writer       :mod:`h5batch.writer.process`: the one process that writes the output
open the engine        :mod:`.cluster`: decoder processes (:mod:`.pool`), a LocalCluster,
                       a scheduler, or dask-jobqueue; :mod:`.preflight` checks it
place the writers      :mod:`.writer_hosts`: shard writers on their workers' hosts
                       (:mod:`h5batch.writer.remote`) on a cluster of several hosts
plan                   :mod:`.plan` (+ :mod:`.auto`, :mod:`.trial` on the engine): codecs,
                       batches, the writer's spec
drive                  :mod:`.driver`: submit, isolate crashes, forward in manifest order
worker decode          :mod:`.worker` (runs on the engine's workers; decoders in
                       :mod:`h5batch.fields`)
transport              :mod:`h5batch.transport`: shared memory, descriptors through a pipe
writer                 :mod:`h5batch.writer`: one process appends, commits, finalizes
=====================  ==================================================================

:func:`.pipeline.convert` is the whole pipeline; ``docs/architecture.md`` draws it.

This package's ``__init__`` imports nothing: a Dask worker unpickling its task imports
:mod:`.worker`, and must not pay for the driver, the writer and h5py's writer side.
"""
