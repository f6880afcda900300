"""More than one device or process: data parallelism (`distribution`) and multi-process jobs
(`multi_process`, JAX only)."""
