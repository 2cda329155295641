"""The supervisor's node probe, driven for real: its loop, its TCP checks, the step it stops.

The "nodes" are loopback addresses (127.0.0.1, .2, .3), each with a real listener standing for its
slurmd; a node dies when its listener closes. The step is a real bash function in its own session.
Only the Slurm commands the supervisor runs (hostnames, config, squeue, scancel, requeue) are answered
by a fake runner, since a unit test has no controller; tests/integration/test_resilience.py runs the
same loop on the dev cluster.

What proves that the probe found the failure, without a timed assertion: the step would end by itself
only when the test lets it (``go``), and the test never does; it would then leave ``self-ended``.
attempts.json records ``found_by``: ``probe`` (the supervisor stopped the step) or ``step-end``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.test_supervisor import _Slurm  # the same few Slurm answers, recorded
from torchhpc.core.exitcodes import EXIT_CODES
from torchhpc.supervisor import load_attempts
from torchhpc.supervisor.loop import Options, Supervisor

HOSTS = ["127.0.0.1", "127.0.0.2", "127.0.0.3"]


@pytest.fixture
def slurmds() -> Iterator[dict[str, socket.socket]]:
    """One listener per loopback "node", all on the same port (SlurmdPort is one number per cluster)."""
    listeners: dict[str, socket.socket] = {}
    try:
        for host in HOSTS:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, next(iter(listeners.values())).getsockname()[1] if listeners else 0))
            s.listen(8)
            listeners[host] = s
        yield listeners
    finally:
        for s in listeners.values():
            s.close()


def _run(tmp_path: Path, slurmds: dict[str, socket.socket], hosts: list[str], *, max_restarts: int,
         step: str) -> tuple[int, _Slurm]:
    """The supervisor on ``hosts`` (2 used) with a 0.1 s probe; node 127.0.0.2 dies once the step has
    started (its ``started`` marker), while the step still runs."""
    port = next(iter(slurmds.values())).getsockname()[1]
    env = {"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": ",".join(hosts),
           "TORCHHPC_STOP_FILE": str(tmp_path / "stop"), "TORCHHPC_BASE_PORT": "29500",
           "BASH_FUNC__torchhpc_step%%": step}
    slurm = _Slurm(hosts, port)
    opts = Options(job_dir=str(tmp_path), nodes=2, nproc_per_node=1, launcher="srun", max_restarts=max_restarts,
                   probe_every=0.1, misses=2)
    started = tmp_path / "started-0"

    def node_dies() -> None:
        while not started.exists():  # bounded by the step: it makes the file first
            time.sleep(0.02)
        slurmds["127.0.0.2"].close()

    t = threading.Thread(target=node_dies, daemon=True)
    t.start()
    rc = Supervisor(opts, runner=slurm, env=env).run()
    t.join(30)
    return rc, slurm


def _step(tmp_path: Path, then: str) -> str:
    """Attempt N: writes started-N and its MASTER_PORT; attempt 0 then waits for ``go`` (never made) for up
    to 60 s and leaves ``self-ended``: only a supervisor that stops it ends it early. Later attempts: ``then``."""
    d = tmp_path
    return (f'() {{ echo "$MASTER_PORT" > {d}/port-$TORCHHPC_RESTART_COUNT; touch {d}/started-$TORCHHPC_RESTART_COUNT; '
            f'if [ "$TORCHHPC_RESTART_COUNT" = 0 ]; then '
            f'for i in $(seq 1200); do [ -e {d}/go ] && break; sleep 0.05; done; touch {d}/self-ended; exit 1; fi; '
            f'{then}; }}')


def test_the_probe_stops_the_step_and_the_next_attempt_runs_on_the_spare(
        tmp_path: Path, slurmds: dict[str, socket.socket]) -> None:
    rc, slurm = _run(tmp_path, slurmds, HOSTS, max_restarts=1, step=_step(tmp_path, "exit 0"))
    assert rc == 0
    tries = load_attempts(str(tmp_path))
    assert [(a["class"], a["found_by"], a["nodes"], a["excluded"]) for a in tries] == [
        ("node-failure", "probe", ["127.0.0.1", "127.0.0.2"], ["127.0.0.2"]),
        (None, "", ["127.0.0.1", "127.0.0.3"], ["127.0.0.2"]),
    ], tries
    assert not (tmp_path / "self-ended").exists()  # the supervisor ended attempt 0, not the step itself
    ports = [(tmp_path / f"port-{n}").read_text().strip() for n in (0, 1)]
    assert ports[0] != ports[1], ports  # the rendezvous moves: a dead attempt's socket may linger
    assert ["squeue", "-h", "-s", "-j", "7", "-o", "%i %j"] in slurm.calls  # its job steps were looked for


def test_no_spare_and_no_requeue_ends_the_job_as_a_node_failure(
        tmp_path: Path, slurmds: dict[str, socket.socket]) -> None:
    rc, slurm = _run(tmp_path, slurmds, HOSTS[:2], max_restarts=1, step=_step(tmp_path, "exit 0"))
    assert rc == EXIT_CODES["node-failure"]  # the class-coded exit (core/exitcodes.py)
    tries = load_attempts(str(tmp_path))
    assert [(a["class"], a["found_by"]) for a in tries] == [("node-failure", "probe")], tries
    assert not (tmp_path / "started-1").exists() and not (tmp_path / "self-ended").exists()
    assert not [c for c in slurm.calls if c[:2] == ["scontrol", "requeue"]], slurm.calls
