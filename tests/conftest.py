"""Shared test fixtures.

``HOSTILE`` values are the inputs every renderer must carry through a real
shell unchanged (after submitit's ``weird_tmp_path``).

Tests that need a real scheduler are marked ``@pytest.mark.cluster("slurm")``
and use the ``slurm_cluster`` fixture (tests/integration/conftest.py). Without a
cluster they skip locally, but when ``CI=true`` a missing cluster is a failure:
CI must never pass by skipping the real thing.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import pytest

from tests.schedule import busy_seconds

pytest_plugins = ["tests.parallel", "tests.cluster_keeper"]

HOSTILE: list[str] = [
    "a 0",
    'a"=0"',
    "a'; echo foo",
    "a\\=",
    "line1\nline2",
    "$HOME",
    "$(touch pwned)",
    "`touch pwned2`",
    "a;b&&c|d",
    "#not a comment",
    "",
    "*",
    "~root",
]

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def load_file(path: Path, name: str | None = None) -> ModuleType:
    """A Python file that is not in a package (a script, a benchmark, the boot copy), imported as a module."""
    spec = importlib.util.spec_from_file_location(name or path.stem, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def hang_timeout(seconds: float) -> str:
    """``--hang-timeout`` for a test that plants a hang: ``seconds`` up to a load of 4 runnable processes a core
    (the side-by-side suite's usual), up to twice that as the load rises beyond (8 a core: load 16 on 2 cores).
    A rank starting at load 30 may go seconds between outputs and CPU use; a constant that fits load 1 is the
    floor, not the rule (issue 66). Capped: every hang test waits this long, several times over."""
    per_core = os.getloadavg()[0] / (os.cpu_count() or 1)
    return f"{seconds * min(2.0, max(1.0, per_core / 4)):.0f}"


@pytest.fixture(params=HOSTILE, ids=lambda v: repr(v)[:20])
def hostile(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def missing(reason: str) -> NoReturn:
    """Skip locally; fail in CI (where the real thing is mandatory). Also at a module's top level."""
    if in_ci():
        pytest.fail(f"{reason} (CI=true makes this mandatory)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def container_image_env() -> dict[str, str]:
    """The container test image's variables (``$CACHE/env``: the podman wrapper, the image names and paths),
    built or reused by .ci/build-test-image.sh, which waits on a build already under way (its lock) and finds
    a finished one cached. Root on Linux only; :func:`missing` otherwise. Every container test asks here."""
    if sys.platform != "linux" or os.geteuid() != 0:
        missing("container tests need root on Linux (ch-run, podman, debootstrap)")
    build = REPO / ".ci" / "build-test-image.sh"
    r = subprocess.run(["bash", str(build)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        missing(f"{build.name} failed: {r.stderr[-2000:]}")
    cache = Path(os.environ.get("TORCHHPC_TEST_IMAGE_CACHE", "/var/tmp/torchhpc-test-image"))
    return dict(re.findall(r"^export (\w+)=(.*)$", (cache / "env").read_text(), re.M))


def need(module: str, why: str = "") -> Any:
    """``pytest.importorskip`` under the :func:`missing` rule: the module, else a skip here and a failure in
    CI (whose venv has the dev, lightning and compat extras: scripts/test.sh). At a module's top level
    the whole module fails in CI rather than skipping unseen."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing(f"{module} cannot be imported ({e})" + (f": {why}" if why else ""))


@contextmanager
def reaped(procs: Sequence[subprocess.Popen[Any]]) -> Iterator[Sequence[subprocess.Popen[Any]]]:
    """Kill and reap every process still running when the block ends: a ``communicate`` timeout or a
    failed assertion must not leave ranks running (and holding ports) into the next test."""
    try:
        yield procs
    finally:
        running = [p for p in procs if p.poll() is None]
        for p in running:
            p.kill()
        for p in running:
            try:
                p.communicate(timeout=30)  # reaps it and closes its pipes
            except (subprocess.TimeoutExpired, ValueError, OSError):
                p.wait(timeout=30)


_PYTEST_OWN = "PYTEST_CURRENT_TEST"  # pytest sets it for each phase (setup, call, teardown)
# torch's rendezvous contract: what a job submitted from this process would inherit and trust
_CONTRACT = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
             "GROUP_RANK", "TORCHELASTIC_RUN_ID")
_SESSION_ENV = dict(os.environ)  # as this process (an xdist worker, or the one pytest) started

# A suite started in the background of a script (`./scripts/test.sh &`, `nohup ... &`) inherits SIGINT ignored:
# a non-interactive shell ignores it for its `&` jobs, and Python then leaves it ignored, so every process the
# tests start would too. The Ctrl-C tests' clients then slept through their SIGINT (runs D and F: a 60-180 s
# timeout). The tests stand for a user at a terminal, where Ctrl-C is Python's KeyboardInterrupt.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _restore(names: Sequence[str], snapshot: dict[str, str]) -> None:
    """``os.environ``'s ``names`` as they were in ``snapshot`` (set, or unset where it had none)."""
    for k in names:
        if k in snapshot:
            os.environ[k] = snapshot[k]
        else:
            os.environ.pop(k, None)


@pytest.fixture(autouse=True)
def _environ_as_found(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test leaves ``os.environ`` as it found it (restored, and named in the run's warnings summary).
    A test that set MASTER_ADDR=127.0.0.1 in-process once made a later cluster test of the same xdist
    worker rendezvous at 127.0.0.1 across two nodes: a 400 s hang far from its cause. Fixtures of a
    wider scope set up before this one, so their variables stand."""
    stale = sorted(k for k in _CONTRACT if os.environ.get(k) != _SESSION_ENV.get(k))
    _restore(stale, _SESSION_ENV)  # left by a wider fixture, or by in-process code at import: a job would inherit it
    if stale:
        warnings.warn(f"found os.environ changed before this test (restored): {', '.join(stale)}", stacklevel=1)
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k) and k != _PYTEST_OWN)
    if changed:
        _restore(changed, before)
        warnings.warn(f"left os.environ changed (restored): {', '.join(changed)}", stacklevel=1)


@pytest.fixture
def clean_user_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No TORCHHPC_*/SBATCH_* variables, no user config (HOME is the test's tmp dir), job state in
    the tmp dir too, and the repository as the working directory (examples/pi.py resolves)."""
    for k in list(os.environ):
        if k.startswith(("TORCHHPC_", "SBATCH_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(REPO)


# --- nothing left behind -----------------------------------------------------------------------------
# Every process a test starts inherits this variable (subprocesses copy os.environ): one still running
# when the session ends was left behind. The dev cluster's daemons are started outside a test run.
SESSION_VAR = "PYTEST_THPC_SESSION"  # not TORCHHPC_*: clean_user_env drops those
_DAEMONS = ("slurmctld", "slurmd", "slurmdbd", "slurmstepd", "munged", "mariadbd", "mysqld", "dnsmasq", "sshd")


def _untracked() -> set[str]:
    """Files in the checkout that git neither tracks nor ignores (empty where git is unavailable)."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=all"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return {line[3:] for line in done.stdout.splitlines() if line.startswith("?? ")}


def _live(skip: set[int]) -> Iterator[tuple[str, str]]:
    """``(PID, COMMAND NAME)`` of every process but the zombies and ``skip``, from /proc (one place parses
    ``/proc/PID/stat``; the callers read what else they need, a process that ends meanwhile is passed over)."""
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if not entry.isdigit() or int(entry) in skip:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode(errors="replace")
            comm, state = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:][:1]
        except (OSError, ValueError):
            continue  # ended meanwhile
        if state != "Z":
            yield entry, comm


def session_processes(marker: str) -> list[str]:
    """``PID COMMAND`` of live processes of this user whose environment holds ``SESSION_VAR=marker``."""
    mine, found = os.getuid(), []
    needle = f"{SESSION_VAR}={marker}".encode()
    for entry, comm in _live({os.getpid(), os.getppid()}):
        if comm in _DAEMONS:
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid != mine:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(f"{entry} {comm}")
        except OSError:
            continue  # ended meanwhile, or not ours to read
    return found


def left_running(marker: str, directory: Path, wait: float = 10.0) -> list[str]:
    """``PID COMMAND`` of live processes whose command line names ``marker`` and whose working directory
    lies in ``directory`` (a test's ``tmp_path``): that test's own ranks, on this machine or on a dev
    cluster node (they share its PID namespace), still there after up to ``wait`` seconds (a rank that
    was sent SIGKILL can take a moment to go on a loaded machine; a leaked one stays). A bare
    ``pgrep -f SCRIPT`` also saw the ranks of another test running the same script beside it."""
    deadline = time.monotonic() + wait
    while True:
        found = _running_in(marker, os.path.realpath(directory))
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def _running_in(marker: str, root: str) -> list[str]:
    found = []
    for entry, _ in _live({os.getpid()}):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:
            continue  # ended meanwhile, or not ours to read
        if marker in cmd and (cwd == root or cwd.startswith(root + os.sep)):
            found.append(f"{entry} {cmd}")
    return found


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind() -> Iterator[None]:
    """Fail the run when its tests left a process running. Under xdist each worker checks its own
    (its own marker); the files and the dev cluster's queue are the controller's to check
    (:func:`pytest_sessionfinish`): a worker cannot tell another worker's work in flight from litter."""
    marker = uuid.uuid4().hex
    os.environ[SESSION_VAR] = marker
    yield
    left: list[str] = []
    for _ in range(20):  # a background supervisor finishing its last write: a few seconds at most
        left = session_processes(marker)
        if not left:
            break
        time.sleep(0.5)
    if left:
        pytest.fail(f"processes the tests started are still running: {', '.join(left)} "
                    "(a test must clean up in a finally or a fixture)", pytrace=False)


def _controller(config: pytest.Config) -> bool:
    """The one process that sees the whole run: xdist's controller, or pytest itself without xdist."""
    return not hasattr(config, "workerinput")


_BEFORE = pytest.StashKey[tuple[set[str], set[str]]]()


def _run_dir(config: pytest.Config) -> str:
    """This run's temporary folder (xdist's workers have theirs inside it): a job whose script or working
    directory lies in it is this run's. Other runs on the same dev cluster (a second developer, a
    helper) are left alone."""
    return str(config._tmp_path_factory.getbasetemp())  # type: ignore[attr-defined]


def pytest_sessionstart(session: pytest.Session) -> None:
    if _controller(session.config):
        from tests.cluster_queue import queued

        session.config.stash[_BEFORE] = (_untracked(), set(queued()))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when it left a new file in the checkout (CI ran ``sbatch`` from the repository root
    once, and eight slurm-N.out files were committed) or a job of its own in the dev cluster's queue."""
    if not _controller(session.config) or _BEFORE not in session.config.stash:
        return
    from tests.cluster_queue import cancel, left_in_queue, names_any

    files_before, jobs_before = session.config.stash[_BEFORE]
    new = sorted(_untracked() - files_before)
    mine = (_run_dir(session.config),)
    jobs = left_in_queue(lambda job, fields: job not in jobs_before and names_any(fields, mine))
    problems = ([f"new files in the checkout: {', '.join(new[:20])}"] if new else []) + (
        [f"jobs left in the dev cluster's queue: {', '.join(f'{j} ({s})' for j, s in jobs.items())} "
         "(cancelled now)"] if jobs else [])
    if jobs:
        cancel(jobs)
    if problems:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        text = "; ".join(problems) + " (a test must clean up in a finally or a fixture)"
        if reporter is not None:
            reporter.write_line(f"FAILED nothing left behind: {text}", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --------------------------------------------------------------------------- where the suite's time goes
# With TORCHHPC_TEST_TIMES=FILE, each test appends one JSON line: its node id, its wall seconds, and the
# CPU seconds the whole machine spent meanwhile (/proc/stat: every process, the dev cluster's ranks
# included). scripts/test_times.py turns the file into docs/testing.md's table by module: wall time
# and how much of it the machine waited (issue 53). Off unless asked; a line per test, nothing else.
_TIMES = os.environ.get("TORCHHPC_TEST_TIMES")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Any) -> Iterator[None]:
    if not _TIMES:
        yield
        return
    start, busy, began = time.monotonic(), busy_seconds(), time.time()
    yield
    import json

    line = {"test": item.nodeid, "start": round(began, 1), "wall_s": round(time.monotonic() - start, 3),
            "cpu_s": round(busy_seconds() - busy, 3), "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}
    # side by side, the seconds it waited for the run lock or a slot (tests/parallel.py), within wall_s
    line.update((k, v) for k, v in item.user_properties if k in ("lock_wait_s", "slot_wait_s", "spare_slot"))
    with open(_TIMES, "a") as f:
        f.write(json.dumps(line) + "\n")


def hogs_wanted(n: int, load: float, cpus: int) -> int:
    """Busy loops still needed for ``n`` of them's worth of load: none where the machine already runs
    that many more processes than it has CPUs (the suite side by side, load 10-12 on 2 cores: there
    two more loops only took CPU from the tests beside), all ``n`` on a quiet machine."""
    return max(0, min(n, round(n + cpus - load)))


@contextmanager
def busy_loops(n: int) -> Iterator[None]:
    """n processes' worth of load spinning on the CPU (the load that widens teardown races), minus the
    load already there (:func:`hogs_wanted`); killed by PID after."""
    n = hogs_wanted(n, os.getloadavg()[0], os.cpu_count() or 1)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()
