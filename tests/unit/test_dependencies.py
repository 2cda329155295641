"""Job dependencies as data and as each scheduler writes them (core/depend.py, schedulers/dependencies.py).

PBS cannot run here: its line is checked against the documented syntax of ``qsub -W depend=``
(PBS Professional Reference Guide, qsub: ``depend=<type>:<arg list>[,<type>:<arg list>...]``,
``<arg list>`` = ``jobid[:jobid...]``, types ``afterok``, ``afternotok``, ``afterany``).
The batched Slurm query is checked against ``squeue``/``sacct`` output recorded on the dev cluster.
"""

from __future__ import annotations

import re

import pytest

from tests.fakes import FakeRunner
from torchhpc.cli.main import main
from torchhpc.core.depend import Dependency, dependency_value, parse_dependencies, verdict
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.errors import SpecError
from torchhpc.job import Job, JobHandle
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.dependencies import DependencyState
from torchhpc.schedulers.pbs.pbs import PBSScheduler
from torchhpc.schedulers.slurm.slurm import SlurmScheduler

pytestmark = pytest.mark.usefixtures("clean_user_env")


def spec(scheduler: str = "slurm", **kw: object) -> JobSpec:
    return JobSpec(entrypoint=Entrypoint.parse(["examples/pi.py"]), scheduler=scheduler, **kw)  # type: ignore[arg-type]


def test_parse_ids_handles_and_lists() -> None:
    deps = parse_dependencies("ok", ["12,slurm:13", 14], "slurm")
    assert [(d.kind, d.job_id) for d in deps] == [("ok", "12"), ("ok", "13"), ("ok", "14")]
    assert parse_dependencies("any", None, "slurm") == ()


def test_a_handle_of_another_scheduler_is_one_line() -> None:
    with pytest.raises(SpecError) as e:
        parse_dependencies("ok", "slurm:123", "local")
    assert "\n" not in e.value.message and "slurm job cannot be a dependency of a local job" in e.value.message
    with pytest.raises(SpecError, match="local job cannot be a dependency of a slurm job"):
        spec(after=(Dependency("ok", "ab12", "local"),))


def test_bad_ids_are_refused() -> None:
    for bad in ("a b", "$(touch x)", "1;2", "-1", "<prep>"):
        with pytest.raises(SpecError, match="is not a job id"):
            parse_dependencies("ok", bad, "slurm")


@pytest.mark.parametrize("flag, given, hint", [
    ("--after-ok", "afterok:1", "give the job id itself: --after-ok 1"),
    ("--after-ok", "afterany:7:8", "give the job id itself: --after-any 7,8"),
    ("--after-any", "afternotok:3", "give the job id itself: --after-fail 3"),
    ("--after-fail", "afterany:", "give the job id itself: --after-any JOB_ID"),
    ("--after-ok", "singleton", "torchhpc has no 'singleton' dependency: give the id of the job to wait for, "
                                "e.g. --after-ok 123"),
])
def test_slurms_own_syntax_is_told_to_give_the_id(capsys: pytest.CaptureFixture[str], flag: str, given: str,
                                                   hint: str) -> None:
    """Not read as a scheduler named ``afterok``: one line that says what to type instead."""
    assert main(["run", "--scheduler", "slurm", "--dry-run", flag, given, "examples/pi.py"]) == 2
    err = capsys.readouterr().err
    assert err == f"Error: {flag} {given}: that is Slurm's --dependency syntax, not a job id\nHINT: {hint}\n", err


def test_a_handle_of_no_scheduler_is_named_so(capsys: pytest.CaptureFixture[str]) -> None:
    """Not "give foo:ID jobs to a --scheduler foo job": there is no scheduler foo to give them to."""
    assert main(["run", "--scheduler", "slurm", "--dry-run", "--after-any", "foo:1", "examples/pi.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: --after-any foo:1: 'foo' is not a scheduler (known: local, slurm,"), err
    assert "HINT: give the job id alone (--after-any 1) or as SCHEDULER:ID" in err and "--scheduler foo" not in err


def test_value_groups_kinds_and_drops_repeats() -> None:
    deps = (*parse_dependencies("ok", "1,2,1", "slurm"), *parse_dependencies("any", "3", "slurm"),
            *parse_dependencies("fail", "4", "slurm"))
    assert dependency_value(deps) == "afterok:1:2,afterany:3,afternotok:4"


@pytest.mark.parametrize(("kind", "state", "code", "expected"), [
    ("ok", "COMPLETED", 0, "satisfied"), ("ok", "FAILED", 1, "never"), ("ok", "CANCELLED", None, "never"),
    ("ok", "RUNNING", None, "waiting"), ("any", "FAILED", 1, "satisfied"), ("any", "PENDING", None, "waiting"),
    ("fail", "FAILED", 3, "satisfied"), ("fail", "COMPLETED", 0, "never"), ("fail", "TIMEOUT", None, "satisfied"),
])
def test_verdict(kind: str, state: str, code: int | None, expected: str) -> None:
    ended = state not in ("RUNNING", "PENDING")
    assert verdict(Dependency(kind, "1"), state, code, ended=ended) == expected  # type: ignore[arg-type]


def test_slurm_renders_the_dependency_and_ends_a_job_that_can_never_start() -> None:
    s = spec(after=(*parse_dependencies("ok", "12", "slurm"), *parse_dependencies("any", "13", "slurm")))
    script = SlurmScheduler(runner=FakeRunner()).render(s).script or ""
    assert "#SBATCH --dependency=afterok:12,afterany:13\n" in script
    assert "#SBATCH --kill-on-invalid-dep=yes\n" in script
    assert "--dependency" not in (SlurmScheduler(runner=FakeRunner()).render(spec()).script or "")


def test_pbs_renders_the_documented_depend_syntax() -> None:
    deps = (*parse_dependencies("ok", "12.pbs01,13.pbs01", "pbs"), *parse_dependencies("fail", "14[].pbs01", "pbs"))
    script = PBSScheduler(runner=FakeRunner()).render(spec("pbs", after=deps)).script or ""
    lines = [line for line in script.splitlines() if line.startswith("#PBS -W")]
    assert lines == ["#PBS -W depend=afterok:12.pbs01:13.pbs01,afternotok:14[].pbs01"]
    jobid = r"\d+(\[\d*\])?(\.[A-Za-z0-9.-]+)?"
    documented = rf"depend=(afterok|afternotok|afterany):{jobid}(:{jobid})*(,(afterok|afternotok|afterany):{jobid}(:{jobid})*)*"
    assert re.fullmatch(documented, lines[0].split(" ", 2)[2])


@pytest.mark.parametrize("name", ["kubernetes", "runai"])
def test_pod_schedulers_refuse_dependencies(name: str) -> None:
    s = JobSpec(entrypoint=Entrypoint.parse(["train.py"]), scheduler=name, options=(("image", "img:1"),),
                after=parse_dependencies("ok", "job-1", name))
    with pytest.raises(SpecError, match=f"the {name} scheduler cannot hold a job until another ends"):
        get_scheduler(name, runner=FakeRunner()).render(s)


def test_job_api_takes_handles() -> None:
    first = JobHandle(SlurmScheduler(runner=FakeRunner()), "41")
    job = Job(["examples/pi.py"], scheduler="slurm", after=[first], after_any="slurm:42", after_fail=["43"],
              runner=FakeRunner())
    assert [(d.kind, d.job_id) for d in job.spec.after] == [("ok", "41"), ("any", "42"), ("fail", "43")]
    assert "#SBATCH --dependency=afterok:41,afterany:42,afternotok:43" in (job.render().script or "")
    with pytest.raises(SpecError, match="slurm job cannot be a dependency of a local job"):
        Job(["examples/pi.py"], after=[first])


# squeue -O rows as schedulers/slurm/many.py asks for them (the format of tests/data/slurm/squeue_many.txt,
# recorded on the dev cluster): exit_code is the wait status (256 = exit 1). Job 4 left the controller.
SQUEUE = ("1|FAILED|256|0:03|node1|NonZeroExitCode|a|\n2|CANCELLED|0|0:00||DependencyNeverSatisfied|b|\n"
          "3|PENDING|0|0:00||Dependency|c|\n")
SACCT = "4|COMPLETED|0:0|00:00:05|node2|d\n"


def test_statuses_of_many_slurm_jobs_take_one_squeue_and_one_sacct() -> None:
    runner = FakeRunner(responses={"squeue": SQUEUE, "sacct": SACCT, "scontrol": ""})
    got = SlurmScheduler(runner=runner).query_many(["1", "2", "3", "4"])
    assert [c[0][0] for c in runner.calls] == ["squeue", "sacct"]
    assert runner.calls[0][0][runner.calls[0][0].index("-j") + 1] == "1,2,3,4"
    assert runner.calls[1][0][runner.calls[1][0].index("-j") + 1] == "4"  # only what squeue no longer shows
    assert (got["1"].state, got["1"].exit_code) == ("FAILED", 1)
    assert (got["2"].state, got["2"].reason) == ("CANCELLED", "DependencyNeverSatisfied")
    assert (got["3"].state, got["3"].reason) == ("PENDING", "Dependency")
    assert (got["4"].state, got["4"].exit_code) == ("COMPLETED", 0)


def test_a_dependency_line_says_never() -> None:
    line = DependencyState(Dependency("ok", "7"), "slurm:7", "FAILED", "never", 3).line()
    assert line == "after-ok slurm:7: FAILED (exit 3): never satisfied"


def test_sweep_takes_the_flags(capsys: pytest.CaptureFixture[str], tmp_path: object) -> None:

    argv = ["sweep", "--scheduler", "slurm", "--grid", "a=1,2", "--output-dir", str(tmp_path), "--after-ok", "5",
            "--after-fail", "slurm:6", "--dry-run", "examples/pi.py"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --array=0-1\n" in out and "#SBATCH --dependency=afterok:5,afternotok:6\n" in out
