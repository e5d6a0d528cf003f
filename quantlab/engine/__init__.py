"""Running a model and reading the machine: decode engines (eager and compiled), device choice and
synchronization, memory (tensor bytes, peak memory) and the copy-bandwidth probe."""
