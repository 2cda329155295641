"""Why a job failed or hangs: the verdict from its evidence, the hang watch, the node-side probe."""
