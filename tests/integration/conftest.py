"""Fixtures for tests that run on the real Slurm dev cluster.

Bring the cluster up once (as root, on Linux)::

    torchhpc devcluster up --nodes 4 --cpus-per-node 12 --accounting

(scripts/test.sh's command; 12 CPUs a node so that tests side by side never queue for one),
then mark a test ``@pytest.mark.cluster("slurm")`` and take ``slurm_cluster`` (the
:class:`~torchhpc.devcluster.ClusterState`) or ``slurm`` (a :class:`SlurmClient` with
submit/wait/sacct helpers). Without a cluster those
tests skip locally and fail when ``CI=true``.

Jobs see this machine's filesystem, so a test can write a script under
``tmp_path`` and run ``tests.conftest.PYTHON`` (the venv's python) in it.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pytest

from tests.cluster_queue import cancel, left_in_queue, names_any, queued
from tests.conftest import missing
from torchhpc.core.proc import Completed, Runner
from torchhpc.devcluster import ClusterState, load_state

NO_CLUSTER = "no dev cluster up: run `torchhpc devcluster up --nodes 4 --cpus-per-node 12 --accounting`"

# Job states after which nothing changes any more (scontrol's spelling).
TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


class SlurmClient:
    """Run Slurm clients against the dev cluster and poll jobs to completion.

    ``sbatch --wait`` polls slowly; ``scontrol show job -o`` answers at once.
    ``sacct`` sees a finished job a few seconds late, so it is polled too.
    """

    def __init__(self, state: ClusterState, runner: Runner | None = None) -> None:
        self.state = state
        self.env = state.client_env()
        self.runner = runner or Runner(env=self.env, timeout=120)

    def run(
        self, argv: Sequence[str], *, timeout: float = 120, check: bool = True, cwd: str | None = None
    ) -> Completed:
        """Run one command with the cluster's client env (SLURM_CONF, PATH wrappers, OMPI_*)."""
        return self.runner.run(list(argv), timeout=timeout, check=check, env=self.env, cwd=cwd)

    def sbatch(self, args: Sequence[str], *, cwd: str | None = None) -> str:
        """Submit with ``sbatch --parsable ARGS``; returns the job id."""
        out = self.run(["sbatch", "--parsable", *args], cwd=cwd).stdout.strip()
        job_id = out.split(";")[0]
        assert job_id.isdigit(), f"sbatch printed {out!r}, not a job id"
        return job_id

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job -o`` as a dict (the last record for array/het jobs)."""
        out = self.run(["scontrol", "show", "job", "-o", job_id], timeout=30).stdout
        lines = [line for line in out.splitlines() if line.strip()]
        return parse_scontrol(lines[-1]) if lines else {}

    def wait(self, job_id: str, timeout: float = 300) -> dict[str, str]:
        """Poll until the job reaches a terminal state; returns its last scontrol record."""
        return self.wait_all([job_id], timeout)[job_id]

    def wait_all(self, job_ids: Sequence[str], timeout: float = 300) -> dict[str, dict[str, str]]:
        """Poll jobs that run side by side until each is terminal; their last scontrol records by id.
        Every 0.2 s at first, then less often, to once a second: each poll is a process start (about
        15 ms of CPU here), and five tests waiting at 5 a second kept a tenth of the two cores busy.

        All at once, not one after another: the controller forgets a job MinJobAge (300 s) after it
        ends, and run X's time-limit test (docs/testing.md), waiting 440 s on its torchrun job first, then asked for
        the srun job that had ended beside it and got "Invalid job id"."""
        deadline, every = time.monotonic() + timeout, 0.2
        last: dict[str, dict[str, str]] = {}
        while True:
            for job_id in job_ids:
                if last.get(job_id, {}).get("JobState") not in TERMINAL_STATES:
                    last[job_id] = self.job(job_id)
            late = [j for j in job_ids if last[j].get("JobState") not in TERMINAL_STATES]
            if not late:
                return last
            if time.monotonic() > deadline:
                for job_id in late:
                    self.run(["scancel", job_id], check=False)
                pytest.fail(f"jobs still not ended after {timeout:.0f} s: {({j: last[j] for j in late})}")
            time.sleep(every)
            every = min(1.0, every * 1.25)

    def sacct_state(self, job_id: str, timeout: float = 60) -> str:
        """The job's State in the accounting database, polled until it is terminal."""
        if not self.state.accounting:
            missing("the dev cluster runs without accounting: `torchhpc devcluster up --accounting`")
        deadline = time.monotonic() + timeout
        state = ""
        while True:
            out = self.run(
                ["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], timeout=30, check=False
            ).stdout
            words = out.split()  # "CANCELLED by 0" -> "CANCELLED"
            state = words[0] if words else ""
            if state in TERMINAL_STATES:
                return state
            if time.monotonic() > deadline:
                pytest.fail(f"sacct shows job {job_id} as {state or 'nothing'} after {timeout:.0f} s")
            time.sleep(0.5)


def parse_scontrol(line: str) -> dict[str, str]:
    """``Key=Value Key2=Value two ...`` from ``scontrol -o``; values may contain spaces."""
    out: dict[str, str] = {}
    matches = list(re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=", line))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        out[m.group(1)] = line[m.end() : end].strip()
    return out


@pytest.fixture(scope="session")
def slurm_cluster() -> ClusterState:
    """The running dev cluster (skip locally / fail in CI when none is up)."""
    state = load_state()
    if state is None:
        missing(NO_CLUSTER)
    assert state is not None
    return state


@pytest.fixture(scope="session")
def slurm(slurm_cluster: ClusterState) -> SlurmClient:
    """Client helpers bound to the dev cluster: run, sbatch, wait, sacct_state."""
    return SlurmClient(slurm_cluster)


OWN_FIRST_JOB_ID = 900001  # a cluster of a module's own numbers its jobs apart from the shared one's


@contextmanager
def cluster_of_its_own(tmp_path_factory: pytest.TempPathFactory, name: str, nodes: int,
                       first_job_id: int = 1, **up: Any) -> Iterator[ClusterState]:
    """A throw-away dev cluster (its own namespaces and daemons, beside the shared one), down again after;
    ``up``: more of devcluster.up's arguments (accounting, min_job_age)."""
    if os.geteuid() != 0 or not sys.platform.startswith("linux"):
        missing("bringing up a dev cluster needs root on Linux")
    from torchhpc import devcluster
    from torchhpc.devcluster.prepare import NEXT_JOB_ID

    sdir = tmp_path_factory.mktemp(name) / "dc"
    sdir.mkdir()
    if first_job_id > 1:
        (sdir / NEXT_JOB_ID).write_text(f"{first_job_id}\n")
    state = devcluster.up(nodes=nodes, state_dir=str(sdir), progress=None, **up)
    try:
        yield state
    finally:
        devcluster.down(str(sdir), progress=None)


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterState]:
    """A 4-node dev cluster of the module's own, for the tests that fail a node: on the shared cluster they
    had to run alone (the ``exclusive`` chain, the side-by-side run's critical path), and every other
    cluster test waited for them. Its job ids start at OWN_FIRST_JOB_ID, so that no ``slurm:N`` of the
    run's job records names two jobs."""
    with cluster_of_its_own(tmp_path_factory, "own", 4, OWN_FIRST_JOB_ID) as state:
        yield state


@pytest.fixture
def own_slurm(own_cluster: ClusterState, request: pytest.FixtureRequest) -> Iterator[SlurmClient]:
    """A client of :func:`own_cluster`, for one test that may fail a node: every node idle before it, and
    up again after it (what the exclusive chain does for the shared cluster, tests/parallel.py)."""
    from tests.parallel import nodes_back

    nodes_back(request.node, idle=True, state=own_cluster)
    yield SlurmClient(own_cluster)
    nodes_back(request.node, state=own_cluster)


@pytest.fixture(scope="session", autouse=True)
def state_in_tmp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Job records and pipeline indexes of the integration tests go to a directory of the run, never
    to the runner's ~/.cache/torchhpc (a test that sets its own TORCHHPC_STATE_DIR keeps it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHHPC_STATE_DIR", str(tmp_path_factory.mktemp("torchhpc-state")))
        yield


@pytest.fixture(scope="module", autouse=True)
def queue_left_empty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The dev cluster's queue holds no job of this module when the module ends: one left there
    (an assertion before its cancel) is cancelled, and the module fails naming it. A module's jobs are
    the new ones whose script or working directory lies in this process's temporary folder (every
    torchhpc job dir and test script does): other workers of the run, and other runs on the same
    cluster, submit meanwhile and are left alone."""
    before = set(queued())
    yield
    mine = (str(tmp_path_factory.getbasetemp()), os.environ.get("TORCHHPC_STATE_DIR", ""))
    left = left_in_queue(lambda job, fields: job not in before and names_any(fields, mine))
    if left:
        cancel(left)
        pytest.fail(f"jobs left in the dev cluster's queue: {', '.join(f'{j} ({s})' for j, s in left.items())} "
                    "(cancelled now; a test must cancel its jobs in a finally or a fixture)", pytrace=False)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test on the shared dev cluster shows its nodes and queue at that moment: a test that waited
    on a node another test held, or on one that stopped serving, says which (tests/cluster_keeper.py)."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed or call.when == "teardown":
        return
    from tests.cluster_keeper import cluster_now
    from tests.parallel import on_cluster
    from torchhpc.devcluster import read_state

    state = read_state() if on_cluster(item) else None
    if state is not None:
        report.sections.append(("the dev cluster when it failed", cluster_now(state)))
