"""The in-allocation supervisor's pure parts: policy, node choice, attempts.json, classification,
and the batch script it is rendered into (the cluster scenarios are tests/integration/test_resilience.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from torchhpc.core.exitcodes import EXIT_CODES
from torchhpc.core.proc import Runner
from torchhpc.core.spec import Entrypoint, JobSpec
from torchhpc.diagnose.classify import CLASSES
from torchhpc.errors import SpecError
from torchhpc.jobdir.layout import HANG
from torchhpc.schedulers import get_scheduler
from torchhpc.schedulers.local.ranks import new_run_id
from torchhpc.supervisor import POLICY, RESTART_CLASSES, action_for, load_attempts
from torchhpc.supervisor.__main__ import parse
from torchhpc.supervisor.attempts import Attempt, save_attempts
from torchhpc.supervisor.health import check_here, gate
from torchhpc.supervisor.loop import Options, Supervisor
from torchhpc.supervisor.outcome import classify_attempt, log_sizes
from torchhpc.supervisor.policy import choose
from torchhpc.supervisor.progress import NoProgress, newest_checkpoint
from torchhpc.supervisor.resume import restart_args
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


def test_alive_is_a_tcp_connect_to_slurmd() -> None:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]
    alloc = get_scheduler("slurm", _Slurm([], port)).allocation_of("7", {})
    assert alloc.alive("127.0.0.1", timeout=1.0)
    srv.close()
    assert not alloc.alive("127.0.0.1", timeout=1.0)


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


def test_an_attempt_holds_any_schedulers_job_id_and_reads_the_old_name() -> None:
    """``job_id`` (any scheduler's id); attempts.json files written before it was named so say ``slurm_job``."""
    assert Attempt(attempt=0, nodes=[], started=1.0, job_id="pbs.7").to_json()["job_id"] == "pbs.7"
    old = {"attempt": 0, "nodes": ["n1"], "started": 1.0, "class": None, "slurm_job": "42"}
    assert Attempt.from_json(old).job_id == "42"


def test_attempts_carry_the_parts_of_a_recovery(tmp_path: Path) -> None:
    """The fields `torchhpc events` reads: optional, null when unknown, and read back unchanged."""
    bare = Attempt(attempt=0, nodes=["n1"], started=1.0).to_json()
    assert {k: bare[k] for k in ("first_line", "fault", "teardown_s", "health_s", "checkpoint_step",
                                  "launched")} == dict.fromkeys(("first_line", "fault", "teardown_s",
                                                                 "health_s", "checkpoint_step", "launched"))
    assert bare["health"] == {} and bare["found_by"] == ""
    a = Attempt(attempt=1, nodes=["n1", "n3"], started=10.0, launched=11.5, first_line=14.0, fault=20.0,
                found_by="probe", teardown_s=0.4, health_s=1.2, health={"n2": "job dir not writable"},
                checkpoint_step=1200)
    save_attempts(str(tmp_path), [a.to_json()])
    back = Attempt.from_json(load_attempts(str(tmp_path))[0])
    assert back == a


def test_classify_reads_only_what_the_attempt_wrote(tmp_path: Path) -> None:
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    old = "Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\nValueError: old attempt\n"
    (ranks / "rank-0@n1.log").write_text(old)
    (ranks / "rank-1@n2.log").write_text("")
    sizes = log_sizes(str(ranks))
    with open(ranks / "rank-1@n2.log", "a") as f:
        f.write("Traceback (most recent call last):\n  File \"t.py\", line 9, in <module>\nValueError: planted\n")
    with open(ranks / "rank-0@n1.log", "a") as f:
        f.write("RuntimeError: Connection closed by peer\n")
    out = classify_attempt(str(ranks), sizes, 1)
    assert (out.klass, out.rank) == ("user-exception", 1) and "planted" in out.detail
    assert classify_attempt(str(ranks), log_sizes(str(ranks)), 1).klass == "unknown"


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
    script = get_scheduler("slurm").render(_spec(launcher=launcher, spares=1, max_restarts=2, hang_timeout=30)).script or ""
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
    script = get_scheduler("slurm").render(_spec(launcher="srun", hang_timeout=30)).script or ""
    assert "torchhpc.supervisor" not in script and "--no-kill" not in script and "#SBATCH --nodes=2" in script


@pytest.mark.parametrize(("scheduler", "flags", "why"), [
    ("pbs", {"spares": 1}, "no slurmd to probe"),
    ("pbs", {"max_restarts": 1}, "no restart"),
    ("local", {"spares": 1, "nodes": 1}, "no other node"),
    ("kubernetes", {"spares": 1}, "rescheduled by the cluster"),
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
    assert "backoffLimit: 3" in (sub.script or "") or '"backoffLimit": 3' in json.dumps(sub.script)


def test_job_ids_go_on_past_the_last_cluster(tmp_path: Path) -> None:
    """FirstJobId: past every id the last cluster's slurmctld.log names, and past the saved number."""
    from torchhpc.devcluster.config import make_layout, render_slurm_conf
    from torchhpc.devcluster.prepare import NEXT_JOB_ID, next_job_id

    assert next_job_id(str(tmp_path)) == 1
    (tmp_path / "log").mkdir()
    (tmp_path / "log" / "slurmctld.log").write_text("sched: Allocate JobId=7 NodeList=node1\n_job_complete: JobId=12 done\n")
    assert next_job_id(str(tmp_path)) == 13
    (tmp_path / NEXT_JOB_ID).write_text("40\n")
    assert next_job_id(str(tmp_path)) == 40
    conf = render_slurm_conf(make_layout(str(tmp_path), 2), accounting=False, real_memory_mb=1000, first_job_id=40)
    assert "FirstJobId=40" in conf.splitlines()


class _Slurm(Runner):
    """Answers the supervisor's few Slurm commands (no controller in a unit test) and records them;
    the step, the liveness sockets and the stop file are real."""

    def __init__(self, hosts: list[str], port: int) -> None:
        super().__init__()
        self.hosts, self.port = hosts, port
        self.calls: list[list[str]] = []

    def run(self, argv, check=True, timeout=None, **kw):  # type: ignore[no-untyped-def,override]
        self.calls.append(list(argv))
        out = {"hostnames": " ".join(self.hosts), "config": f"SlurmdPort = {self.port}\n"}.get(argv[2], "")
        return subprocess.CompletedProcess(argv, 0, out, "")


def test_a_stop_file_from_a_node_loss_teardown_does_not_read_as_a_stop(tmp_path: Path) -> None:
    """A node dies; Slurm's SIGTERM to the surviving ranks makes them create the stop file as the
    step ends. The supervisor must still requeue without the dead node (seen in CI: it read the file
    as a preemption, gave up, and the batch shell requeued the job with the dead node in it)."""
    listeners: list[socket.socket] = []
    for host in ("127.0.0.1", "127.0.0.2"):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, listeners[0].getsockname()[1] if listeners else 0))
        s.listen(4)
        listeners.append(s)
    port = listeners[0].getsockname()[1]
    stop, go = tmp_path / "stop", tmp_path / "go"
    step = f'() {{ while [ ! -e {go} ]; do sleep 0.05; done; touch "$TORCHHPC_STOP_FILE"; exit 1; }}'
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "127.0.0.[1-2]", "TORCHHPC_STOP_FILE": str(stop),
           "BASH_FUNC__torchhpc_step%%": step}
    slurm = _Slurm(["127.0.0.1", "127.0.0.2"], port)
    opts = Options(job_dir=str(tmp_path), nodes=2, nproc_per_node=1, launcher="srun", max_restarts=1,
                   requeue=True, probe_every=60.0)
    def node_dies() -> None:
        time.sleep(1.0)  # the step runs on both "nodes"
        listeners.pop().close()  # 127.0.0.2 dies
        go.touch()  # the step ends as a lost node's step does, with the ranks' stop file

    old = signal.getsignal(signal.SIGTERM)  # the requeue ignores SIGTERM (it signals the batch shell)
    t = threading.Thread(target=node_dies)
    try:
        t.start()
        result = [Supervisor(opts, runner=slurm, env=env).run()]  # the main thread: it sets a signal handler
        t.join(30)
    finally:
        signal.signal(signal.SIGTERM, old)
        for s in listeners:
            s.close()
    assert result == [0]
    assert ["scontrol", "requeue", "7"] in slurm.calls, slurm.calls
    assert ["scontrol", "update", "JobId=7", "ExcNodeList=127.0.0.2"] in slurm.calls, slurm.calls
    assert not stop.exists()
    tries = load_attempts(str(tmp_path))
    assert [(a["class"], a["excluded"]) for a in tries] == [("node-failure", ["127.0.0.2"])], tries


def test_a_hung_attempt_is_probed_and_ended_through_the_allocation(tmp_path: Path) -> None:
    """The supervisor's hang watch asks the allocation (here the local one: the probe runs on this
    machine) for the ranks' stacks: a rank that writes nothing and uses no CPU is named, the step is
    killed and the attempt recorded as a hang. Real processes; no scheduler is stood in for."""
    run = new_run_id()  # its own: the probe finds a local job's ranks by it (a shared one added suspects)
    step = f"() {{ RANK=0 TORCHELASTIC_RUN_ID={run} exec " + sys.executable + " -c 'import time; time.sleep(120)'; }"
    env = {"PATH": os.environ["PATH"], "BASH_FUNC__torchhpc_step%%": step, "TORCHELASTIC_RUN_ID": run}
    opts = Options(job_dir=str(tmp_path), nodes=1, nproc_per_node=1, launcher="srun", hang_timeout=0.5,
                   probe_every=60.0, scheduler="local")
    assert Supervisor(opts, env=env).run() == EXIT_CODES["hang"]
    tries = load_attempts(str(tmp_path))
    assert [(a["class"], a["nodes"]) for a in tries] == [("hang", ["localhost"])], tries
    assert tries[0]["found_by"] == "hang-watch" and tries[0]["fault"] >= tries[0]["launched"] >= tries[0]["started"]
    assert tries[0]["teardown_s"] is not None and tries[0]["first_line"] is None  # it never wrote a line
    assert (tmp_path / HANG).exists(), sorted(p.name for p in tmp_path.iterdir())


def test_each_hung_attempt_names_its_own_culprit(tmp_path: Path) -> None:
    """Two hung attempts, each of one rank whose number is the attempt's (RANK=$TORCHHPC_RESTART_COUNT):
    attempts.json must name rank 0 for the first and rank 1 for the second, so the second verdict comes
    from its own probe, not from the first attempt's watch (issue 47: only tries[0] was ever checked)."""
    run = new_run_id()  # its own: the probe finds a local job's ranks by it (a shared one added suspects)
    step = (f"() {{ RANK=$TORCHHPC_RESTART_COUNT TORCHELASTIC_RUN_ID={run} exec " + sys.executable
            + " -c 'import time; time.sleep(120)'; }")
    env = {"PATH": os.environ["PATH"], "BASH_FUNC__torchhpc_step%%": step, "TORCHELASTIC_RUN_ID": run}
    opts = Options(job_dir=str(tmp_path), nodes=1, nproc_per_node=1, launcher="srun", hang_timeout=0.5,
                   probe_every=60.0, scheduler="local", max_restarts=1)
    assert Supervisor(opts, env=env).run() != 0
    tries = load_attempts(str(tmp_path))
    assert [(a["class"], a["rank"], a["found_by"]) for a in tries] == [("hang", 0, "hang-watch"), ("hang", 1, "hang-watch")], tries


def _failing_step(tmp_path: Path, save: bool) -> str:
    """A bash step that fails with a rendezvous error each attempt, saving a checkpoint first when ``save``."""
    ranks, ckpt = tmp_path / "ranks", tmp_path / "ckpt"
    ranks.mkdir(exist_ok=True)
    ckpt.mkdir(exist_ok=True)
    n = "$TORCHHPC_RESTART_COUNT"
    saving = f"touch {ckpt}/ckpt-$((100 * ({n} + 1))).pt; " if save else ""
    return ("() { " + saving + f"echo 'torch.distributed.DistNetworkError: attempt {n}' >> {ranks}/rank-0@localhost.log;"
            " exit 1; }")


def test_the_newest_checkpoint_comes_from_the_helper_or_the_directory(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    assert newest_checkpoint(str(tmp_path), str(ckpt)) is None
    (ckpt / "checkpoint-900").mkdir(parents=True)
    (ckpt / "epoch=3-step=1200.ckpt").write_text("")
    (ckpt / ".ckpt-000001300.pt.tmp-7").write_text("")  # a save in progress does not count
    got = newest_checkpoint(str(tmp_path), str(ckpt))
    assert got is not None and got.step == 1200
    (tmp_path / "checkpoint.json").write_text(json.dumps({"step": 1500, "path": "x", "time": 1.0}))
    got = newest_checkpoint(str(tmp_path), str(ckpt))
    assert got is not None and got.step == 1500  # the helper's word first
    storm = NoProgress(2, str(tmp_path))
    assert storm.after("hang") == 1500 and storm.why_stop() == ""
    assert storm.after("network") == 1500
    assert storm.why_stop().startswith("restart storm: hang x1, network x1 at step 1500, no checkpoint advance")


def test_restarts_that_never_advance_the_checkpoint_end_with_no_progress(tmp_path: Path) -> None:
    """Real steps (bash on the local allocation) fail with a network error each time and save nothing:
    with 5 restarts allowed, the supervisor stops after 3 attempts with no-progress and its code."""
    env = {"PATH": os.environ["PATH"], "BASH_FUNC__torchhpc_step%%": _failing_step(tmp_path, save=False)}
    opts = Options(job_dir=str(tmp_path), nodes=1, nproc_per_node=1, launcher="srun", max_restarts=5,
                   probe_every=60.0, scheduler="local", checkpoint_dir=str(tmp_path / "ckpt"))
    assert Supervisor(opts, env=env).run() == EXIT_CODES["no-progress"]
    tries = load_attempts(str(tmp_path))
    got = [(a["class"], a.get("cause"), a["checkpoint_step"], a["found_by"]) for a in tries]
    # the last attempt's class is the job's (no-progress), its own class kept as the cause
    assert got == [("network", None, None, "step-end")] * 2 + [("no-progress", "network", None, "step-end")], got
    assert tries[-1]["detail"].startswith("restart storm: network x3 before the first checkpoint"), tries[-1]


def test_restarts_that_save_a_newer_checkpoint_go_on(tmp_path: Path) -> None:
    """The same failures, each after a newer checkpoint: the restarts are spent, not stopped early."""
    env = {"PATH": os.environ["PATH"], "BASH_FUNC__torchhpc_step%%": _failing_step(tmp_path, save=True)}
    opts = Options(job_dir=str(tmp_path), nodes=1, nproc_per_node=1, launcher="srun", max_restarts=3,
                   probe_every=60.0, scheduler="local", checkpoint_dir=str(tmp_path / "ckpt"))
    assert Supervisor(opts, env=env).run() == EXIT_CODES["network"]
    assert [a["checkpoint_step"] for a in load_attempts(str(tmp_path))] == [100, 200, 300, 400]


def test_restart_args_name_the_newest_match_from_the_second_attempt_on(tmp_path: Path) -> None:
    told: list[str] = []
    template = "--resume_from_checkpoint {latest:ckpt/checkpoint-*} --x 'a b'"
    assert restart_args(template, 0, str(tmp_path)) == []  # the first attempt runs as given
    assert restart_args(template, 1, str(tmp_path), say=told.append) == []  # nothing saved yet: from scratch
    assert "nothing matches ckpt/checkpoint-*" in told[0]
    for i, step in enumerate((20, 100)):  # the newest by time, not by name
        (tmp_path / "ckpt" / f"checkpoint-{step}").mkdir(parents=True)
        os.utime(tmp_path / "ckpt" / f"checkpoint-{step}", (1000 - i, 1000 - i))
    assert restart_args(template, 2, str(tmp_path)) == ["--resume_from_checkpoint", "ckpt/checkpoint-20", "--x", "a b"]
    with pytest.raises(SpecError, match="--on-restart-append"):
        _spec(on_restart_append="--resume 'unclosed")


def test_the_step_takes_the_restart_args_only_when_asked() -> None:
    from torchhpc.schedulers import get_scheduler as sched

    plain = sched("slurm").render(_spec(max_restarts=1, spares=1)).script or ""
    told = sched("slurm").render(_spec(max_restarts=1, spares=1, on_restart_append="--resume {latest:c/*}",
                                       checkpoint_dir="c", max_no_progress=2)).script or ""
    plain, told = (re.sub(r" \\\n *", " ", s) for s in (plain, told))  # the same at any interpreter path's length
    assert 'train.py "$@"' not in plain and "--on-restart-append" not in plain and "--checkpoint-dir" not in plain
    assert 'train.py "$@"' in told and "--on-restart-append '--resume {latest:c/*}'" in told, told
    assert "--checkpoint-dir c" in told and "--max-no-progress 2" in told
    assert subprocess.run(["bash", "-n"], input=told, text=True).returncode == 0


def test_the_health_gate_names_a_held_port_and_an_unwritable_job_dir(tmp_path: Path) -> None:
    """The node side runs for real here (the local allocation's on_nodes runs the argv on this machine)."""
    local = get_scheduler("local").allocation_of("x", {})
    held = socket.socket()
    held.bind(("", 0))
    held.listen(1)
    port = held.getsockname()[1]
    try:
        bad = gate(local.on_nodes, ["localhost"], str(tmp_path), port, gpus=False)
    finally:
        held.close()
    assert bad == {"localhost": f"rendezvous port {port} in use on the node (a leftover process holds it)"}
    assert gate(local.on_nodes, ["localhost"], str(tmp_path), port, gpus=False) == {}
    assert "not writable from the node" in check_here(str(tmp_path / "gone"), port, gpus=False)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".health")]  # its probe file is gone


def test_the_health_gate_excludes_a_node_that_does_not_answer_and_no_one_when_none_does(tmp_path: Path) -> None:
    def one_answers(argv: object, nodes: object) -> list[str]:  # only n1's copy prints (n2's node hangs)
        return ["bash", "-c", 'echo \'{"node": "n1", "fail": ""}\'; sleep 30']

    assert gate(one_answers, ["n1", "n2"], str(tmp_path), 1, gpus=False, timeout=1.0) == {
        "n2": "no answer from the health check within 1s"}
    with pytest.raises(RuntimeError, match="no node answered"):
        gate(lambda argv, nodes: ["false"], ["n1", "n2"], str(tmp_path), 1, gpus=False, timeout=1.0)


def test_with_no_spare_left_the_job_goes_on_with_the_nodes_that_are_left(tmp_path: Path) -> None:
    """Issue 67: 3 nodes, --min-nodes 2. The third node dies during attempt 0; attempt 1 runs on the two that
    are left, told so by its environment (the launch's --nodes/--ntasks, torchrun's --nnodes, mpirun's -np)."""
    listeners: list[socket.socket] = []
    for host in ("127.0.0.1", "127.0.0.2", "127.0.0.3"):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((host, listeners[0].getsockname()[1] if listeners else 0))
        s.listen(4)
        listeners.append(s)
    port = listeners[0].getsockname()[1]
    go, seen = tmp_path / "go", tmp_path / "seen"
    step = (f'() {{ echo "$TORCHHPC_RESTART_COUNT $TORCHHPC_STEP_NODES $TORCHHPC_STEP_NNODES $TORCHHPC_STEP_NTASKS" >> {seen}; '
            f'[ "$TORCHHPC_RESTART_COUNT" = 0 ] || exit 0; while [ ! -e {go} ]; do sleep 0.05; done; exit 1; }}')
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "127.0.0.[1-3]",
           "TORCHHPC_STOP_FILE": str(tmp_path / "stop"), "BASH_FUNC__torchhpc_step%%": step}
    slurm = _Slurm(["127.0.0.1", "127.0.0.2", "127.0.0.3"], port)
    opts = Options(job_dir=str(tmp_path), nodes=3, nproc_per_node=2, launcher="srun", max_restarts=2,
                   probe_every=60.0, min_nodes=2, health=False)

    def node_dies() -> None:
        time.sleep(1.0)
        listeners.pop().close()  # 127.0.0.3 dies
        go.touch()

    t = threading.Thread(target=node_dies)
    try:
        t.start()
        code = Supervisor(opts, runner=slurm, env=env).run()
        t.join(30)
    finally:
        for s in listeners:
            s.close()
    assert code == 0
    assert seen.read_text().splitlines() == ["0 127.0.0.1,127.0.0.2,127.0.0.3 3 6", "1 127.0.0.1,127.0.0.2 2 4"]
    tries = load_attempts(str(tmp_path))
    assert [(a["class"], a["world_size"]) for a in tries] == [("node-failure", 6), (None, 4)], tries
    assert "world 4 of 6 (2 ranks, 33 % of the capacity, lost)" in attempt_lines(tries)[1]


def test_below_min_nodes_the_job_ends_as_before() -> None:
    with pytest.raises(SpecError):
        JobSpec(Entrypoint.parse(["t.py"]), nodes=3, min_nodes=2)  # a shrink is a restart: none allowed
    spec = JobSpec(Entrypoint.parse(["t.py"]), nodes=3, min_nodes=2, max_restarts=1, scheduler="slurm",
                   launcher="torchrun")
    script = get_scheduler("slurm").render(spec).script or ""
    assert "--min-nodes 2" in script and "at least 2 when no spare is left" in script
    assert '--nnodes "$TORCHHPC_STEP_NNODES"' in script  # torchrun's node count is the attempt's
    assert parse(["--job-dir", "d", "--nodes", "3", "--min-nodes", "2"]).min_nodes == 2
