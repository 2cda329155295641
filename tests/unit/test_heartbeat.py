"""The ranks' heartbeats (boot/sitecustomize.py -> supervisor/liveness.py): a lost node found by its silence
and one probe, and a silent node that still answers the probe never failed.

Real parts: the rank boot runs in real Python processes (PYTHONPATH = the boot directory, as the task shim
sets it), their datagrams reach the supervisor's real UDP socket, the "nodes" are loopback addresses whose
slurmd is a real listener (tests/unit/test_supervisor_probe.py's harness), and the step is a real bash
function. Only the controller's few answers are recorded (``_Slurm``). A node's ranks name it with
``SLURMD_NODENAME``, as srun's tasks do.

What proves the heartbeats found the loss, with no timed assertion: the probe's own interval is 60 s, so the
probe rule cannot have found it, and the step would end by itself only after 60 s.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.unit.test_supervisor import _Slurm
from tests.unit.test_supervisor_probe import HOSTS, slurmds  # noqa: F401 (a fixture)
from torchhpc.boot import sitecustomize as boot
from torchhpc.launchers.boot import BOOT_DIR
from torchhpc.supervisor import load_attempts
from torchhpc.supervisor.liveness import BEAT_EVERY, HEARTBEAT_VAR, Heartbeats, Liveness
from torchhpc.supervisor.loop import Options, Supervisor


def test_the_boot_and_the_supervisor_use_the_same_names() -> None:
    assert (boot.HEARTBEAT_VAR, boot.HEARTBEAT_EVERY) == (HEARTBEAT_VAR, BEAT_EVERY)


def _rank(node: str, address: str, pid_file: Path) -> subprocess.Popen[bytes]:
    """A Python "rank" of ``node`` with the boot on its path, as the task shim starts one; it sleeps."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": BOOT_DIR, HEARTBEAT_VAR: address, "SLURMD_NODENAME": node}
    return subprocess.Popen([sys.executable, "-c", f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid()));"
                             " time.sleep(120)"], env=env)


def test_a_booted_rank_beats_and_a_stopped_one_falls_silent(tmp_path: Path) -> None:
    beats = Heartbeats("127.0.0.1")
    rank = _rank("nodeX", beats.address, tmp_path / "pid")
    try:
        deadline = time.monotonic() + 60
        while "nodeX" not in beats.last:
            assert time.monotonic() < deadline, "no heartbeat from the booted rank in 60 s"
            beats.wait(0.05)
        assert beats.silent(["nodeX", "nodeY"], time.time(), after=30) == []  # heard now; nodeY never heard
        rank.send_signal(signal.SIGSTOP)
        beats.wait(3 * BEAT_EVERY)
        heard = beats.last["nodeX"]
        assert beats.silent(["nodeX", "nodeY"], heard + 1.0, after=0.6) == ["nodeX"]
    finally:
        rank.kill()
        rank.wait()
        beats.close()


class _Alloc:
    def __init__(self, answers: dict[str, bool]) -> None:
        self.answers, self.asked = answers, list[str]()

    def alive(self, node: str, timeout: float = 2.0) -> bool:
        self.asked.append(node)
        return self.answers[node]


def test_silence_is_probed_once_and_only_a_failed_probe_confirms(tmp_path: Path) -> None:
    beats = Heartbeats("127.0.0.1")
    try:
        alloc = _Alloc({"n1": True, "n2": True, "n3": False})
        live = Liveness(alloc, ["n1", "n2", "n3"], probe_every=60, misses=2, probe_timeout=1.0, beats=beats, now=100.0)
        beats.last.update(n1=100.0, n2=100.0)  # n3 never heard: only the probe's own rule (not due) speaks for it
        assert live.dead(100.3) == ([], "") and alloc.asked == []
        assert live.dead(101.0) == ([], "") and sorted(alloc.asked) == ["n1", "n2"]  # silent, but they answer
        assert beats.last == {"n1": 101.0, "n2": 101.0}  # busy, not dead: the silence counts again from here
        alloc.answers["n2"] = False
        assert live.dead(101.7) == (["n2"], "heartbeat")
    finally:
        beats.close()


def _step(tmp_path: Path) -> str:
    """Attempt 0: one sleeping rank per step node (the boot beats for it), then waits up to 60 s for ``go``
    and ends well; attempt 1 ends at once. Each rank's pid in ``rank-NODE``."""
    d = tmp_path
    rank = (f'SLURMD_NODENAME=$h PYTHONPATH={BOOT_DIR} {sys.executable} -c "import os, time; '
            f"open('{d}/rank-' + os.environ['SLURMD_NODENAME'], 'w').write(str(os.getpid())); time.sleep(120)\" &")
    return (f'() {{ touch {d}/started-$TORCHHPC_RESTART_COUNT; [ "$TORCHHPC_RESTART_COUNT" = 0 ] || exit 0; '
            f'for h in ${{TORCHHPC_STEP_NODES//,/ }}; do {rank} done; '
            f'for i in $(seq 1200); do [ -e {d}/go ] && break; sleep 0.05; done; touch {d}/self-ended; exit 0; }}')


def _supervise(tmp_path: Path, slurmds: dict[str, socket.socket], event: threading.Thread) -> int:  # noqa: F811
    port = next(iter(slurmds.values())).getsockname()[1]
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": ",".join(HOSTS),
           "TORCHHPC_STOP_FILE": str(tmp_path / "stop"), "TORCHHPC_BASE_PORT": "29500",
           "BASH_FUNC__torchhpc_step%%": _step(tmp_path)}
    opts = Options(job_dir=str(tmp_path), nodes=2, nproc_per_node=1, launcher="srun", max_restarts=1,
                   probe_every=60.0, misses=2)
    event.start()
    try:
        return Supervisor(opts, runner=_Slurm(HOSTS, port), env=env).run()
    finally:
        event.join(120)
        for pid in tmp_path.glob("rank-*"):
            try:
                os.kill(int(pid.read_text()), signal.SIGKILL)
            except (ValueError, ProcessLookupError):
                pass


def _ranks_of(tmp_path: Path, nodes: list[str]) -> list[int]:
    """The pids of the ranks on ``nodes``, once each has started (bounded by the step: it starts them)."""
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"rank-{h}").is_file() and (tmp_path / f"rank-{h}").read_text() for h in nodes):
        assert time.monotonic() < deadline, "the step's ranks did not start"
        time.sleep(0.05)
    return [int((tmp_path / f"rank-{h}").read_text()) for h in nodes]


def test_a_lost_node_is_found_by_its_silence_not_the_probe(tmp_path: Path,
                                                           slurmds: dict[str, socket.socket]) -> None:  # noqa: F811
    def node_dies() -> None:
        [pid] = _ranks_of(tmp_path, ["127.0.0.2"])
        time.sleep(1.0)  # heard for a while
        slurmds["127.0.0.2"].close()  # its slurmd and its rank go together, as a node does
        os.kill(pid, signal.SIGKILL)

    rc = _supervise(tmp_path, slurmds, threading.Thread(target=node_dies, daemon=True))
    assert rc == 0
    tries = load_attempts(str(tmp_path))
    assert [(a["class"], a["found_by"], a["excluded"]) for a in tries] == [
        ("node-failure", "heartbeat", ["127.0.0.2"]), (None, "", ["127.0.0.2"])], tries
    assert not (tmp_path / "self-ended").exists()


@pytest.mark.parametrize("stopped", ["127.0.0.2"])
def test_a_silent_node_that_answers_is_not_failed(tmp_path: Path, slurmds: dict[str, socket.socket],  # noqa: F811
                                                  stopped: str) -> None:
    """Its ranks stopped (SIGSTOP: as silent as a rank starved at load 30) while its slurmd answers: the step
    goes on, and ends by itself."""
    def starve_then_end() -> None:
        [pid] = _ranks_of(tmp_path, [stopped])
        os.kill(pid, signal.SIGSTOP)
        time.sleep(3.0)  # five silences' worth: each probed, each cleared
        (tmp_path / "go").touch()

    rc = _supervise(tmp_path, slurmds, threading.Thread(target=starve_then_end, daemon=True))
    tries = load_attempts(str(tmp_path))
    assert [(a["class"], a["found_by"]) for a in tries] == [(None, "")], tries
    assert rc == 0 and (tmp_path / "self-ended").exists()  # the step ended itself: never stopped as a node loss
