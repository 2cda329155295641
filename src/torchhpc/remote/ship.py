"""What ``--remote`` ships: the program's code, as a content-addressed bundle.

A git checkout ships as ``git archive HEAD`` plus the uncommitted changes as a
binary patch (tracked edits, deletions and untracked files that git does not
ignore, collected in a throw-away index so the user's own index is never
touched). A plain directory ships as a tarball. Either way the bundle has a
digest of its content, and the remote side keeps it under
``~/.torchhpc/code/<digest>/``: a second submit of the same code finds the
directory there and copies nothing, and a job keeps running the copy it was
submitted with whatever happens to the local files afterwards.

Two guards against shipping what should not travel: an ignore file
(``.torchhpcignore``, gitignore-like: ``data/``, ``*.ckpt``, ``/secrets.txt``)
on top of built-in patterns (``.env``, ``.venv/``, ...), and a size limit.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from torchhpc.errors import RemoteError, UsageError

__all__ = ["DEFAULT_IGNORE", "DEFAULT_LIMIT", "IGNORE_FILE", "Bundle", "Ignore", "collect", "find_root"]

IGNORE_FILE = ".torchhpcignore"
# Never shipped unless the ignore file says `!PATTERN`: secrets, environments, caches.
DEFAULT_IGNORE = (".git/", ".env", ".env.*", ".venv/", "venv/", "__pycache__/", "*.pyc", ".torchhpc/",
                  ".ipynb_checkpoints/", ".mypy_cache/", ".pytest_cache/", ".ruff_cache/")
DEFAULT_LIMIT = 50 * 1024 * 1024
SHIP_MODES = ("worktree", "committed")


class Ignore:
    """gitignore-like patterns: ``name`` matches at any depth, ``a/b`` and ``/a`` from the root,
    a trailing ``/`` only directories, ``!pattern`` takes a path back. Last match wins."""

    def __init__(self, patterns: Iterable[str]) -> None:
        self.rules: list[tuple[bool, bool, bool, str]] = []  # (negate, anchored, dir_only, pattern)
        for raw in patterns:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            line = line[1:] if negate else line
            dir_only = line.endswith("/")
            line = line.strip("/") if dir_only else line
            anchored = "/" in line
            self.rules.append((negate, anchored, dir_only, line.lstrip("/")))

    @classmethod
    def for_root(cls, root: str) -> Ignore:
        """The built-in patterns, then the root's ``.torchhpcignore`` (whose lines win)."""
        lines = list(DEFAULT_IGNORE)
        try:
            with open(os.path.join(root, IGNORE_FILE), encoding="utf-8") as f:
                lines += f.read().splitlines()
        except FileNotFoundError:
            pass
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read {os.path.join(root, IGNORE_FILE)}: {e}", "fix or remove the file") from None
        return cls(lines)

    def ignored(self, path: str) -> bool:
        """True when ``path`` (relative, with ``/``) or one of its parent directories is ignored."""
        parts = path.split("/")
        verdict = False
        for negate, anchored, dir_only, pat in self.rules:
            for k in range(1, len(parts) + 1):
                if dir_only and k == len(parts):
                    continue  # the file itself is not a directory
                hit = fnmatch.fnmatchcase("/".join(parts[:k]), pat) if anchored else fnmatch.fnmatchcase(parts[k - 1], pat)
                if hit:
                    verdict = not negate
                    break
        return verdict


@dataclass
class Bundle:
    """The code to ship: its digest, what it holds, and how to make the bytes (only when needed)."""

    root: str
    kind: str  # "git" or "dir"
    digest: str
    files: list[tuple[str, int]]  # (relative path, size) of what ships
    excluded: list[str] = field(default_factory=list)
    head: str = ""  # git: the commit archived
    patch: bytes = b""  # git: uncommitted changes (empty when clean)
    changed: list[str] = field(default_factory=list)  # git: the paths in the patch

    @property
    def size(self) -> int:
        return sum(s for _p, s in self.files) + len(self.patch)

    def payload(self) -> bytes:
        """One tar: ``tree.tar`` (the code) and, for a dirty checkout, ``changes.patch``."""
        tree = self._git_archive() if self.kind == "git" else _dir_tar(self.root, [p for p, _s in self.files])
        members = {"tree.tar": tree, **({"changes.patch": self.patch} if self.patch else {})}
        return _tar_of(members)

    def _git_archive(self) -> bytes:
        # Excluded paths of HEAD leave the archive through pathspecs, literally (no glob in a name).
        excl = [f":(exclude,literal){p}" for p in self.excluded]
        return _git(self.root, ["archive", "--format=tar", self.head, "--", ".", *excl])


def find_root(start: str) -> tuple[str, bool]:
    """The directory to ship for code run from ``start``: the git top level, else ``start`` itself."""
    try:
        out = subprocess.run(["git", "-C", start, "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return os.path.abspath(start), False
    if out.returncode == 0 and out.stdout.strip():
        return out.stdout.strip(), True
    return os.path.abspath(start), False


def collect(start: str, mode: str = "worktree", limit: int = DEFAULT_LIMIT) -> Bundle:
    """The bundle for code run from ``start`` (a git checkout or a plain directory).

    ``mode`` ``committed`` ships HEAD only and refuses a checkout with changes.
    Raises :class:`RemoteError` when the bundle exceeds ``limit`` bytes, naming the largest files.
    """
    if mode not in SHIP_MODES:
        raise UsageError(f"--ship {mode!r} is not one of: {', '.join(SHIP_MODES)}",
                         "worktree ships HEAD plus your uncommitted changes; committed ships HEAD only")
    root, is_git = find_root(start)
    ignore = Ignore.for_root(root)
    if is_git and _git_ok(root, ["rev-parse", "--verify", "-q", "HEAD"]):
        bundle = _collect_git(root, ignore, mode)
    else:
        if mode == "committed":
            raise UsageError(f"--ship committed: {root} is not a git checkout with a commit",
                             "drop --ship committed to ship the directory as it is")
        bundle = _collect_dir(root, ignore)
    if bundle.size > limit:
        sizes = dict(bundle.files)
        for path in bundle.changed:  # new and edited files travel in the patch: name them too
            full = os.path.join(root, path)
            if os.path.isfile(full):
                sizes[path] = os.path.getsize(full)
        big = sorted(sizes.items(), key=lambda f: -f[1])[:3]
        names = ", ".join(f"{p} ({_human(s)})" for p, s in big)
        raise RemoteError(
            f"the code to ship from {root} is {_human(bundle.size)}, over the {_human(limit)} limit "
            f"(largest: {names})",
            f"list data and outputs in {os.path.join(root, IGNORE_FILE)} (e.g. `data/`), "
            "or raise the limit with --ship-limit SIZE (TORCHHPC_SHIP_LIMIT)",
        )
    return bundle


def _collect_git(root: str, ignore: Ignore, mode: str) -> Bundle:
    head = _git(root, ["rev-parse", "HEAD"]).decode().strip()
    tree = _git(root, ["rev-parse", "HEAD^{tree}"]).decode().strip()
    files, excluded = [], []
    for entry in _git(root, ["ls-tree", "-r", "-l", "-z", "--full-tree", "HEAD"]).split(b"\0"):
        if not entry:
            continue
        meta, _tab, name = entry.partition(b"\t")
        path = os.fsdecode(name)
        kind, size = meta.split()[1], meta.split()[3]
        if ignore.ignored(path):
            excluded.append(path)
        elif kind == b"blob":  # commits (submodules) are not in git archive's output
            files.append((path, int(size)))
    changed = [p for p in _changed_paths(root) if not ignore.ignored(p)]
    patch = _patch(root, changed) if changed else b""
    if patch and mode == "committed":
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise UsageError(
            f"--ship committed: {root} has uncommitted changes ({shown})",
            "commit them (git commit -a; git add for new files), or drop --ship committed to ship them as a patch",
        )
    h = hashlib.sha256(b"git\0" + tree.encode() + b"\0" + "\0".join(excluded).encode() + b"\0" + patch)
    return Bundle(root=root, kind="git", digest=h.hexdigest()[:24], files=files, excluded=excluded, head=head,
                  patch=patch, changed=changed)


def _changed_paths(root: str) -> list[str]:
    """Tracked paths that differ from HEAD (staged or not, deleted too) and untracked ones git does not ignore."""
    tracked = _git(root, ["diff", "--name-only", "-z", "--no-renames", "HEAD"]).split(b"\0")
    untracked = _git(root, ["ls-files", "-z", "--others", "--exclude-standard", "--full-name", ":/"]).split(b"\0")
    return sorted({os.fsdecode(p) for p in (*tracked, *untracked) if p})


def _patch(root: str, paths: list[str]) -> bytes:
    """``git diff --binary`` of HEAD against a throw-away index holding the working tree's ``paths``."""
    with tempfile.TemporaryDirectory(prefix="torchhpc-ship-") as tmp:
        env = {**os.environ, "GIT_INDEX_FILE": os.path.join(tmp, "index")}
        _git(root, ["read-tree", "HEAD"], env=env)
        _git(root, ["--literal-pathspecs", "add", "-A", "--pathspec-from-file=-", "--pathspec-file-nul"], env=env,
             input=b"\0".join(os.fsencode(p) for p in paths))
        return _git(root, ["diff", "--cached", "--binary", "--no-renames", "--full-index", "HEAD"], env=env)


def _collect_dir(root: str, ignore: Ignore) -> Bundle:
    files: list[tuple[str, int]] = []
    excluded: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        rel = "" if rel_dir == "." else rel_dir.replace(os.sep, "/") + "/"
        for d in list(dirnames):
            if ignore.ignored(rel + d + "/\0"):  # the directory itself matches: prune, as git does
                excluded.append(rel + d + "/")
                dirnames.remove(d)
        for name in filenames:
            path = rel + name
            full = os.path.join(dirpath, name)
            if ignore.ignored(path):
                excluded.append(path)
            elif os.path.isfile(full) and not os.path.islink(full):
                files.append((path, os.path.getsize(full)))
    files.sort()
    h = hashlib.sha256(b"dir\0")
    for path, _size in files:
        h.update(path.encode("utf-8", "surrogateescape") + b"\0")
        h.update(b"x" if os.access(os.path.join(root, path), os.X_OK) else b"-")
        with open(os.path.join(root, path), "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return Bundle(root=root, kind="dir", digest=h.hexdigest()[:24], files=files, excluded=sorted(excluded))


def _dir_tar(root: str, paths: list[str]) -> bytes:
    """A reproducible tar of ``paths``: no owner, no times, only the executable bit of the mode."""
    members = {}
    for path in paths:
        with open(os.path.join(root, path), "rb") as f:
            members[path] = f.read()
    return _tar_of(members, executable={p for p in paths if os.access(os.path.join(root, p), os.X_OK)})


def _tar_of(members: Mapping[str, bytes], executable: set[str] | frozenset[str] = frozenset()) -> bytes:
    import tarfile  # here: the CLI checks every command line for --remote and must not load tarfile for it

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o755 if name in executable else 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _git(root: str, args: list[str], env: Mapping[str, str] | None = None, input: bytes | None = None) -> bytes:
    try:
        done = subprocess.run(["git", "-C", root, *args], capture_output=True, env=dict(env) if env else None,
                              input=input, timeout=300)
    except OSError as e:
        raise RemoteError(f"cannot run git in {root}: {e}", "install git, or ship a plain directory") from None
    if done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip().splitlines()
        raise RemoteError(f"git {args[0]} failed in {root}: {err[-1] if err else done.returncode}",
                          "check the repository with `git status`")
    return done.stdout


def _git_ok(root: str, args: list[str]) -> bool:
    return subprocess.run(["git", "-C", root, *args], capture_output=True, timeout=60).returncode == 0


def _human(n: int) -> str:
    units = (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10))
    return next((f"{n / f:.1f} {unit}" for unit, f in units if n >= f), f"{n} B")
