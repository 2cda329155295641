"""The PBS script torchhpc renders, run for real across two dev-cluster nodes.

No PBS server can be installed here, so the *scheduler* part is stood in for:
a Slurm allocation of two namespace nodes (the dev cluster) plays the PBS job,
and a wrapper provides what PBS would -- ``$PBS_NODEFILE`` (each host listed
once per MPI slot, as PBS Pro writes it for ``mpiprocs``), ``$PBS_JOBID`` and
``$PBS_O_WORKDIR`` -- then runs the rendered ``.pbs`` file with bash (its
``#PBS`` lines are comments to bash, as they are to the job shell under PBS).

Everything after that is real: the script's nodefile parsing, MASTER_ADDR and
MASTER_PORT derivation, and one ``mpirun`` with the seed's flags
(``--hostfile $PBS_NODEFILE --oversubscribe -x ... -mca pml ob1 -mca btl ^openib``)
starting 4 ranks of examples/pi.py over two nodes that talk gloo over veth.
OpenMPI reaches the second node through Slurm here; under PBS it uses PBS's TM
interface or ssh -- that part is the one not exercised. One variant puts every
rank in a real Charliecloud container (the test image from .ci/build-test-image.sh).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PYTHON, REPO, container_image_env
from tests.fakes import FakeRunner
from torchhpc.core.spec import ContainerSpec, Entrypoint, JobSpec
from torchhpc.schedulers.pbs.pbs import PBSScheduler

pytestmark = pytest.mark.cluster("slurm")

WRAPPER = """#!/bin/bash
# Stand-in for PBS: give the rendered script what a PBS MOM gives a job.
set -euo pipefail
export PBS_NODEFILE={nodefile}
scontrol show hostnames "$SLURM_JOB_NODELIST" | awk '{{for (i = 0; i < {slots}; i++) print}}' > "$PBS_NODEFILE"
export PBS_JOBID="${{SLURM_JOB_ID}}.pbsserver01" PBS_O_WORKDIR={workdir} USER="${{USER:-root}}"
unset MASTER_ADDR MASTER_PORT
exec bash {script}
"""


def run_body(slurm: Any, tmp_path: Path, spec: JobSpec, slots: int) -> str:
    sub = PBSScheduler(runner=FakeRunner()).render(spec)
    script = sub.script or ""
    for path, text in sub.files:  # the boot copy a container's ranks use, written as a submit writes it
        if path != sub.script_path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text)
    pbs = tmp_path / "job.pbs"
    pbs.write_text(script)
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(
        WRAPPER.format(nodefile=tmp_path / "nodefile", slots=slots, workdir=REPO, script=pbs)
    )
    out = tmp_path / "out.log"
    job = slurm.sbatch(
        ["-N2", f"--ntasks-per-node={slots}", f"--output={out}", "--time=5", str(wrapper)], cwd=str(tmp_path)
    )
    info = slurm.wait(job, timeout=300)
    text = out.read_text(errors="replace") if out.exists() else ""
    # under mpirun each rank writes its own file in <output-dir>/<name>-<job number>/ranks/
    for path in sorted(Path(spec.output_dir).glob(f"{spec.name}-{job}/ranks/rank-*.log")):
        text += path.read_text(errors="replace")
    assert info.get("JobState") == "COMPLETED", f"{info}\n{text}"
    return text


def check_pi(text: str) -> None:
    ranks = set(re.findall(r"rank (\d+)/4 on", text))
    assert ranks == {"0", "1", "2", "3"}, text
    hosts = set(re.findall(r"rank \d+/4 on (\S+?):", text))
    assert len(hosts) == 2, text
    m = re.search(r"error ([0-9.eE+-]+) ranks 4", text)
    assert m and float(m.group(1)) < 1e-10, text


def spec(out: Path, **kw: object) -> JobSpec:
    """The PBS job of these tests, its job directories under ``out`` (the test's own folder): under ``/tmp`` a
    job directory ``pi-pbs-<job id>`` outlived its run, and a later dev cluster's job of the same id added the
    old rank logs to its own (run 38, docs/testing.md)."""
    base: dict[str, object] = dict(
        entrypoint=Entrypoint.parse(["examples/pi.py", "--steps", "2000000"], python=PYTHON),
        nodes=2,
        nproc_per_node=2,
        name="pi-pbs",
        scheduler="pbs",
        launcher="mpirun",
        output_dir=str(out),
    )
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


def test_sockeye_mpirun_body_runs_pi_on_two_nodes(slurm: Any, tmp_path: Path) -> None:
    text = run_body(slurm, tmp_path, spec(tmp_path), slots=2)
    # the script's own banner names both hosts; each rank's lines are whole in its own file
    assert re.search(r"torchhpc: job \d+\.pbsserver01 on \S+ \S+, master [0-9.]+:\d+", text), text
    ranks = sorted(tmp_path.glob("pi-pbs-*/ranks/rank-*.log"))
    assert [p.name.split("@")[0] for p in ranks] == ["rank-0", "rank-1", "rank-2", "rank-3"], ranks
    assert re.search(r"^rank 3/4 on ", ranks[3].read_text(), re.M), ranks[3].read_text()
    check_pi(text)


def test_torchrun_per_node_via_mpirun_body(slurm: Any, tmp_path: Path) -> None:
    """The alternative launch: one torchrun per node (started by mpirun here, pbsdsh needs a PBS MOM)."""
    text = run_body(slurm, tmp_path, spec(tmp_path, launcher="torchrun", options=(("per_node", "mpirun"),)), slots=1)
    check_pi(text)


def test_charliecloud_ranks_under_the_pbs_body(slurm: Any, tmp_path: Path) -> None:
    """Each mpirun rank in a Charliecloud container (the test image: Debian's python + torch), across two nodes."""
    image = container_image_env()["TORCHHPC_TEST_CH_IMAGE"]
    s = spec(
        tmp_path,
        entrypoint=Entrypoint.parse(["examples/pi.py", "--steps", "2000000"]),
        container=ContainerSpec(image=image, runtime="charliecloud"),
    )
    text = run_body(slurm, tmp_path, s, slots=2)
    assert "ch-run" in (tmp_path / "job.pbs").read_text()
    check_pi(text)


def test_depend_line_chains_pbs_bodies(slurm: Any, tmp_path: Path) -> None:
    """``--after-ok``/``--after-any`` on PBS: the rendered ``#PBS -W depend=`` line is read back with
    PBS's grammar (``TYPE:JOBID[:JOBID...]``, comma-separated) and handed to the stand-in's Slurm
    with the job ids mapped, which is the PBS server's part (not installable here). The bodies run
    for real: after-ok of a failed body never starts (DependencyNeverSatisfied), after-any does."""
    from torchhpc.core.depend import parse_dependencies

    def submit(name: str, code: int, after: tuple[Any, ...] = ()) -> str:
        s = spec(tmp_path, entrypoint=Entrypoint.parse([PYTHON, "-c", f"print('body {name}'); raise SystemExit({code})"]),
                 nodes=1, nproc_per_node=1, name=name, after=after)
        script = PBSScheduler(runner=FakeRunner()).render(s).script or ""
        (tmp_path / f"{name}.pbs").write_text(script)
        wrapper = tmp_path / f"{name}.sh"
        wrapper.write_text(WRAPPER.format(nodefile=tmp_path / f"{name}.nodes", slots=1, workdir=REPO,
                                          script=tmp_path / f"{name}.pbs"))
        extra = []
        m = re.search(r"^#PBS -W depend=(\S+)$", script, re.M)
        if m:
            grammar = r"(afterok|afterany|afternotok)(:\d+\.pbsserver01)+(,(afterok|afterany|afternotok)(:\d+\.pbsserver01)+)*"
            assert re.fullmatch(grammar, m.group(1)), m.group(1)
            extra = [f"--dependency={m.group(1).replace('.pbsserver01', '')}", "--kill-on-invalid-dep=yes"]
        return str(slurm.sbatch(["-N1", f"--output={tmp_path / name}.out", "--time=5", *extra, str(wrapper)]))

    bad = submit("bad", 3)
    pbs_id = f"{bad}.pbsserver01"
    never = submit("never", 0, parse_dependencies("ok", pbs_id, "pbs"))
    anyway = submit("anyway", 0, parse_dependencies("any", f"pbs:{pbs_id}", "pbs"))
    ended = slurm.wait_all([bad, never, anyway])
    assert ended[bad]["JobState"] == "FAILED"
    info = ended[never]
    assert (info["JobState"], info["Reason"]) == ("CANCELLED", "DependencyNeverSatisfied"), info
    assert ended[anyway]["JobState"] == "COMPLETED"
    assert "body anyway" in (tmp_path / "anyway.out").read_text() + "".join(
        p.read_text() for p in tmp_path.glob("anyway-*/ranks/*.log"))


# A PBS job seen from inside, as `torchhpc top` and the hang probe reach it: pbsdsh and qstat stood in
# for (no PBS MOM or server here). The stand-in pbsdsh really runs its argv once on each node of the
# node file, as a step of the Slurm job that plays the PBS job; PBS Pro's would start a copy per slot.
FAKE_PBSDSH = """#!/bin/bash
[ "$1" = "--" ] && shift
for h in $(awk '!seen[$0]++' "$PBS_NODEFILE"); do
  srun --overlap --jobid="$SLURM_JOB_ID" -N1 -n1 -w "$h" --quiet "$@" &
done
wait
"""
FAKE_QSTAT = """#!/bin/bash
hosts=$(awk '!seen[$0]++ {printf "%s%s/0", sep, $0; sep="+"}' "$PBS_NODEFILE")
printf '{"Jobs": {"%s": {"job_state": "R", "exec_host": "%s", "Job_Name": "sleepy"}}}\\n' "$PBS_JOBID" "$hosts"
"""
LOOK = """
set -m  # the body in a process group of its own: killing the group reaches mpirun, not only its bash
bash {script} &
body=$!
for _ in $(seq 180); do
  [ "$(grep -l started {ranks}/rank-*.log 2>/dev/null | wc -l)" -ge 4 ] && break
  sleep 1
done
{python} -m torchhpc top "pbs:$PBS_JOBID" --json > {out}/top.json 2> {out}/top.err || true
{python} {out}/probe.py > {out}/probe.json 2> {out}/probe.err || true
kill -TERM -- -"$body" 2>/dev/null || true
wait "$body" || true
"""
PROBE = """import json, os
from torchhpc.diagnose.hang import probe_argv, probe_job
from torchhpc.schedulers import get_scheduler

alloc = get_scheduler("pbs").allocation_of(os.environ["PBS_JOBID"])
match = alloc.rank_match()
stacks = probe_job(match, alloc.on_nodes(probe_argv(match), alloc.nodes()), alloc.runner)
print(json.dumps(sorted({s.rank for s in stacks})))
"""


def test_top_and_the_hang_probe_reach_the_ranks_of_a_pbs_body(slurm: Any, tmp_path: Path) -> None:
    """The rendered PBS body (mpirun, 2 nodes x 2 ranks) runs for real; from inside the job, ``torchhpc
    top`` and the hang probe reach its ranks through the PBS allocation (pbsdsh, stood in as above)
    and find every rank by its PBS_JOBID. The dev cluster's nodes share one /proc, so each node's
    sampler sees all four ranks: the test counts ranks, not which node named them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("pbsdsh", FAKE_PBSDSH), ("qstat", FAKE_QSTAT)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "probe.py").write_text(PROBE)
    program = "import time; print('started', flush=True); time.sleep(150)"  # ended by the LOOK's kill
    s = spec(tmp_path, entrypoint=Entrypoint.parse([PYTHON, "-c", program]), name="sleepy")
    pbs = tmp_path / "job.pbs"
    pbs.write_text(PBSScheduler(runner=FakeRunner()).render(s).script or "")
    head = WRAPPER.format(nodefile=tmp_path / "nodefile", slots=2, workdir=REPO, script=pbs)
    head = head.replace(f"exec bash {pbs}\n", f'export PATH="{bin_dir}:$PATH"\n')
    look = LOOK.format(script=pbs, ranks=f'{tmp_path}/sleepy-"${{PBS_JOBID%%.*}}"/ranks', python=PYTHON, out=tmp_path)
    wrapper = tmp_path / "wrapper.sh"
    wrapper.write_text(head + look)
    job = slurm.sbatch(["-N2", "--ntasks-per-node=2", f"--output={tmp_path / 'out.log'}", "--time=5", str(wrapper)],
                       cwd=str(tmp_path))
    info = slurm.wait(job, timeout=300)
    said = "\n".join(p.read_text(errors="replace") for p in [*sorted(tmp_path.glob("*.err")), tmp_path / "out.log"]
                     if p.exists())
    assert info.get("JobState") == "COMPLETED", f"{info}\n{said}"
    rows = json.loads((tmp_path / "top.json").read_text())
    assert sorted({r["rank"] for r in rows if r["state"] != "gone"}) == [0, 1, 2, 3], f"{rows}\n{said}"
    assert json.loads((tmp_path / "probe.json").read_text()) == [0, 1, 2, 3], said
