"""What ``--remote`` prints: the dry run's list of what would ship and run, the shipped line, hints."""

from __future__ import annotations

from collections.abc import Iterator

from torchhpc.core.shell import join
from torchhpc.core.units import counted
from torchhpc.remote.ship import IGNORE_FILE, Bundle, _human
from torchhpc.remote.ssh import Ssh

__all__ = ["dry_run_lines", "follow_hint", "shipped_line"]

MAX_LISTED = 200


def shipped_line(bundle: Bundle, host: str, shipped: int, seconds: float) -> str:
    where = f"{host}:~/.torchhpc/code/{bundle.digest}/"
    if not shipped:
        return f"Code already on {where} (nothing shipped; checked in {seconds:.2f} s)"
    n = len(bundle.files)
    changes = f" + a patch of {counted(len(bundle.changed), 'changed file')}" if bundle.patch else ""
    return f"Shipped {counted(n, 'file')}{changes} ({_human(shipped)}) to {where} in {seconds:.2f} s"


def follow_hint(handle: str, host: str) -> str:
    return (f"Follow it with: {join(['torchhpc', 'wait', handle, '--remote', host])}; "
            f"{join(['torchhpc', 'logs', handle, '--remote', host])}")


def dry_run_lines(bundle: Bundle, host: str, ssh: Ssh, probe: str, upload: str, command: str) -> Iterator[str]:
    """Everything --remote would do, and nothing done: the files, their digest, the three ssh calls."""
    what = "a plain directory"
    if bundle.kind == "git":
        what = f"git HEAD {bundle.head[:12]}"
        if bundle.changed:
            what += f" + uncommitted changes in {counted(len(bundle.changed), 'file')} ({len(bundle.patch)} byte patch)"
    yield f"# --remote {host}: code from {bundle.root} ({what})"
    yield (f"# ships {len(bundle.files)} files, {_human(bundle.size)}, into ~/.torchhpc/code/{bundle.digest}/ "
           "(nothing is copied when that directory is already there)")
    for path, size in bundle.files[:MAX_LISTED]:
        mark = "  (changed)" if path in bundle.changed else ""
        yield f"#   {path}  {_human(size)}{mark}"
    if len(bundle.files) > MAX_LISTED:
        yield f"#   ... and {len(bundle.files) - MAX_LISTED} more"
    new = [p for p in bundle.changed if p not in {f for f, _s in bundle.files}]
    for path in new:
        yield f"#   {path}  (new or deleted: in the patch)"
    if bundle.excluded:
        shown = ", ".join(bundle.excluded[:10]) + (f" and {len(bundle.excluded) - 10} more" if len(bundle.excluded) > 10 else "")
        yield f"# kept back ({IGNORE_FILE} and the built-in patterns): {shown}"
    yield "# 1. check the remote torchhpc and whether the code is there:"
    yield from ssh.shown(probe)
    yield "# 2. only when it is not: unpack the bundle (a tar on stdin) there:"
    yield from ssh.shown(upload)
    yield "# 3. run the command in the shipped copy:"
    yield from ssh.shown(command)
