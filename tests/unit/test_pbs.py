"""PBS backend: golden scripts, qstat parsers, and the qsub/qstat/qdel calls.

What is real here: the rendered scripts are checked by bash (``bash -n``) and
shellcheck, and their rendezvous preamble is *run* by bash with a made-up
``$PBS_NODEFILE``. What is fake: the PBS server. No PBS can be installed on
the development machine, so ``qsub``/``qstat``/``qdel`` answer through a
FakeRunner with outputs recorded in PBS Pro's documented formats
(tests/data/pbs/README.md). tests/integration/test_pbs_body.py runs a rendered
body for real under mpirun on the Slurm dev cluster.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, missing
from tests.fakes import FakeRunner
from tests.script_text import helpers, lines
from torchhpc.core.spec import ContainerSpec, Entrypoint, JobSpec
from torchhpc.errors import CommandError, QuotingError, SchedulerError, SpecError
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.batch.script import job_boot
from torchhpc.schedulers.pbs.parse import parse_qstat_full, parse_qstat_json, status_from_attrs
from torchhpc.schedulers.pbs.pbs import PBSScheduler, job_name, pbs_size, pbs_walltime

DATA = REPO / "tests" / "data" / "pbs"
GOLDEN = REPO / "tests" / "golden"
UPDATE = "1" in (os.environ.get("TORCHHPC_UPDATE_GOLDEN", ""), os.environ.get("TORCHHPC_REGEN_GOLDEN", ""))


def check_golden(path: Path, text: str) -> None:
    """Compare with a golden file; on mismatch show old -> new per line and how to regenerate."""
    if UPDATE or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if not UPDATE:
            pytest.fail(f"golden file {path} did not exist; written now, review and commit it")
        return
    old = path.read_text()
    if old != text:
        diff = "".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True), "golden", "rendered"))
        pytest.fail(
            f"{path.relative_to(REPO)} differs from the rendered text:\n{diff}\n"
            "If the change is intended: TORCHHPC_UPDATE_GOLDEN=1 .venv/bin/pytest " + os.environ.get(
                "PYTEST_CURRENT_TEST", ""
            ).split(" ")[0]
        )


def spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(
        entrypoint=Entrypoint.parse(["examples/pi.py", "--n", "1000000"], python="python3"),
        nodes=2,
        nproc_per_node=4,
        gpus_per_node=4,
        mem="32G",
        time="01:00:00",
        name="pi",
        output_dir="/scratch/alice/out",
        launcher="mpirun",
        scheduler="pbs",
        options=(("account", "st-alice-1-gpu"), ("queue", "gpu"), ("mail", "alice@example.ca")),
        env=(("NCCL_DEBUG", "INFO"),),
    )
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


CASES: dict[str, JobSpec] = {
    "sockeye_mpirun": spec(),
    "pro_torchrun_pbsdsh": spec(launcher="torchrun", options=(("account", "st-alice-1-gpu"),)),
    "pro_torchrun_mpirun": spec(launcher="torchrun", options=(("per_node", "mpirun"),)),
    "torque_mpirun": spec(
        gpus_per_node=0, cpus_per_task=2, options=(("select_style", "torque"), ("queue", "batch")), env=()
    ),
    "sockeye_apptainer": spec(
        container=ContainerSpec(image="/arc/project/st-alice-1/pytorch.sif", runtime="apptainer"),
        entrypoint=Entrypoint.parse(["examples/pi.py"]),
    ),
    "sockeye_modules": spec(setup=("module load gcc/9.4.0", "module load cuda/11.3.1"), options=()),
    "cpu_only_defaults": spec(gpus_per_node=0, mem=None, time=None, options=(), env=()),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_script(case: str) -> None:
    sub = PBSScheduler(runner=FakeRunner()).render(CASES[case])
    assert sub.argv == ("qsub", f"/scratch/alice/out/{CASES[case].name}.pbs")
    check_golden(GOLDEN / "pbs" / f"{case}.pbs", sub.script or "")


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_scripts_parse_and_lint(case: str) -> None:
    path = GOLDEN / "pbs" / f"{case}.pbs"
    if not path.exists():
        missing("golden file not written yet (TORCHHPC_REGEN_GOLDEN=1 writes it)")
    subprocess.run(["bash", "-n", str(path)], check=True)
    if shutil.which("shellcheck") is None:
        missing("shellcheck is not installed (.ci/run installs it)")
    r = subprocess.run(["shellcheck", "-s", "bash", "-S", "warning", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_directives_pbs_pro() -> None:
    lines = PBSScheduler(runner=FakeRunner()).directives(spec())
    assert "#PBS -l select=2:ncpus=4:mpiprocs=4:ngpus=4:mem=32gb" in lines
    assert "#PBS -l place=scatter" in lines
    assert "#PBS -l walltime=01:00:00" in lines
    assert "#PBS -A st-alice-1-gpu" in lines and "#PBS -q gpu" in lines
    assert "#PBS -M alice@example.ca" in lines and "#PBS -m abe" in lines
    assert "#PBS -j oe" in lines and "#PBS -o /scratch/alice/out/" in lines


def test_torchrun_is_one_mpi_slot_per_node() -> None:
    lines = PBSScheduler(runner=FakeRunner()).directives(spec(launcher="torchrun"))
    assert "#PBS -l select=2:ncpus=4:mpiprocs=1:ngpus=4:mem=32gb" in lines


def test_torque_nodes_ppn_and_total_memory() -> None:
    lines = PBSScheduler(runner=FakeRunner()).directives(spec(cpus_per_task=2, options=(("select_style", "torque"),)))
    assert "#PBS -l nodes=2:ppn=8:gpus=4" in lines
    assert "#PBS -l mem=64gb" in lines
    assert not any("select=" in line for line in lines)


def launch_line(script: str) -> str:
    return next(line for line in lines(script) if line.startswith(("mpirun ", "pbsdsh ")))


def test_mpirun_line_has_the_seed_flags() -> None:
    launch = launch_line(PBSScheduler(runner=FakeRunner()).render(spec()).script or "")
    for piece in (
        "mpirun -np 8",
        '--hostfile "$PBS_NODEFILE"',
        "--oversubscribe",
        "-x MASTER_ADDR -x MASTER_PORT -x PATH -x TORCHHPC_BOOT_DIR -x NCCL_DEBUG",
        "--bind-to none",
        "-mca pml ob1 -mca btl '^openib'",
        'bash "$TORCHHPC_BOOT_DIR/task.sh" mpirun python3 examples/pi.py --n 1000000',
    ):
        assert piece in launch, piece


def test_walltime_and_sizes() -> None:
    assert pbs_walltime(36 * 3600 + 61) == "36:01:01"
    assert pbs_size("32G") == "32gb" and pbs_size("1536M") == "1536mb" and pbs_size("1000") == "1000b"
    assert "#PBS -l walltime=48:00:00" in PBSScheduler(runner=FakeRunner()).directives(spec(time="2-00:00:00"))


def test_job_name_is_made_acceptable() -> None:
    assert job_name("my job; rm") == "my_job__rm"
    assert job_name("1st") == "j1st"


def test_hostile_values_rejected_or_carried(hostile: str, tmp_path: Path) -> None:
    """A hostile account is refused with a clear error; a hostile env value reaches the job unchanged."""
    sched = PBSScheduler(runner=FakeRunner())
    try:
        lines = sched.directives(spec(options=(("account", hostile),)))
    except QuotingError as e:
        assert "account" in e.message
    else:
        # accepted only when it is one plain word (or empty, which means "no -A")
        assert (hostile == "" and not any(x.startswith("#PBS -A") for x in lines)) or (
            f"#PBS -A {hostile}" in lines and not set(hostile) & set(" '\"#\\\n")
        )
    s = spec(env=(("TORCHHPC_T", hostile),), name=hostile if hostile and "\n" not in hostile else "x")
    script = sched.render(s).script or ""
    for line in script.splitlines():
        if line.startswith("#PBS -N"):
            assert "\n" not in line and " " not in line.split(" ", 2)[2]
    exports = [line for line in script.splitlines() if line.startswith("  export TORCHHPC_T=")]
    # export lines may span lines (a newline in the value): cut the env block out by its markers
    start = script.index(exports[0])
    end = script.index("\n  # Rendezvous")
    block = script[start:end]
    r = subprocess.run(
        ["bash", "-c", block + '\nprintf %s "$TORCHHPC_T"'], capture_output=True, text=True, cwd=tmp_path
    )
    assert r.stdout == hostile
    assert not list(tmp_path.iterdir()), "something was executed"


def test_preamble_runs_in_bash(tmp_path: Path) -> None:
    """The rendezvous block, run by bash with a made-up nodefile: first host, deduplicated, port from job id."""
    script = PBSScheduler(runner=FakeRunner()).render(spec()).script or ""
    pre = helpers(script) + script[script.index("mapfile") : script.index('  echo "torchhpc: job $PBS_JOBID')]
    nodefile = tmp_path / "nodes"
    nodefile.write_text("se007\nse007\nse003\nse007\nse003\n")
    env = {"PATH": os.environ["PATH"], "PBS_NODEFILE": str(nodefile), "PBS_JOBID": "4711.pbsserver01"}
    r = subprocess.run(
        ["bash", "-c", "set -euo pipefail\n" + pre + 'echo "R $MASTER_ADDR $MASTER_PORT $NNODES"'],
        capture_output=True, text=True, env=env,
    )
    last = r.stdout.strip().splitlines()[-1]
    assert last == f"R se007 {10000 + 4711 % 20000} 2", (r.stdout, r.stderr)
    assert "expected 2 hosts" not in r.stderr
    env["PBS_JOBID"] = "0099[3].server"  # array subjob: digits before the bracket, leading zero is decimal
    r = subprocess.run(["bash", "-c", pre + 'echo "$MASTER_PORT"'], capture_output=True, text=True, env=env)
    assert r.stdout.strip().splitlines()[-1] == str(10000 + 99)


def test_container_wraps_each_rank() -> None:
    launch = launch_line(PBSScheduler(runner=FakeRunner()).render(CASES["sockeye_apptainer"]).script or "")
    assert launch.index("mpirun") < launch.index("apptainer") < launch.index("task.sh")
    assert "/arc/project/st-alice-1/pytorch.sif" in launch and "--nv" in launch
    assert launch.endswith('task.sh" mpirun python examples/pi.py &')
    pyxis = ContainerSpec(image="nvcr.io#nvidia/pytorch:24.01-py3", runtime="pyxis")
    with pytest.raises(SpecError, match="pyxis needs srun"):
        PBSScheduler(runner=FakeRunner()).render(spec(container=pyxis))


def test_unknown_option_and_srun_rejected() -> None:
    with pytest.raises(SpecError, match="unknown pbs option"):
        PBSScheduler(runner=FakeRunner()).render(spec(options=(("partition", "gpu"),)))
    with pytest.raises(SpecError, match="srun needs Slurm"):
        PBSScheduler(runner=FakeRunner()).render(spec(launcher="srun"))
    with pytest.raises(QuotingError, match="output-dir"):
        PBSScheduler(runner=FakeRunner()).render(spec(output_dir="/scratch/my out"))


def test_options_are_listed() -> None:
    assert {"queue", "account", "select_style", "mail"} <= set(PBSScheduler.OPTIONS)
    assert isinstance(get_scheduler("pbs", runner=FakeRunner()), PBSScheduler)


# --- parsers on recorded outputs ---------------------------------------------------


def test_parse_json_running() -> None:
    jobs = parse_qstat_json((DATA / "qstat_json_running.json").read_text())
    attrs = jobs["4711.pbsserver01"]
    assert attrs["Resource_List.select"] == "2:ncpus=4:mpiprocs=4:ngpus=4:mem=32gb"
    assert attrs["Variable_List.PBS_O_WORKDIR"] == "/scratch/alice/pi"
    st = status_from_attrs("4711.pbsserver01", attrs)
    assert (st.state, st.exit_code, st.nodes, st.elapsed, st.name) == ("RUNNING", None, "se001,se002", "00:01:02", "pi")


def test_parse_json_history_exit_states() -> None:
    jobs = parse_qstat_json((DATA / "qstat_json_history.json").read_text())
    got = {jid.split(".")[0]: status_from_attrs(jid, a) for jid, a in jobs.items()}
    assert (got["4711"].state, got["4711"].exit_code, got["4711"].ok) == ("COMPLETED", 0, True)
    assert (got["4712"].state, got["4712"].exit_code, got["4712"].restarts) == ("CANCELLED", 143, 1)
    assert got["4713"].state == "TIMEOUT" and got["4713"].terminal


def test_parse_json_with_raw_control_characters() -> None:
    """Old PBS Pro wrote raw tabs/newlines inside Variable_List strings; we still read the state."""
    text = '{"Jobs":{"5.s":{"job_state":"R","Variable_List":{"X":"a\tb\nc"}}}}'
    assert parse_qstat_json(text)["5.s"]["Variable_List.X"] == "a\tb\nc"
    with pytest.raises(SchedulerError, match="not JSON"):
        parse_qstat_json("qstat: illegal -F value")


def test_parse_plain_pro_wrapped_values() -> None:
    jobs = parse_qstat_full((DATA / "qstat_full_pro.txt").read_text())
    assert list(jobs) == ["4720.pbsserver01", "4721.pbsserver01"]
    a = jobs["4720.pbsserver01"]
    assert a["Variable_List"].endswith("PBS_O_QUEUE=gpu,PBS_O_HOST=login01.sockeye")
    assert "PBS_O_LOGNAME=alice,PBS_O_PATH=/usr/local/bin:/usr/bin:/bin," in a["Variable_List"]
    assert a["comment"].endswith("(R: 8 A: 4 T: 64)")
    st = status_from_attrs("4720.pbsserver01", a)
    assert st.state == "PENDING" and "Insufficient amount of resource: ngpus" in st.reason
    held = status_from_attrs("4721.pbsserver01", jobs["4721.pbsserver01"])
    assert held.state == "PENDING" and held.reason.startswith("held (u)")


def test_parse_plain_torque_completed() -> None:
    jobs = parse_qstat_full((DATA / "qstat_full_torque.txt").read_text())
    st = status_from_attrs("912.torque-head.cluster", jobs["912.torque-head.cluster"])
    assert (st.state, st.exit_code, st.nodes, st.elapsed) == ("COMPLETED", 0, "n01,n02", "00:01:09")


# --- qsub / qstat / qdel through the runner (the PBS server is fake) -----------------


def test_submit_writes_script_and_records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path / "state"))
    runner = FakeRunner(responses={"qsub": "4711.pbsserver01\n"})
    sched = PBSScheduler(runner=runner)
    job = sched.submit(spec(output_dir=str(tmp_path / "out")))
    assert job == "4711.pbsserver01"
    # submitted from a private file (never the display name out/pi.pbs, which may be the user's), kept in the job's directory
    submitted = Path(runner.calls[0][0][1])
    assert runner.calls[0][0][0] == "qsub" and submitted.parent == tmp_path / "out" and submitted.name.startswith(".pi.")
    assert not submitted.exists() and not (tmp_path / "out" / "pi.pbs").exists()
    script = tmp_path / "out" / "pi-4711" / "job.pbs"
    assert script.read_text().startswith("#!/bin/bash\n# Generated by torchhpc")
    (tmp_path / "out" / "pi.o4711").write_text("[1,0]<stdout>:pi=3.14\n[1,1]<stdout>:hello\n")
    assert sched.logs(job) .count("\n") == 2
    assert sched.logs(job, rank=1) == "hello\n"  # the rank's line as it wrote it (mpirun's tag parsed off)
    # with per-rank files (made by the job in <output-dir>/<name>-<job number>/ranks/) the ranks' lines are there
    (tmp_path / "out" / "pi.o4711").write_text("torchhpc: rank output in ...\n")
    ranks = tmp_path / "out" / "pi-4711" / "ranks"
    ranks.mkdir(parents=True)
    (ranks / "rank-1@node2.log").write_text("hello, whole\n")
    (ranks / "rank-0@node1.log").write_text("pi=3.14\n")
    assert sched.logs(job, rank=1) == "hello, whole\n"


def test_submit_rejects_garbage() -> None:
    sched = PBSScheduler(runner=FakeRunner(responses={"qsub": "qsub: Unknown queue\n"}))
    with pytest.raises(SchedulerError, match="not a job id"):
        sched.schedule(sched.render(spec(output_dir="/tmp/torchhpc-test-pbs")))


def test_status_json_then_plain_fallback() -> None:
    json_out = (DATA / "qstat_json_running.json").read_text()
    runner = FakeRunner(responses={"qstat": json_out})
    st = PBSScheduler(runner=runner).status("4711")
    assert st.state == "RUNNING" and st.job_id == "4711.pbsserver01"
    assert runner.calls[0][0] == ["qstat", "-x", "-f", "-F", "json", "4711"]

    plain = (DATA / "qstat_full_torque.txt").read_text()

    def torque(argv: list[str], _input: str | None) -> tuple[int, str, str]:
        if "-F" in argv:
            return 2, "", "qstat: invalid option -- 'x'\nusage: qstat ..."
        return 0, plain, ""

    runner = FakeRunner(responses={"qstat": torque})
    st = PBSScheduler(runner=runner).status("912")
    assert st.state == "COMPLETED" and [c[0] for c in runner.calls][-1] == ["qstat", "-f", "912"]


def test_status_unknown_job_and_cancel() -> None:
    runner = FakeRunner(responses={"qstat": (153, "", "qstat: Unknown Job Id 99.pbsserver01\n"), "qdel": ""})
    sched = PBSScheduler(runner=runner)
    with pytest.raises(SchedulerError, match="unknown to qstat"):
        sched.status("99")
    sched.cancel("99.pbsserver01")
    assert runner.calls[-1][0] == ["qdel", "99.pbsserver01"]
    with pytest.raises(CommandError):
        PBSScheduler(runner=FakeRunner(responses={"qdel": (35, "", "qdel: Unauthorized Request")})).cancel("1")


def test_history_json_is_valid_json_file() -> None:
    json.loads((DATA / "qstat_json_history.json").read_text())


def test_cli_dry_run_prints_pbs_script(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Acceptance: `torchhpc run --scheduler pbs --nodes 2 --nproc-per-node 4 --dry-run examples/pi.py`."""
    from torchhpc.cli.main import main

    rc = main([
        "run", "--scheduler", "pbs", "--launcher", "mpirun", "--nodes", "2", "--nproc-per-node", "4",
        "--account", "st-alice-1-gpu", "--output-dir", str(tmp_path), "--dry-run", "examples/pi.py",
    ])
    out = capsys.readouterr().out
    assert rc == 0
    assert "#PBS -l select=2:ncpus=4:mpiprocs=4" in out and "#PBS -A st-alice-1-gpu" in out
    assert 'mpirun -np 8 --map-by ppr:4:node --bind-to none --hostfile "$PBS_NODEFILE"' in out
    assert f"qsub {tmp_path}/pi.pbs" in out
    assert not list(tmp_path.iterdir()), "a dry run writes nothing"


def test_list_jobs_keeps_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "alice")
    runner = FakeRunner(responses={"qstat": (DATA / "qstat_json_history.json").read_text().replace(
        '"Job_Name":"resnet",', '"Job_Name":"resnet","Job_Owner":"bob@login01",')})
    names = sorted(st.name for st in PBSScheduler(runner=runner).list_jobs())
    assert names == ["mnist", "pi"]
    assert runner.calls[0][0] == ["qstat", "-f", "-F", "json"]


def test_rank_logs_refused_for_torchrun(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHHPC_STATE_DIR", str(tmp_path / "state"))
    sched = PBSScheduler(runner=FakeRunner(responses={"qsub": "77.s\n"}))
    job = sched.submit(spec(launcher="torchrun", output_dir=str(tmp_path)))
    (tmp_path / "pi.o77").write_text("[default0]:hello\n")
    assert sched.logs(job) == "[default0]:hello\n"
    with pytest.raises(SchedulerError, match="launcher mpirun"):
        sched.logs(job, rank=0)


def test_stop_file_before_walltime_runs_in_bash(tmp_path: Path) -> None:
    """The nothing-lost block, run by bash: the timer creates $TORCHHPC_STOP_FILE, the (stand-in) mpirun
    sees it and exits 0, the script exits 0; no PBS warning signal is needed."""
    s = spec(time="1", signal_before=58, output_dir=str(tmp_path))  # walltime 60 s, stop after 2 s
    script = PBSScheduler(runner=FakeRunner()).render(s).script or ""
    for path, text in job_boot(s)[1]:  # the boot copy torchhpc writes at submit (python3 is not this one)
        Path(path).parent.mkdir(exist_ok=True)
        Path(path).write_text(text)
    block = script[script.index("# Nothing lost") :]
    assert "sleep 2 && _torchhpc_stop time-limit" in block and "-x TORCHHPC_STOP_FILE" in block
    fake = tmp_path / "bin" / "mpirun"
    fake.parent.mkdir()
    fake.write_text('#!/bin/bash\nwhile [ ! -e "$TORCHHPC_STOP_FILE" ]; do sleep 0.1; done\necho "ranks saw the stop file"\n')
    fake.chmod(0o755)
    (tmp_path / "nodes").write_text("n1\nn2\n")
    env = {"PATH": f"{fake.parent}:{os.environ['PATH']}", "PBS_NODEFILE": str(tmp_path / "nodes"),
           "PBS_JOBID": "4711.server", "PBS_O_WORKDIR": str(tmp_path)}
    r = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "time-limit" in r.stdout and "ranks saw the stop file" in r.stdout
    assert not (tmp_path / ".torchhpc-stop-4711").exists()  # the stop protocol's files end with the job (endmark.py)
    with pytest.raises(SpecError, match="--requeue"):
        PBSScheduler(runner=FakeRunner()).render(spec(time="10", requeue=True))
