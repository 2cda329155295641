"""Writing a job's files without touching a file that exists (a job never writes to a path a user may own).

A directory that holds ``pi.py`` may hold the user's own ``pi.sbatch``. So a rendered
script is never written to its display name: it goes to a private file that nobody else
can have (``mkstemp``: a new name, created exclusively), is submitted from there, and
then takes its place in the job's own directory by a hard link, which fails rather than
replace a file. Whatever a failed submission created (that file, directories it made) is
removed again; nothing that existed before is ever overwritten, moved or deleted.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field

from torchhpc.errors import QuotingError, SchedulerError

__all__ = ["Written", "keep", "make_dirs", "write_new", "write_same"]


@dataclass
class Written:
    """What :func:`write_new` created: intended path -> the file written, and the directories it made."""

    paths: dict[str, str] = field(default_factory=dict)
    dirs: list[str] = field(default_factory=list)

    def remove(self) -> None:
        """Undo: the files written, then the directories made (innermost first, only while empty)."""
        for path in self.paths.values():
            with contextlib.suppress(OSError):
                os.unlink(path)
        for directory in reversed(self.dirs):
            with contextlib.suppress(OSError):
                os.rmdir(directory)


def make_dirs(directory: str) -> list[str]:
    """``os.makedirs``, returning the directories it created (outermost first), so a failure can remove them."""
    missing: list[str] = []
    d = os.path.abspath(directory)
    while not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    made: list[str] = []
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            continue
        made.append(d)
    return made


def _encode(files: Sequence[tuple[str, str]]) -> list[tuple[str, bytes]]:
    out = []
    for path, content in files:
        try:
            out.append((path, content.encode("utf-8")))
        except UnicodeEncodeError as e:
            raise QuotingError(
                f"{path}: the rendered text holds {content[e.start:e.end]!r}, which no file can hold as UTF-8",
                "a value came from undecodable bytes: pass UTF-8 text",
            ) from None
    return out


def write_new(files: Sequence[tuple[str, str]], *, private: bool = False) -> Written:
    """Write each file whole (text no file can hold is an error before anything is written).

    ``private``: each goes to a new hidden file beside its path (``.pi.XXXX.sbatch``), the
    path itself is not touched. Otherwise each takes its path when that is free, else the
    first free ``NAME.N.EXT``; the returned :class:`Written` says which.
    """
    encoded = _encode(files)
    umask = os.umask(0)
    os.umask(umask)
    written = Written()
    try:
        for path, data in encoded:
            directory = os.path.dirname(path) or "."
            written.dirs += make_dirs(directory)
            stem, ext = os.path.splitext(os.path.basename(path))
            fd, tmp = tempfile.mkstemp(prefix=f".{stem}.", suffix=ext, dir=directory)
            written.paths[path] = tmp
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.chmod(tmp, 0o666 & ~umask)
            if not private:
                written.paths[path] = _claim(tmp, path)
    except BaseException:
        written.remove()
        raise
    return written


def keep(tmp: str, dest: str) -> str:
    """Give the file ``tmp`` the name ``dest`` unless something has that name; the name it ends up with."""
    try:
        os.link(tmp, dest)
    except FileExistsError:
        return tmp
    except OSError:  # no hard links on this filesystem: an exclusive create, then a copy
        try:
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError:
            return tmp
        with os.fdopen(fd, "wb") as out, open(tmp, "rb") as src:
            out.write(src.read())
    os.unlink(tmp)
    return dest


def _claim(tmp: str, path: str) -> str:
    stem, ext = os.path.splitext(path)
    for candidate in (path, *(f"{stem}.{n}{ext}" for n in range(1, 1000))):
        got = keep(tmp, candidate)
        if got != tmp:
            return got
    return tmp


def write_same(path: str, content: str) -> Written:
    """A file named by its content (torchhpc's boot copy), shared by jobs: written when missing, kept when it
    holds the same text, never replaced (other text there is an error). The answer: what this call created."""
    data = content.encode()
    if os.path.exists(path):
        with open(path, "rb") as f:
            if f.read() == data:
                return Written()
        raise SchedulerError(f"{path} holds other text than torchhpc's file of that name", f"move {path} away")
    made = Written(dirs=make_dirs(os.path.dirname(path)))
    fd, tmp = tempfile.mkstemp(prefix=".boot.", suffix=".py", dir=os.path.dirname(path))
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    made.paths[path] = keep(tmp, path)
    if made.paths[path] == tmp:  # written meanwhile by another submission (the same text, by its name)
        os.unlink(made.paths.pop(path))
    return made
