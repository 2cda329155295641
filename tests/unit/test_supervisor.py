"""The in-allocation supervisor's pure parts: policy, node choice, attempts.json, classification,
and the batch script it is rendered into (the cluster scenarios are tests/integration/test_resilience.py)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.diagnose.verdict import CLASSES
from torchhpc.errors import SpecError
from torchhpc.schedulers import get_scheduler
from torchhpc.supervisor import POLICY, RESTART_CLASSES, action_for, load_attempts
from torchhpc.supervisor.__main__ import parse
from torchhpc.supervisor.attempts import Attempt, save_attempts
from torchhpc.supervisor.loop import _classify, _sizes
from torchhpc.supervisor.nodes import alive, choose
from torchhpc.supervisor.show import attempt_lines


def test_every_verdict_class_has_a_policy_and_only_outside_causes_restart() -> None:
    assert set(CLASSES) <= set(POLICY)
    assert RESTART_CLASSES == {"node-failure", "hang", "network", "lost-peer"}
    for never in ("user-exception", "cuda-oom", "host-oom", "environment"):
        assert action_for(never) == "end"
    assert action_for("a class nobody knows") == "end"


def test_choose_keeps_the_survivors_and_fills_from_the_spares_in_allocation_order() -> None:
    alloc = ["n1", "n2", "n3", "n4"]
    assert choose(alloc, [], alloc, 2) == ["n1", "n2"]
    assert choose(alloc, ["n1", "n2"], ["n1", "n3", "n4"], 2) == ["n1", "n3"]
    assert choose(alloc, ["n2", "n3"], ["n1", "n3", "n4"], 2) == ["n1", "n3"]  # n3 kept, n1 the first spare
    assert choose(alloc, ["n1", "n2"], ["n1"], 2) == ["n1"]  # not enough: the caller requeues or ends


def test_alive_is_a_tcp_connect() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    assert alive("127.0.0.1", port, timeout=1.0)
    srv.close()
    assert not alive("127.0.0.1", port, timeout=1.0)


def test_attempts_round_trip_with_the_issue_fields(tmp_path: Path) -> None:
    a = Attempt(attempt=0, nodes=["n1", "n2"], started=1.0, ended=2.0, klass="node-failure", excluded=["n2"])
    save_attempts(str(tmp_path), [a.to_json()])
    got = load_attempts(str(tmp_path))
    assert got[0]["class"] == "node-failure" and got[0]["nodes"] == ["n1", "n2"] and got[0]["excluded"] == ["n2"]
    assert {"nodes", "class", "excluded", "started", "ended"} <= set(got[0])
    assert Attempt.from_json(got[0]).klass == "node-failure"
    assert "excluded n2" in attempt_lines(got)[0] and "node-failure" in attempt_lines(got)[0]
    (tmp_path / "attempts.json").write_text("not json")
    assert load_attempts(str(tmp_path)) == []


def test_classify_reads_only_what_the_attempt_wrote(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    old = "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\nValueError: old attempt\n"
    (ranks / "rank-0@n1.log").write_text(old)
    (ranks / "rank-1@n2.log").write_text("")
    sizes = _sizes(str(ranks))
    with open(ranks / "rank-1@n2.log", "a") as f:
        f.write("Traceback (most recent call last):\n  File \"t.py\", line 9, in <module>\nValueError: planted\n")
    with open(ranks / "rank-0@n1.log", "a") as f:
        f.write("RuntimeError: Connection closed by peer\n")
    out = _classify(str(ranks), sizes, 1)
    assert (out.klass, out.rank) == ("user-exception", 1) and "planted" in out.detail
    assert _classify(str(ranks), _sizes(str(ranks)), 1).klass == "unknown"


def test_the_command_line_parses() -> None:
    o = parse(["--job-dir", "/j", "--nodes", "2", "--max-restarts", "1", "--hang-timeout", "20", "--requeue"])
    assert (o.nodes, o.max_restarts, o.hang_timeout, o.requeue) == (2, 1, 20.0, True)


def _spec(**kw: object) -> JobSpec:
    base: dict[str, object] = dict(entrypoint=Entrypoint.parse(["train.py"]), nodes=2, nproc_per_node=2,
                                   scheduler="slurm", output_dir="/scratch/out", name="t")
    base.update(kw)
    return JobSpec(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("launcher", ["srun", "torchrun", "mpirun"])
def test_slurm_script_allocates_the_spares_and_runs_the_step_under_the_supervisor(launcher: str) -> None:
    script = get_scheduler("slurm").render(_spec(launcher=launcher, spares=1, max_restarts=2, hang_timeout=30)).script
    assert "#SBATCH --nodes=3" in script and "#SBATCH --no-kill" in script
    assert "_torchhpc_step() {" in script and "export -f _torchhpc_step" in script
    assert "-m torchhpc.supervisor" in script and "--max-restarts 2" in script and "--hang-timeout 30" in script
    step = script[script.index("_torchhpc_step() {"):script.index("export -f")]
    if launcher == "mpirun":
        assert '--host "$TORCHHPC_STEP_HOSTS"' in step and "-np 4" in step
    else:
        assert '--nodelist="$TORCHHPC_STEP_NODES"' in step and "--nodes=2" in step
    if launcher == "torchrun":
        assert "--nnodes 2" in step and '"$SLURM_JOB_ID-$TORCHHPC_RESTART_COUNT"' in step
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0


def test_without_spares_or_restarts_the_script_is_unchanged() -> None:
    script = get_scheduler("slurm").render(_spec(launcher="srun", hang_timeout=30)).script
    assert "torchhpc.supervisor" not in script and "--no-kill" not in script and "#SBATCH --nodes=2" in script


@pytest.mark.parametrize(("scheduler", "flags", "why"), [
    ("pbs", {"spares": 1}, "no slurmd to probe"),
    ("pbs", {"max_restarts": 1}, "no restart"),
    ("local", {"spares": 1, "nodes": 1}, "no other node"),
    ("kubernetes", {"spares": 1}, "rescheduled by the cluster"),
    ("kubernetes", {"max_restarts": 1}, "api=pytorchjob"),
])
def test_what_a_scheduler_cannot_do_is_refused_with_the_reason(scheduler: str, flags: dict, why: str) -> None:
    kw = {"scheduler": scheduler, "launcher": "torchrun", **flags}
    if scheduler == "kubernetes":
        kw["options"] = (("image", "img:1"),)
    with pytest.raises(SpecError) as e:
        get_scheduler(scheduler).render(_spec(**kw))
    assert why in e.value.message + (e.value.hint or "")


def test_kubernetes_pytorchjob_maps_max_restarts_to_backoff_limit() -> None:
    sub = get_scheduler("kubernetes").render(
        _spec(scheduler="kubernetes", max_restarts=3, options=(("image", "img:1"), ("api", "pytorchjob"))))
    assert "backoffLimit: 3" in sub.script or '"backoffLimit": 3' in json.dumps(sub.script)


def test_job_ids_go_on_past_the_last_cluster(tmp_path: Path) -> None:
    """FirstJobId: past every id the last cluster's slurmctld.log names, and past the saved number."""
    from torchhpc.devcluster.bringup import NEXT_JOB_ID, next_job_id
    from torchhpc.devcluster.config import make_layout, render_slurm_conf

    assert next_job_id(str(tmp_path)) == 1
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "slurmctld.log").write_text("sched: Allocate JobId=7 NodeList=node1\n_job_complete: JobId=12 done\n")
    assert next_job_id(str(tmp_path)) == 13
    (tmp_path / NEXT_JOB_ID).write_text("40\n")
    assert next_job_id(str(tmp_path)) == 40
    conf = render_slurm_conf(make_layout(str(tmp_path), 2), accounting=False, real_memory_mb=1000, first_job_id=40)
    assert "FirstJobId=40" in conf.splitlines()
