"""Python functions as cluster jobs: Executor, the pickle, the rank entry, Stop/Checkpoint."""
