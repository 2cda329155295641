"""The local backend: a job on this machine, supervised in the background like a cluster job."""
