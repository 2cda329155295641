"""torchhpc's warm restarts: a standby interpreter with torch imported, on each node, hands a restarted rank its
program instead of a new Python importing torch again (src/torchhpc/supervisor/standby.py starts them).

Why: after a node loss, a third of the time to the next attempt's first step was ``import torch`` in every new
rank (2.5-3.6 s here). HyperPod and NVRx call it restart overhead and keep processes warm; so does this.

``python warm.py serve NAME [MODULE...]``: the standby. It listens on the abstract Unix socket
``NAME-<node>`` (one network namespace: this node; only this user may connect: SO_PEERCRED), then imports
the MODULEs (torch). Each request forks a child that becomes the rank: the client's stdin, stdout and stderr,
its environment, its working directory, its argv; the boot's per-rank parts run again (the exit cures,
the return mark, the heartbeat: sitecustomize.py) and the program runs as ``__main__``. The child's exit
status goes back to the client; a client that dies (srun's SIGKILL) takes the child with it, and everything
the child started (torchrun's workers, in sessions of their own, included).

``python -I -S warm.py run PYTHON ARGS...``: the client, what the task shim (task.sh) execs on a restart in
place of ``PYTHON ARGS...`` when ``$TORCHHPC_WARM`` names the standby. It passes on the signals it gets and
ends as the child ended (its code, or its signal). ``PYTHON script``, ``PYTHON -m module`` (with -u, -B,
-O) start warm; anything else, a PYTHON that is not the standby's, or no standby on this node: a cold
start as before, said in one line on stderr. torchrun's agent (``PYTHON -m torch.distributed.run``) is
handed over the same way by the boot's sitecustomize (:func:`agent`), before it imports anything.
Stdlib only; no torchhpc import (it runs where the rank runs).
"""

import array
import errno
import json
import os
import select
import signal
import socket
import struct
import sys
import time

WARM_VAR = "TORCHHPC_WARM_STANDBY"  # the standby's name (supervisor/standby.py: the same name)
PYTHON_VAR = "TORCHHPC_WARM_PYTHON"  # its Python (the same)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGQUIT)
FLAGS = {"-u", "-B", "-O", "-OO"}
BIND_WAIT_S = 3.0  # a standby starts with its job: its socket is bound a Python start-up after
TERM_GRACE_S = 60.0  # SIGTERM to a standby with ranks: they end by their own signals first (Slurm's KillWait is 30 s)


def address(name, environ=os.environ):
    node = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    return "\0" + f"{name}-{node}"


def say(text):
    sys.stderr.write(f"torchhpc: warm start: {text}\n")
    sys.stderr.flush()


# -- the client ------------------------------------------------------------------------------------------
def parse(argv):
    """(flags, "script"|"module", target, args) of ``PYTHON ARGS...``; None for a form not started warm."""
    flags, i = [], 1
    while i < len(argv) and argv[i] in FLAGS:
        flags.append(argv[i])
        i += 1
    if i < len(argv) and argv[i] == "-m" and i + 1 < len(argv):
        return flags, "module", argv[i + 1], argv[i + 2:]
    if i < len(argv) and not argv[i].startswith("-"):
        return flags, "script", argv[i], argv[i + 1:]
    return None


def cold(argv, why):
    """The task shim's cold start: the program exec'd as it was (said, unless a first attempt's: ``why`` None)."""
    if why:
        say(f"{why}: cold start")
    os.execv(argv[0], argv)


def client(argv, cold=cold):
    """Hand ``PYTHON ARGS...`` to this node's standby and end as its child ends; ``cold(argv, why)`` where it
    cannot (the task shim's default: exec the program as it is)."""
    name = os.environ.get(WARM_VAR, "")
    form = parse(argv)
    if not name:  # a first attempt: no standby named, nothing to say
        return cold(argv, None)
    if form is None:
        return cold(argv, "not a form started warm (PYTHON script or PYTHON -m module)")
    deadline = time.monotonic() + BIND_WAIT_S
    while True:  # a first attempt may start beside its standby: give it the moment it takes to bind
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(address(name))
            break
        except OSError as e:
            sock.close()
            if e.errno != errno.ECONNREFUSED or time.monotonic() > deadline:
                return cold(argv, f"no standby interpreter on this node ({e.strerror or e})")
            time.sleep(0.02)
    flags, kind, target, args = form
    payload = json.dumps({"flags": flags, "kind": kind, "target": target, "args": args, "cwd": os.getcwd(),
                          "env": dict(os.environ)}).encode()
    fds = array.array("i", [0, 1, 2])
    sock.sendmsg([struct.pack("!Q", len(payload))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds.tobytes())])
    sock.sendall(payload)
    reader = sock.makefile("rb")
    line = reader.readline().split()
    if line[:1] != [b"P"]:
        return cold(argv, "the standby refused the program")
    pid = int(line[1])
    # where the rank is, for the hang probe (its /proc environ is the standby's); no space in it: Slurm's
    # proctrack/linuxproc reads /proc/PID/stat with a scanf that a name with a space breaks (the step's
    # signals then pass this client by)
    _name(f"warm:{pid}")
    for sig in FORWARDED:
        signal.signal(sig, lambda s, _f: _forward(pid, s))
    line = reader.readline().split()
    if line[:1] != [b"X"]:
        say("the standby ended before the program did")
        os._exit(1)
    status = int(line[1])
    sys.stdout.flush()
    if os.WIFSIGNALED(status):  # end as the child did: srun and first_end.sh read the signal
        if os.WTERMSIG(status) not in (signal.SIGKILL, signal.SIGSTOP):  # their action is fixed: no handler to reset
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status) if not os.WIFSIGNALED(status) else 128 + os.WTERMSIG(status))


def _name(comm):
    """This process's name (``/proc/PID/comm``, 15 bytes): prctl(PR_SET_NAME)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, comm.encode()[:15], 0, 0, 0)
    except (OSError, AttributeError):
        pass


def agent(argv):
    """torchrun's agent (``PYTHON -m torch.distributed.run ...``) on a restart, from the boot's sitecustomize:
    handed to the standby like a rank, so the agent does not import torch again. Its workers start through the
    task shim, warm too. Returns (the agent then starts cold, as before) where it cannot."""

    def start_cold(_argv, why):
        if why:
            say(f"torchrun's agent: {why}: cold start")

    if sys.executable != os.environ.get(PYTHON_VAR):
        return start_cold(argv, "another Python than the standby's")
    return client(argv, start_cold)


def _tree(root):
    """``root`` and every process descended from it (torchrun's workers start sessions of their own, so the
    agent's process group does not hold them)."""
    children: dict = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def _kill_tree(pid):
    """The child, its process group and everything it started: stopped first, so nothing forks meanwhile."""
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in _tree(pid):
            _forward(p, sig)
    try:
        os.killpg(pid, signal.SIGKILL)  # its own process group (become: setsid)
    except OSError:
        pass


def _forward(pid, sig):
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


# -- the standby -----------------------------------------------------------------------------------------
class Run(Exception):
    """Raised in a forked child: unwinds the standby's loop, then the program runs at the top level."""

    def __init__(self, request):
        super().__init__("run")
        self.request = request


def _recv(conn):
    """The client's request and its three descriptors, or None for a broken one."""
    data, ancdata, _flags, _addr = conn.recvmsg(8, socket.CMSG_SPACE(3 * array.array("i").itemsize))
    fds = array.array("i")
    for level, kind, raw in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(raw[: len(raw) - len(raw) % fds.itemsize])
    if len(data) != 8 or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        return None
    (size,) = struct.unpack("!Q", data)
    body = b""
    while len(body) < size:
        chunk = conn.recv(min(1 << 20, size - len(body)))
        if not chunk:
            return None
        body += chunk
    request = json.loads(body)
    request["fds"] = list(fds)
    return request


def serve(name, preload):
    parent = os.getppid()  # before the import: whoever started it may be gone before it is done
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address(name))  # first: a client that comes while torch imports waits instead of starting cold
    listener.listen(64)
    t0 = time.monotonic()
    for module in preload:
        __import__(module)
    print(f"torchhpc: warm: standby {address(name)[1:]} ready ({', '.join(preload) or 'nothing'} imported in "
          f"{time.monotonic() - t0:.1f} s)", flush=True)
    children: dict = {}  # pid -> the client's connection
    conns: dict = {}  # connection -> its child's pid
    me = os.getpid()
    # SIGTERM (a time limit, a cancel: Slurm signals every step) ends the standby once its ranks have ended by the
    # same signal, theirs to handle: killing them at once would end each rank by SIGKILL, and its job with 137
    term: list = []
    signal.signal(signal.SIGTERM, lambda _s, _f: term.append(time.monotonic()))
    try:
        _loop(listener, children, conns, parent, term)
    finally:
        if os.getpid() == me:  # the standby, not a forked rank unwinding with Run
            for pid in list(children):
                _kill_tree(pid)


def _loop(listener, children, conns, parent, term=()):
    while True:
        if os.getppid() != parent:  # whoever started it is gone (a local run killed): so are its ranks
            return
        if term and (not children or time.monotonic() - term[0] > TERM_GRACE_S):
            return
        ready, _, _ = select.select([*conns] if term else [listener, *conns], [], [], 0.05)
        for conn in ready:
            if conn is listener:
                conn, _addr = listener.accept()
                uid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))[1]
                request = _recv(conn) if uid == os.getuid() else None
                if request is None:
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    listener.close()
                    for other in (*conns, conn):
                        other.close()
                    raise Run(request)
                for fd in request["fds"]:
                    os.close(fd)
                conn.sendall(f"P {pid}\n".encode())
                children[pid], conns[conn] = conn, pid
            elif not conn.recv(64):  # the client is gone (srun killed it): so is its rank, and what it started
                _kill_tree(conns.pop(conn))
                conn.close()
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            conn = children.pop(pid, None)
            if conn is not None and conns.pop(conn, None) is not None:
                try:
                    conn.sendall(f"X {status}\n".encode())
                except OSError:
                    pass
                conn.close()


def _stdio(unbuffered):
    import io

    for fd, name in ((0, "stdin"), (1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "rb" if fd == 0 else "wb", closefd=False)
        layer: io.RawIOBase | io.BufferedIOBase = raw
        if fd == 0:
            layer = io.BufferedReader(raw)
        elif not unbuffered:
            layer = io.BufferedWriter(raw)
        stream = io.TextIOWrapper(layer, write_through=unbuffered, line_buffering=fd == 2 or raw.isatty(),  # type: ignore[arg-type,type-var]
                                  errors="backslashreplace" if fd == 2 else None)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def become(request):
    """In the child: the client's descriptors, environment, directory, path and argv; the boot's per-rank
    parts; then ``(kind, target)`` to run."""
    os.setsid()  # a process group of its own: a client that dies takes the rank's children too
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for i, fd in enumerate(request["fds"]):
        os.dup2(fd, i)
        os.close(fd)
    env = request["env"]
    os.chdir(request["cwd"])
    old_pp = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ.clear()
    os.environ.update(env)
    flags = request["flags"]
    _stdio("-u" in flags or bool(env.get("PYTHONUNBUFFERED")))
    sys.dont_write_bytecode = "-B" in flags or bool(env.get("PYTHONDONTWRITEBYTECODE"))
    new_pp = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    rest = [p for p in sys.path[1:] if p not in old_pp and p not in new_pp]
    first = os.path.dirname(os.path.abspath(request["target"])) if request["kind"] == "script" else os.getcwd()
    sys.path[:] = [first, *new_pp, *rest]
    sys.argv = [request["target"], *request["args"]]
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.util

    spec = importlib.util.spec_from_file_location("_torchhpc_boot", os.path.join(here, "sitecustomize.py"))
    assert spec is not None and spec.loader is not None
    boot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(boot)
    if env.get("TORCHHPC_EXIT_CURE", "1").strip().lower() not in boot._OFF:  # as task.sh: off, no boot at all
        sys.modules["_torchhpc_boot"] = boot
        boot.flight_env()
        boot.heartbeat()
        if boot.install():
            boot.ended()
    torch = sys.modules.get("torch")
    threads = env.get("OMP_NUM_THREADS", "")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _from_the_program(hook, runpy_file):
    """``hook`` shown a traceback that starts where a cold rank's would: at the program, without this file's and
    runpy's frames above it (a verdict reads the rank's traceback; the user reads their own code)."""
    mine = {os.path.abspath(__file__), os.path.abspath(runpy_file or "")}

    def trimmed(kind, value, tb):
        while tb is not None and (os.path.abspath(tb.tb_frame.f_code.co_filename) in mine
                                  or tb.tb_frame.f_code.co_filename.startswith("<frozen runpy")):
            tb = tb.tb_next
        if isinstance(value, BaseException):
            value.__traceback__ = tb  # what the default hook prints (it reads the exception's own)
        hook(kind, value, tb)

    trimmed.torchhpc_default = hook is sys.__excepthook__  # type: ignore[attr-defined]  # torchhpc.dist may put its own over it
    return trimmed


def main(argv):
    if argv[1:2] == ["run"]:
        return client(argv[2:])
    if argv[1:2] == ["serve"] and len(argv) > 2:
        try:
            serve(argv[2], argv[3:])
            return None
        except Run as r:
            request = r.request  # the program runs outside this handler: its exceptions have no Run as context
        become(request)
        import runpy

        sys.excepthook = _from_the_program(sys.excepthook, runpy.__file__)
        if request["kind"] == "module":
            runpy.run_module(request["target"], run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(request["target"], run_name="__main__")
        return None  # the program's end is the interpreter's: exit hooks, threads joined, as a cold rank's
    sys.stderr.write("usage: warm.py serve NAME [MODULE...] | warm.py run PYTHON ARGS...\n")
    return 2


if __name__ == "__main__":
    _code = main(sys.argv)
    if _code is not None:
        sys.exit(_code)
