"""What a job leaves on disk and how it is read back: the record, the never-overwrite writer, rank logs."""
