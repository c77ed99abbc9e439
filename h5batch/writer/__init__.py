"""The single writer process: the only code that opens the output for writing.

* :mod:`.messages`  what the driver and the writer say to each other (one dataclass each);
* :mod:`.process`   the process: its entry point, one handler per message, its start-up;
* :mod:`.remote`    a shard's writer on its workers' host, reached over TCP;
* :mod:`.output`    the output file: create or resume, append batches, commit, finalize;
* :mod:`.store`     the HDF5 layout of a split and its fields, with their attributes;
* :mod:`.append`    the append engine: whole chunks, compressed off the HDF5 lock;
* :mod:`.commit`    the durable-commit protocol, the typed commit record, and whether a
                    partial file can be continued from it;
* :mod:`.sync`      ``h5batch sync``'s writer: extends a finished output, all or nothing;
* :mod:`.journal`   the undo journal that makes an in-place change of a finished file crash-safe.
"""
