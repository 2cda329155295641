"""Stdlib-only building blocks: the job spec, shell text, hostlists, units, the command runner."""
