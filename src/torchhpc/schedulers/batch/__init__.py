"""What Slurm and PBS share: the batch base, the script, the step, the end watch, dependencies."""
