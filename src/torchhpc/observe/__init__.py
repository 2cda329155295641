"""While a job runs: `torchhpc top`'s table, the per-node sampler and stream, progress read from logs."""
