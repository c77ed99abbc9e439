"""The tools that read a finished output: ``inspect``, ``verify``, and the index checks the
reader and the driver run when they open one."""
