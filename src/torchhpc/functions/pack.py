"""The function directory: what ``Executor.submit`` writes and what every rank reads back.

One directory per submitted function (``<folder>/<name>-fn-<stamp>/``), on a
filesystem the ranks share with the submitter (the folder already is, for the
logs), holding::

    meta.json                      versions of the submitting side, the call's shape
    fn.pkl                         cloudpickle of (function, args, kwargs, items)
    results[/task-I]/rank-R.pkl    what rank R returned, or how it failed
    state[/task-I]/rank-R.pkl      a checkpoint returned at a stop request (requeue)
    <name>-<id>/                   the scheduler's job directory (script, logs): the
                                   directory is the job's output directory

Older torchhpc put this directory beside the job's, in the output directory: a
rank reads whatever directory its command line names, so those jobs still run.

The versions are JSON, not pickle, so a rank can compare them *before*
unpickling anything: a pickle made by another Python minor or another
cloudpickle release may fail in obscure ways, or worse, load subtly wrong.

Submit-time checks name the object that cannot travel (a lock, an open file, a
tensor on a GPU) by its path from the function (``train.<closure>.lock``),
instead of failing on the cluster after the queue wait. Stdlib only at import:
cloudpickle is imported when something is pickled.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Optional

from torchhpc.errors import SpecError, UsageError

__all__ = [
    "CLOUDPICKLE_PIN",
    "FunctionDir",
    "dumps",
    "find_unpicklable",
    "load_cloudpickle",
    "submit_versions",
    "version_mismatch",
]

# The release pyproject's ``function`` extra pins: what the docs tell users to install.
CLOUDPICKLE_PIN = "cloudpickle==3.1.3"
_INSTALL_HINT = f"install the function extra where you submit and in the ranks' environment: pip install '{CLOUDPICKLE_PIN}'"


def load_cloudpickle() -> Any:
    try:
        import cloudpickle
    except ImportError:
        raise UsageError("cloudpickle is not installed (needed to send a function to a job)", _INSTALL_HINT) from None
    return cloudpickle


def _release(version: Optional[str]) -> Optional[str]:
    """``2.13.0+cpu`` -> ``2.13.0``: a local build tag changes no pickle."""
    return None if version is None else version.split("+", 1)[0]


def _installed(name: str) -> Optional[str]:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def submit_versions() -> dict[str, Optional[str]]:
    """This interpreter's versions as recorded with a pickle.

    torch is recorded only when the submitting process has imported it: only then can
    torch objects be inside the pickle (and ``import torchhpc`` must not import torch).
    """
    torch = sys.modules.get("torch")
    return {
        "python": ".".join(map(str, sys.version_info[:3])),
        "cloudpickle": _installed("cloudpickle"),
        "torch": _release(getattr(torch, "__version__", None)) if torch is not None else None,
    }


def version_mismatch(recorded: dict[str, Optional[str]], here: dict[str, Optional[str]]) -> Optional[str]:
    """A one-line reason why this interpreter must not unpickle ``recorded``'s pickle, or None.

    Python must match in major.minor (bytecode and pickle protocol details change
    between minors, not between micro releases); cloudpickle and torch exactly.
    """
    py_r, py_h = recorded.get("python") or "", here.get("python") or ""
    if py_r.split(".")[:2] != py_h.split(".")[:2]:
        return f"Python {py_h} here, the function was pickled by Python {py_r}"
    for name in ("cloudpickle", "torch"):
        want, have = recorded.get(name), here.get(name)
        if want is not None and _release(want) != _release(have):
            return f"{name} {have or '(not installed)'} here, the function was pickled with {name} {want}"
    return None


# --- pickling with the objects named ---------------------------------------------------------------
class _Refused(TypeError):
    """An object pickle would accept but that must not travel (a tensor on a GPU)."""


def _device_tensor(obj: Any) -> Optional[str]:
    """``"a tensor on cuda:0"`` for a torch tensor that is not on the CPU (only when torch is loaded)."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return None
    device = obj.device
    return None if device.type == "cpu" else f"a tensor on {device}"


def _pickler(buf: io.BytesIO) -> Any:
    cloudpickle = load_cloudpickle()

    class Strict(cloudpickle.CloudPickler):  # type: ignore[misc,name-defined]
        def reducer_override(self, obj: Any) -> Any:
            why = _device_tensor(obj)
            if why is not None:
                raise _Refused(why)
            return super().reducer_override(obj)

    return Strict(buf, protocol=pickle.DEFAULT_PROTOCOL)


def dumps(obj: Any) -> bytes:
    buf = io.BytesIO()
    _pickler(buf).dump(obj)
    return buf.getvalue()


def _fails(obj: Any) -> Optional[str]:
    try:
        dumps(obj)
    except RecursionError:
        return "too deeply nested to pickle"
    except UsageError:
        raise
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return None


def _children(obj: Any) -> list[tuple[str, Any]]:
    """The parts of ``obj`` that travel with it, each with the name a user would recognise."""
    if isinstance(obj, types.MethodType):
        return [("__self__", obj.__self__), ("__func__", obj.__func__)]
    if isinstance(obj, types.FunctionType):
        out: list[tuple[str, Any]] = []
        for name, cell in zip(obj.__code__.co_freevars, obj.__closure__ or ()):
            with contextlib.suppress(ValueError):  # an empty cell
                out.append((name, cell.cell_contents))
        glb = obj.__globals__
        for name in _global_names(obj.__code__):
            if name in glb and not isinstance(glb[name], types.ModuleType):
                out.append((name, glb[name]))
        out += [(f"<default {i}>", value) for i, value in enumerate(obj.__defaults__ or ())]
        out += list((obj.__kwdefaults__ or {}).items())
        return out
    if isinstance(obj, dict):
        return [(f"[{k!r}]", v) for k, v in obj.items()]
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [(f"[{i}]", v) for i, v in enumerate(obj)]
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        return [(f".{k}", v) for k, v in attrs.items()]
    return []


def _global_names(code: types.CodeType) -> list[str]:
    names = list(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += _global_names(const)
    return names


def find_unpicklable(obj: Any, path: str, depth: int = 6) -> Optional[tuple[str, str, str]]:
    """(path, what it is, why) of the innermost part of ``obj`` that cannot be pickled, or None."""
    why = _fails(obj)
    if why is None:
        return None
    seen: set[int] = {id(obj)}
    here = (path, _describe(obj), why)
    for _ in range(depth):
        for name, child in _children(obj):
            if id(child) in seen:
                continue
            seen.add(id(child))
            child_why = _fails(child)
            if child_why is not None:
                sep = "" if name.startswith(("[", ".")) else "."
                path, obj = f"{path}{sep}{name}", child
                here = (path, _describe(child), child_why)
                break
        else:
            break
    return here


def _describe(obj: Any) -> str:
    device = _device_tensor(obj)
    if device:
        return device
    kind = type(obj)
    name = kind.__qualname__ if kind.__module__ in ("builtins", "_io") else f"{kind.__module__}.{kind.__qualname__}"
    return f"a {name}"


def check_picklable(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], items: Optional[list[Any]]) -> None:
    """Refuse, naming the object, what cannot travel to the ranks (before anything is submitted)."""
    load_cloudpickle()  # missing: its own error, not "cannot send" for every object
    fname = getattr(fn, "__qualname__", None) or type(fn).__name__
    parts: list[tuple[str, Any]] = [(fname, fn)]
    parts += [(f"argument {i}", a) for i, a in enumerate(args)]
    parts += [(f"keyword {k}", v) for k, v in kwargs.items()]
    parts += [(f"item {i}", v) for i, v in enumerate(items or ())]
    for label, value in parts:
        found = find_unpicklable(value, label)
        if found is not None:
            where, what, why = found
            hint = (
                "move it to the CPU (.cpu()) before submitting, or create it inside the function"
                if what.startswith("a tensor on") else
                "create it inside the function (locks, open files, sockets and GPU state do not travel to other machines)"
            )
            raise SpecError(f"cannot send {where} ({what}) to the job: {why}", hint)


# --- the directory ---------------------------------------------------------------------------------
class FunctionDir:
    """Paths and records of one submitted function (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @classmethod
    def new(cls, output_dir: str, name: str) -> FunctionDir:
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}-{os.urandom(3).hex()}"
        return cls(Path(output_dir).absolute() / f"{name}-fn-{stamp}")

    meta_path = property(lambda self: self.path / "meta.json")
    pickle_path = property(lambda self: self.path / "fn.pkl")

    def _sub(self, kind: str, task: Optional[int]) -> Path:
        return self.path / kind / (f"task-{task}" if task is not None else "")

    def result_path(self, rank: int, task: Optional[int] = None) -> Path:
        return self._sub("results", task) / f"rank-{rank:05d}.pkl"

    def state_path(self, rank: int, task: Optional[int] = None) -> Path:
        return self._sub("state", task) / f"rank-{rank:05d}.pkl"

    def write(self, payload: bytes, meta: dict[str, Any]) -> None:
        atomic_write(self.pickle_path, payload)
        atomic_write(self.meta_path, (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode())

    def meta(self) -> dict[str, Any]:
        try:
            data: dict[str, Any] = json.loads(self.meta_path.read_text())
        except (OSError, ValueError) as e:
            raise SpecError(f"{self.meta_path}: cannot read the function's record ({e})",
                            "the directory must be on a filesystem the ranks share with the submitter "
                            "(give output_dir= a shared path)") from None
        return data

    def records(self, task: Optional[int] = None) -> dict[int, dict[str, Any]]:
        """Every rank's record present so far, by rank (a record is written whole or not at all)."""
        out: dict[int, dict[str, Any]] = {}
        for p in sorted(self._sub("results", task).glob("rank-*.pkl")):  # none before the directory exists
            with contextlib.suppress(OSError, ValueError, pickle.UnpicklingError, EOFError):
                out[int(p.stem.split("-")[1])] = pickle.loads(p.read_bytes())
        return out


def atomic_write(path: Path, data: bytes) -> None:
    """Write whole or not at all: a reader never sees half a record (a temporary file, then a rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
