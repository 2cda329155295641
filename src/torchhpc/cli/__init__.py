"""The command line: parse -> typed config -> library call. The only layer that prints and exits."""
