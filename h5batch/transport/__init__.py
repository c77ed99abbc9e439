"""How decoded samples travel from Dask workers to the single writer process.

* :mod:`.packing`  a batch packed into one buffer, described by a small :class:`Packed`;
* :mod:`.segments` the shared-memory segments those buffers live in, and their clean-up;
* :mod:`.semaphores` the multiprocessing semaphores a killed run leaves in ``/dev/shm``, and their clean-up.
"""
