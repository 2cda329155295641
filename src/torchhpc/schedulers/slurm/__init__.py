"""The Slurm backend: render and submit (slurm), queries (status), output parsing (parse), arrays (array)."""
