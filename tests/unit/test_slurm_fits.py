"""Refused at submit, what could never run (schedulers/slurm/fits.py), from sinfo/sacctmgr/squeue as recorded.

The answers below were recorded on the dev cluster (``devcluster up --nodes 4 --cpus-per-node 12
--accounting``, Slurm 22.05.8): four 12-CPU nodes of 23593 MB in the one partition ``debug``, and root's
associations. Each job here was accepted by sbatch before (issue 70) and then waited forever.
"""

from __future__ import annotations

import pytest

from tests.fakes import FakeRunner
from torchhpc.core.depend import parse_dependencies
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.errors import SpecError
from torchhpc.schedulers.slurm.fits import check_account, check_dependencies, check_fits

SINFO = "node1|debug*|12|23593\nnode2|debug*|12|23593\nnode3|debug*|12|23593\nnode4|debug*|12|23593\n"
SACCTMGR = "root|\nroot|root\n"
INVALID = (1, "", "slurm_load_jobs error: Invalid job id specified\n")


def spec(**kw: object) -> JobSpec:
    return JobSpec(entrypoint=Entrypoint.parse(["train.py"]), scheduler="slurm", **kw)  # type: ignore[arg-type]


REFUSED = {
    "nodes": (dict(nodes=8), "--nodes 8: partition debug has 4 nodes", "node1, node2, node3, node4"),
    "spares": (dict(nodes=4, spares=1, max_restarts=1), "--nodes 4 + --spares 1", "ask for at most 4"),
    "memory": (dict(mem="100G"), "--mem 100G: partition debug's nodes have at most 23593M", "--mem 23593M"),
    "cpus": (dict(nproc_per_node=16, launcher="srun"), "16 tasks x 1 CPUs per node", "at most 12 CPUs"),
    "exclude": (dict(nodes=2, options=(("exclude", "node[1-3]"),)), "has 1 node once --exclude node[1-3]",
                "nodes there: node4"),
    "partition": (dict(options=(("partition", "gpu"),)), "partition gpu: this cluster has no partition gpu",
                  "partitions here: debug"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_could_never_run_is_refused_with_what_is_there(case: str) -> None:
    kw, error, hint = REFUSED[case]
    with pytest.raises(SpecError) as e:
        check_fits(spec(**kw), FakeRunner(responses={"sinfo": SINFO}))
    assert error in e.value.message and hint in (e.value.hint or ""), (e.value.message, e.value.hint)
    assert e.value.exit_code == 2


def test_what_fits_passes_and_a_cluster_that_cannot_be_asked_is_left_to_sbatch() -> None:
    check_fits(spec(nodes=4, mem="20G", nproc_per_node=12, launcher="srun"), FakeRunner(responses={"sinfo": SINFO}))
    check_fits(spec(nodes=8), FakeRunner(responses={"sinfo": (1, "", "sinfo: error: no config\n")}))


def test_an_unknown_account_and_dependency_are_refused() -> None:
    with pytest.raises(SpecError, match="account nosuch") as e:
        check_account(spec(options=(("account", "nosuch"),)), FakeRunner(responses={"sacctmgr": SACCTMGR}))
    assert "accounts here: root" in (e.value.hint or "")
    check_account(spec(options=(("account", "root"),)), FakeRunner(responses={"sacctmgr": SACCTMGR}))
    typo = spec(after=parse_dependencies("ok", "99999", "slurm"))
    with pytest.raises(SpecError, match="Slurm knows no job 99999"):
        check_dependencies(typo, FakeRunner(responses={"squeue": INVALID, "sacct": ""}))
    # a job that ended long ago: only accounting knows it
    check_dependencies(spec(after=parse_dependencies("ok", "6", "slurm")), FakeRunner(responses={"squeue": INVALID, "sacct": "6\n"}))


def test_a_command_on_no_path_is_refused() -> None:
    from torchhpc.schedulers.slurm.fits import check_command

    with pytest.raises(SpecError, match="the command 'nosuchcmd' is not on PATH here"):
        check_command(JobSpec(entrypoint=Entrypoint.parse(["nosuchcmd"]), scheduler="slurm"))
    check_command(JobSpec(entrypoint=Entrypoint.parse(["bash", "-c", "true"]), scheduler="slurm"))
    check_command(JobSpec(entrypoint=Entrypoint.parse(["nosuchcmd"]), scheduler="slurm", setup=("module load x",)))


def test_a_command_the_nodes_lack_is_an_environment_failure() -> None:
    """Issue 70, item 10: classed "unknown" though the rank's one line says why. The first line as recorded on the
    dev cluster (srun, ``-- /nonexistent/cmd``), the second bash's words for a bare command on no PATH."""
    from torchhpc.diagnose.evidence import Evidence
    from torchhpc.diagnose.verdict import diagnose
    from torchhpc.jobdir.logs import Line

    for line in ("/work/main/src/torchhpc/boot/task.sh: line 100: /nonexistent/cmd: No such file or directory",
                 "/work/main/src/torchhpc/boot/task.sh: line 100: exec: nosuchcmd: not found"):
        v = diagnose(Evidence(lines=[Line(0, line)], state="FAILED", exit_code=127, launcher="srun", job="slurm:48",
                              rank_logs={0: "ranks/rank-0@node1.log"}))
        assert v.klass == "environment", v.render()
    user = "FileNotFoundError: [Errno 2] No such file or directory: 'data.csv'"  # the program's own: not this
    assert diagnose(Evidence(lines=[Line(0, user)], state="FAILED", exit_code=1)).klass != "environment"
