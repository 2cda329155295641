"""The PBS backend (OpenPBS, PBS Pro, Torque): render and submit (pbs), qstat parsing (parse)."""
