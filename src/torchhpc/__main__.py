"""``python -m torchhpc`` is the ``torchhpc`` command."""

from torchhpc.cli.main import main

if __name__ == "__main__":
    raise SystemExit(main())
