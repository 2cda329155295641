"""torchhpc rank boot (src/torchhpc/launchers/boot.py): the gloo exit cures, without an import in the program.

Once torch.distributed is imported: settle the gloo threads at exit, and before destroy_process_group
(which exits the rank with all tracebacks after $TORCHHPC_DESTROY_TIMEOUT s, default 60, 0: never).
Also turns torch's Flight Recorder on and dumps it into the job directory when the hang watch asks
($TORCHHPC_FLIGHT_RECORDER: entries per rank, default 2000; off: none).
Marks the moment the rank's program returned (``<job dir>/ended/rank-N``: main script ended, sys.exit,
or an uncaught exception), so that the hang watch can tell a hang from an exit that is slow or stuck.
Beats to the supervisor ($TORCHHPC_HEARTBEAT), so that a lost node is found in about a second.
Stdlib only, no eager torch import; then the hidden sitecustomize runs. TORCHHPC_EXIT_CURE=0: off.
"""

import atexit
import os
import sys
import time

TORCHHPC_BOOT = 1
GLOO_WORKER = "pt_gloo_runloop"
HOOKED = "torch.distributed"
_OFF = ("0", "false", "no", "off", "none")  # core/units.py OFF_WORDS (this file is stdlib only): held equal by a test


def _worker_states(name=GLOO_WORKER):
    """The scheduler state (R, S, D, ...) of each thread of this process named ``name``; None without /proc."""
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    states = []
    for tid in tids:
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                if f.read().strip() != name:
                    continue
            with open(f"/proc/self/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
    return states


def gloo_workers_settle(timeout=5.0, every=0.01, quiet=3):
    """Sleep (GIL released) until every gloo worker has been asleep ``quiet`` samples in a row; False on timeout."""
    deadline = time.monotonic() + timeout
    calm = 0
    while True:
        states = _worker_states()
        if not states:
            return True
        calm = calm + 1 if all(s in ("S", "D") for s in states) else 0
        if calm >= quiet:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(every)


def _destroy_limit():
    text = os.environ.get("TORCHHPC_DESTROY_TIMEOUT", "60").strip() or "0"
    try:
        return max(0.0, float(text))
    except ValueError:
        sys.stderr.write(f"torchhpc: TORCHHPC_DESTROY_TIMEOUT={text!r} is not a number of seconds; using 60\n")
        return 60.0


def _guarded(destroy):
    """``destroy`` after the gloo threads settled, with the faulthandler watchdog (a C thread: it needs no GIL)."""
    import faulthandler
    import functools

    @functools.wraps(destroy)
    def destroy_process_group(*args, **kwargs):
        if (args[0] if args else kwargs.get("group")) is None:  # the world's: the program's teardown has begun
            mark_teardown()
        gloo_workers_settle()
        limit = _destroy_limit()
        if limit:
            sys.stderr.flush()
            faulthandler.dump_traceback_later(limit, exit=True)
        try:
            return destroy(*args, **kwargs)
        finally:
            if limit:
                faulthandler.cancel_dump_traceback_later()

    setattr(destroy_process_group, "_torchhpc_guard", True)  # noqa: B010 (a function attribute, untyped)
    return destroy_process_group


FR_VAR = "TORCHHPC_FLIGHT_RECORDER"
FR_DEFAULT = "2000"  # collectives kept per rank: a few steps of a large model, ~1 MB
FR_REQUEST = "request"  # <fr dir>/request, touched by the hang watch: every rank then writes <fr dir>/rank-N


def flight_dir(environ=os.environ):
    """Where this rank's Flight Recorder dumps go ("" when off or unknown): $TORCHHPC_FR_DIR, else
    ``fr/`` beside the job's rank logs. Never a node's /tmp: the watch reads them from the job directory."""
    if environ.get(FR_VAR, "").strip().lower() in _OFF:
        return ""
    ranks = environ.get("TORCHHPC_RANKS_DIR", "").rstrip("/")
    return environ.get("TORCHHPC_FR_DIR") or (os.path.join(os.path.dirname(ranks), "fr") if ranks else "")


def torch_version(path=None):
    """(major, minor) of the torch this interpreter would import, from its version.py (no import); None if not found."""
    for d in sys.path if path is None else path:
        try:
            with open(os.path.join(d or ".", "torch", "version.py")) as f:
                text = f.read(8192)
        except OSError:
            continue
        for line in text.splitlines():
            if line.startswith("__version__"):
                parts = line.split("=", 1)[-1].strip().strip("'\"").split(".")
                try:
                    return int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
                except (IndexError, ValueError):
                    return None
        return None
    return None


def flight_env(environ=os.environ):
    """Turn the recorder on before torch reads its variables; the user's own values win."""
    want = environ.get(FR_VAR, "").strip().lower()
    if want in _OFF:
        return
    size = environ.get("TORCH_FR_BUFFER_SIZE") or environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE")
    size = size or (want if want.isdigit() else FR_DEFAULT)
    environ.setdefault("TORCH_FR_BUFFER_SIZE", size)
    old = (torch_version() or (0, 0)) < (2, 7)  # the names torch before 2.7 reads (2.7+ warns on every rank)
    if old:
        environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", size)
    d = flight_dir(environ)
    if d:  # NCCL's own dump on a watchdog timeout lands beside ours (torch appends the rank)
        environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
        environ.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE" if old else "TORCH_FR_DUMP_TEMP_FILE", os.path.join(d, "rank-"))


def flight_dump(d, suffix=""):
    """This rank's recorder into ``<d>/rank-N<suffix>`` (tmp + rename); False when no group is up.

    Runs on a thread of its own: a rank blocked inside a collective dumps too (the call waits with
    the GIL released). Collectives only, no C++ stacks (those cost a second; py-spy reads the stacks)."""
    dist = sys.modules.get(HOOKED)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    path = os.path.join(d, f"rank-{dist.get_rank()}{suffix}")
    try:
        import torch._C._distributed_c10d as c10d

        # NCCL keeps its own recorder (its entries carry CUDA events); gloo's is the generic one
        nccl = "nccl" in str(dist.get_backend()) and hasattr(c10d, "_dump_nccl_trace")
        data = (c10d._dump_nccl_trace if nccl else c10d._dump_fr_trace)(True, False, False)  # type: ignore[attr-defined]
    except Exception as e:  # an old torch, a backend without a recorder: say so where the watch looks
        data, path = f"{type(e).__name__}: {e}".encode(), path + ".error"
    os.makedirs(d, exist_ok=True)
    with open(f"{path}.{os.getpid()}", "wb") as f:
        f.write(data)
    os.replace(f"{path}.{os.getpid()}", path)
    return True


def _flight_watch(d, every=0.5):
    """Dump whenever ``<d>/request`` changes (a stat every ``every`` s: no cost worth measuring)."""
    request, seen = os.path.join(d, FR_REQUEST), None
    while True:
        time.sleep(every)
        try:
            stamp = os.stat(request).st_mtime_ns
        except OSError:
            continue
        if stamp != seen:
            seen = stamp
            try:
                flight_dump(d)
            except Exception as e:
                sys.stderr.write(f"torchhpc: flight recorder dump failed ({type(e).__name__}: {e})\n")


def _left_group(d):
    """At exit with the process group still up (no destroy_process_group): dump, marked as leaving."""
    try:
        flight_dump(d, ".left")
    except Exception:
        pass


def flight(d):
    """The dump thread and the exit dump, for a job that has a directory to dump into."""
    import threading

    if not d or not os.path.isdir(os.path.dirname(d.rstrip("/"))):
        return
    atexit.register(_left_group, d)
    threading.Thread(target=_flight_watch, args=(d,), name="torchhpc-flight", daemon=True).start()


HEARTBEAT_VAR = "TORCHHPC_HEARTBEAT"  # host:port of the supervisor's socket (supervisor/liveness.py: the same names)
HEARTBEAT_EVERY = 0.2


def heartbeat(environ=os.environ, every=HEARTBEAT_EVERY):
    """A datagram every ``every`` s to the supervisor, naming this node, from a daemon thread: a node whose ranks
    all go silent is probed at once, so a lost node is found in about a second (a silent node that still answers
    the probe is a busy one, not a dead one). Nothing without ``$TORCHHPC_HEARTBEAT``; an error ends it quietly."""
    host, _, port = environ.get(HEARTBEAT_VAR, "").rpartition(":")
    if not host or not port.isdigit():
        return None
    import socket
    import threading

    node = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    message = f"torchhpc-hb {node} {os.getpid()}".encode()

    def beat():
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                while True:
                    try:
                        s.sendto(message, (host, int(port)))
                    except OSError:  # no route for now (a network blip): the next beat tries again
                        pass
                    time.sleep(every)
        except Exception:
            return

    thread = threading.Thread(target=beat, name="torchhpc-heartbeat", daemon=True)
    thread.start()
    return thread


ENDED_DIR = "ended"  # <job dir>/ended/rank-N (diagnose/exits.py reads it: the same name there)
_EXIT_CODE: list = []  # what sys.exit was called with, if it was


def job_dir(environ=os.environ):
    """The job's directory, as the scheduler told the rank ("" when it did not)."""
    ranks = environ.get("TORCHHPC_RANKS_DIR", "").rstrip("/")
    fr = environ.get("TORCHHPC_FR_DIR", "").rstrip("/")
    return environ.get("TORCHHPC_JOB_DIR") or (os.path.dirname(ranks) if ranks else os.path.dirname(fr) if fr else "")


def mark_ended(d, rank, world):
    """Write ``<d>/rank-N``: when this rank's program returned and how. Runs first at interpreter exit
    (threading's own exit hooks run before non-daemon threads are joined and before atexit), so what
    follows (destroy_process_group in an atexit handler, threads joined) counts as the exit. A process
    the rank started with multiprocessing is not the rank: it marks nothing."""
    mp = sys.modules.get("multiprocessing")
    if mp is not None and mp.parent_process() is not None:
        return False
    err = getattr(sys, "last_value", None)  # set by the interpreter for an uncaught exception, whatever the hook
    how = f"raised {type(err).__name__}" if err is not None else f"exit {_EXIT_CODE[-1]}" if _EXIT_CODE else "returned"
    text = f'{{"rank": {rank}, "world": {world}, "time": {time.time():.3f}, "how": "{how}", "pid": {os.getpid()}}}'
    try:
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"rank-{rank}")
        with open(f"{path}.{os.getpid()}", "w") as f:
            f.write(text + "\n")
        os.replace(f"{path}.{os.getpid()}", path)
    except OSError:
        return False
    return True


_MARKS: list = []  # (the ended dir, rank) once ended() registered this rank


def mark_teardown():
    """``<ended dir>/rank-N.teardown``: this rank began destroying its default group (the watch then reads
    a quiet rank as ending, not hung, even where py-spy cannot read its stack)."""
    for d, rank in _MARKS:
        try:
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, f"rank-{rank}.teardown"), "w") as f:
                f.write(f"{time.time():.3f}\n")
        except OSError:
            pass


def ended(environ=os.environ):
    """Register the mark for a rank of a job with a directory (RANK and WORLD_SIZE set)."""
    import threading

    d, rank, world = job_dir(environ), environ.get("RANK", ""), environ.get("WORLD_SIZE", "")
    if not d or not rank.isdigit() or not world.isdigit():
        return False
    real_exit = sys.exit

    def exit(status=None):  # sys.exit's own name: the mark says which code the program asked for
        _EXIT_CODE.append(status if status is None or isinstance(status, int) else 1)
        real_exit(status)

    sys.exit = exit
    register = getattr(threading, "_register_atexit", None) or atexit.register
    register(mark_ended, os.path.join(d, ENDED_DIR), int(rank), int(world))
    _MARKS.append((os.path.join(d, ENDED_DIR), int(rank)))
    return True


def cure(module):
    """Apply the cures to a freshly imported ``torch.distributed`` (and its c10d module)."""
    atexit.register(gloo_workers_settle)
    flight(flight_dir())
    mods = [module, sys.modules.get("torch.distributed.distributed_c10d")]
    for mod in mods:
        destroy = getattr(mod, "destroy_process_group", None)
        if destroy is not None and not getattr(destroy, "_torchhpc_guard", False):
            setattr(mod, "destroy_process_group", _guarded(destroy))  # noqa: B010


class _Loader:
    """The real loader of ``torch.distributed``, with :func:`cure` after the module ran."""

    def __init__(self, loader):
        self._loader = loader

    def __getattr__(self, name):
        return getattr(self._loader, name)

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        try:
            cure(module)
        except Exception as e:  # never break the import for a cure
            sys.stderr.write(f"torchhpc: exit cure not applied ({type(e).__name__}: {e})\n")


class Finder:
    """A meta path finder that answers for ``torch.distributed`` only, once: a string compare per import."""

    def find_spec(self, name, path=None, target=None):
        if name != HOOKED:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)  # once: and the other finders below must not find us again
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader)
        return spec


def install():
    """The finder, unless ``TORCHHPC_EXIT_CURE`` is off or torch.distributed is already imported."""
    if os.environ.get("TORCHHPC_EXIT_CURE", "1").strip().lower() in _OFF:
        return False
    if HOOKED in sys.modules:
        cure(sys.modules[HOOKED])
        return True
    sys.meta_path.insert(0, Finder())
    return True


def chain():
    """Run the next ``sitecustomize`` on sys.path (the one this file hides), as ``sitecustomize``."""
    finders = [f for f in sys.meta_path if getattr(f, "__name__", "") == "PathFinder"]  # importlib costs more
    if not finders:
        return None
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = finders[0].find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return None
    module = spec.loader.create_module(spec) or type(sys)(spec.name)
    module.__spec__, module.__loader__, module.__file__ = spec, spec.loader, spec.origin
    if spec.cached:
        setattr(module, "__cached__", spec.cached)  # noqa: B010 (not in the ModuleType stub)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)  # an error propagates: site.py reports it, as without torchhpc
    return module


def warm_agent(environ=os.environ):
    """torchrun's agent on a restart: handed to the node's standby (boot/warm.py), whose torch is imported."""
    if environ.get("TORCHHPC_WARM_STANDBY") and sys.orig_argv[1:3] == ["-m", "torch.distributed.run"]:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "warm.py")
        with open(path) as f:
            exec(compile(f.read(), path, "exec"), warm := {"__name__": "_torchhpc_warm"})
        warm["agent"](sys.orig_argv)  # type: ignore[operator]  # returns only to start cold


if __name__ == "sitecustomize":
    sys.modules["_torchhpc_boot"] = sys.modules[__name__]  # stays reachable once chain() replaced the name
    warm_agent()
    flight_env()
    heartbeat()
    if install():
        ended()
    chain()
