"""The allocation contract (schedulers/allocation.py): what each backend answers about a running job's nodes.

The PBS tests stand in for PBS's ``pbsdsh`` (no PBS server can be installed here) with a script that
really runs its argv once per line of ``$PBS_NODEFILE``, as PBS Pro's does per MPI slot; every node
of the node file is this machine. What runs is real: ``top``'s sampler and the hang probe, started
through the PBS allocation, find a real rank process by its ``PBS_JOBID`` and answer once for it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchhpc.core.proc import Runner
from torchhpc.errors import SchedulerError
from torchhpc.schedulers import get_scheduler

JOB = "42.pbsserver01"
FAKE_PBSDSH = """#!/bin/bash
# Stand-in for PBS Pro's pbsdsh: the argv once per line of the node file (all lines are this machine).
[ "$1" = "--" ] && shift
while read -r _host; do "$@" & done < "$PBS_NODEFILE"
wait
"""


@pytest.fixture
def pbs_job(tmp_path: Path) -> Iterator[dict[str, str]]:
    """A PBS job's environment (two slots of one node) and one rank process of it, asleep."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pbsdsh").write_text(FAKE_PBSDSH)
    (bin_dir / "pbsdsh").chmod(0o755)
    nodefile = tmp_path / "nodefile"
    nodefile.write_text("localhost\nlocalhost\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PBS_JOBID": JOB, "PBS_NODEFILE": str(nodefile)}
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                            env={**env, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1"})
    try:
        yield {**env, "RANK_PID": str(rank.pid)}
    finally:
        rank.kill()
        rank.wait()


def test_top_and_the_hang_probe_reach_a_pbs_job_through_pbsdsh(pbs_job: dict[str, str]) -> None:
    from torchhpc.diagnose.hang import probe_argv, probe_job
    from torchhpc.observe.top import probe_nodes, sample_argv

    alloc = get_scheduler("pbs", Runner(env=pbs_job)).allocation_of(JOB, pbs_job)
    assert alloc.inside() and alloc.nodes() == ["localhost"]
    assert sample_argv(alloc, ["localhost"])[:2] == ["pbsdsh", "--"]
    pid = int(pbs_job["RANK_PID"])
    samples = probe_nodes(alloc, alloc.nodes())  # two copies ran (two slots): one answer per process
    assert [(s.rank, s.pid) for s in samples] == [(0, pid)], samples
    match = alloc.rank_match()
    stacks = probe_job(match, alloc.on_nodes(probe_argv(match), alloc.nodes()), alloc.runner)
    assert [(s.rank, s.pid) for s in stacks] == [(0, pid)], stacks


def test_pbsdsh_is_refused_outside_the_job_with_the_fix(pbs_job: dict[str, str]) -> None:
    outside = {k: v for k, v in pbs_job.items() if not k.startswith("PBS_")}
    alloc = get_scheduler("pbs", Runner(env=outside)).allocation_of(JOB, outside)
    with pytest.raises(SchedulerError, match="only from inside it") as e:
        alloc.on_nodes(["true"], ["n1"])
    assert "qsub -I" in (e.value.hint or "")


def test_local_runs_the_command_itself_and_marks_its_ranks() -> None:
    alloc = get_scheduler("local").allocation_of("7", {})
    assert alloc.here and alloc.nodes() == ["localhost"]
    assert alloc.on_nodes(["python", "-V"], ["localhost"]) == ["python", "-V"]
    assert alloc.rank_match() == {"TORCHELASTIC_RUN_ID": "local-7"}
    # inside a local job, "the job this process runs in" is its run id's; torchrun's own run ids are not local jobs
    inside = get_scheduler("local").allocation_of("", {"TORCHELASTIC_RUN_ID": "local-ab12"})
    assert inside.job_id == "ab12" and inside.rank_match() == {"TORCHELASTIC_RUN_ID": "local-ab12"}
    assert get_scheduler("local").allocation_of("", {"TORCHELASTIC_RUN_ID": "13"}).job_id == ""


def test_slurm_writes_the_overlap_step_once_and_requeues_without_nodes() -> None:
    calls: list[list[str]] = []

    class Fake(Runner):
        def run(self, argv, check=True, timeout=None, **kw):  # type: ignore[no-untyped-def,override]
            calls.append(list(argv))
            return subprocess.CompletedProcess(argv, 0, "", "")

    alloc = get_scheduler("slurm", Fake()).allocation_of("", {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[1-3]"})
    assert alloc.job_id == "9" and alloc.nodes() == ["n1", "n2", "n3"]
    assert alloc.on_nodes(["hostname"], ["n1", "n3"]) == [
        "srun", "--overlap", "--jobid=9", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--kill-on-bad-exit=0",
        "--quiet", "--nodelist=n1,n3", "hostname"]
    assert alloc.requeue(["n2"]) == ""
    assert calls == [["scontrol", "requeue", "9"], ["scontrol", "update", "JobId=9", "ExcNodeList=n2"]]


def test_slurm_kill_step_does_not_wait_for_scancel() -> None:
    """``scancel`` of a step on a dead node waits for that node (about 12 s seen): the supervisor must
    not. Here scancel blocks until the test lets it go, and kill_step has returned before that."""
    started, release = threading.Event(), threading.Event()

    class Slow(Runner):
        def run(self, argv, check=True, timeout=None, **kw):  # type: ignore[no-untyped-def,override]
            if argv[0] == "squeue":
                return subprocess.CompletedProcess(argv, 0, "9.batch\n9.0\n9.1\n", "")
            started.set()
            release.wait(60)
            return subprocess.CompletedProcess(argv, 0, "", "")

    alloc = get_scheduler("slurm", Slow()).allocation_of("9", {})
    step = alloc.start_step(["sleep", "60"], dict(os.environ))
    try:
        rc = alloc.kill_step(step, grace=0.0)
        assert rc == -signal.SIGKILL and not release.is_set()
        assert started.wait(30)  # the cancel was asked for, in the background
    finally:
        release.set()


def test_a_scheduler_that_cannot_requeue_raises_and_cancels_nothing() -> None:
    """The base requeue() raises like on_nodes(): it does not cancel the job behind the caller's back."""
    calls: list[list[str]] = []

    class Recording(Runner):
        def run(self, argv, **kw):  # type: ignore[no-untyped-def,override]
            calls.append(list(argv))
            raise AssertionError(f"no command expected: {argv}")

    with pytest.raises(SchedulerError, match="cannot requeue"):
        get_scheduler("pbs", Recording()).allocation_of(JOB, {}).requeue(["n2"])
    assert calls == []


def test_installed_clients_are_the_schedulers_question(tmp_path: Path) -> None:
    """doctor asks the scheduler, not an allocation of no job, which client commands are here."""
    (tmp_path / "squeue").write_text("#!/bin/sh\n")
    (tmp_path / "squeue").chmod(0o755)
    slurm = get_scheduler("slurm", Runner(env={"PATH": str(tmp_path)}))
    assert "squeue" not in slurm.missing_clients() and "sbatch" in slurm.missing_clients()
    assert get_scheduler("local").missing_clients() == [] and get_scheduler("local").controller() == (True, "")
