"""``bench nodes`` on the real 4-node dev cluster: healthy, one degraded link, excluded, restored.

Real Slurm (sbatch, srun), real gloo between network namespaces, a real ``tc
tbf`` on node3's veth at 1/10 of the link rate iperf3 measures just before
(the rate follows the machine's load, as the pairs' busbw does). One job per
bench run; the whole scenario is one test so the runs happen in order.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PYTHON
from tests.integration.conftest import SlurmClient
from torchhpc.core import hostlist
from torchhpc.devcluster import ClusterState
from torchhpc.devcluster.degrade import restore
from torchhpc.devcluster.netns import netns_path

BUDGET = 180  # seconds, the "<= 3 min on this machine", queue and start-up included
# Healthy pairs on this machine differ by up to 2x from one call to the next (every rank of every
# node shares the same 2 cores with everything else running); node3 degraded to 1/10 of the link
# measures at 0.05-0.3 of the healthy pairs. 0.5 separates the two here; the default 0.7 is for
# nodes with cores of their own.
SLOW_RATIO = "0.5"


def bench(state: ClusterState, out: Path, *extra: str, timeout: float = BUDGET + 60) -> tuple[int, dict[str, Any], str, float]:
    t0 = time.monotonic()
    r = subprocess.run(
        [PYTHON, "-m", "torchhpc", "bench", "nodes", "--scheduler", "slurm", "--nodes", "4",
         "--budget", str(BUDGET), "--slow-ratio", SLOW_RATIO, "--out", str(out), "--json", str(out / "result.json"),
         *extra],
        env=state.client_env(), cwd=out.parent, capture_output=True, text=True, timeout=timeout,
    )
    took = time.monotonic() - t0
    text = r.stdout + r.stderr
    path = out / "result.json"
    return r.returncode, (json.loads(path.read_text()) if path.exists() else {}), text, took


def not_pass(report: dict[str, Any], section: str) -> list[tuple[str, str, str]]:
    return [(r["node"], r["check"], r["verdict"]) for r in report["rows"] if r["section"] == section
            and r["verdict"] != "PASS"]


def link_rate(state: ClusterState) -> float:
    """iperf3 node2 -> node1, the best of three 1-s runs, bits per second (load only lowers it)."""
    return max(_iperf(state) for _ in range(3))


def _iperf(state: ClusterState) -> float:
    port = "5201"
    server = subprocess.Popen(["nsenter", "--net=" + netns_path(state.netns("node1")), "iperf3", "-s", "-1", "-p", port],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(20):
            time.sleep(0.25)
            done = subprocess.run(["nsenter", "--net=" + netns_path(state.netns("node2")), "iperf3", "-c",
                                   state.node_ip("node1"), "-p", port, "-t", "1", "-J"],
                                  capture_output=True, text=True, timeout=30)
            if done.returncode == 0:
                return float(json.loads(done.stdout)["end"]["sum_received"]["bits_per_second"])
        raise AssertionError(f"iperf3 never connected: {done.stdout[-300:]} {done.stderr[-300:]}")
    finally:
        server.kill()
        server.wait()


@pytest.mark.cluster("slurm")
def test_bad_input_is_one_line_with_a_hint(slurm_cluster: ClusterState, tmp_path: Path) -> None:
    for extra, message in ((["--nodelist", "node[3,9]"], "node9 is not a node of this cluster"),
                           (["--nodes", "4", "--budget", "20"], "--budget 20s is too small for 4 nodes"),
                           (["--nodes", "9"], "this cluster has 4 nodes")):
        r = subprocess.run([PYTHON, "-m", "torchhpc", "bench", "nodes", "--scheduler", "slurm", *extra,
                            "--out", str(tmp_path)], env=slurm_cluster.client_env(), cwd=tmp_path,
                           capture_output=True, text=True, timeout=120)
        err = r.stderr.strip().splitlines()
        assert r.returncode == 2 and len(err) == 2, r.stdout + r.stderr
        assert err[0].startswith("Error: ") and message in err[0] and err[1].startswith("HINT: "), r.stderr
    assert not list(tmp_path.glob("*.sbatch")), "nothing may be submitted on bad input"


@pytest.mark.exclusive  # degrades node3's link and measures every pair
@pytest.mark.cluster("slurm")
def test_healthy_then_degraded_node3_is_named_excluded_and_restored(
    slurm_cluster: ClusterState, slurm: SlurmClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert len(slurm_cluster.nodes) >= 4, "bring the dev cluster up with --nodes 4 (scripts/test.sh does)"
    figures: list[str] = []

    # 1. no fault: all PASS
    rc, report, text, took = bench(slurm_cluster, tmp_path / "healthy")
    assert rc == 0, text
    assert report["nodes"] == ["node1", "node2", "node3", "node4"] and report["exclude"] == []
    assert not_pass(report, "node") == [] and not_pass(report, "pairwise") == [], text
    assert [p["pair"] for p in report["pairs"] if p["stage"] == "ring"] == [
        ["node1", "node2"], ["node3", "node4"], ["node2", "node3"], ["node4", "node1"]]
    healthy = sorted(p["busbw"] for p in report["pairs"] if p["stage"] == "ring")
    figures.append(f"healthy: ring busbw {healthy} GB/s, {took:.0f}s")

    # 2. node3's link at 1/10 of the measured rate: node3, and only node3, is SLOW in the pairwise section
    rate = link_rate(slurm_cluster)
    limit = f"{max(1, int(rate / 10 / 1e6))}mbit"
    cli = [PYTHON, "-m", "torchhpc", "devcluster", "degrade", "--state-dir", slurm_cluster.state_dir, "node3",
           "--rate", limit]
    r = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "node3: link limited" in r.stdout, r.stdout + r.stderr
    try:
        exclude = tmp_path / "bad.txt"
        rc, report, text, took = bench(slurm_cluster, tmp_path / "degraded", "--exclude-file", str(exclude))
        figures.append(f"link {rate / 1e9:.2f} Gbit/s, degraded to {limit}: pairs "
                       f"{[(p['pair'], round(p['busbw'] or 0, 3), p['stage']) for p in report.get('pairs', [])]}, "
                       f"{took:.0f}s")
        assert rc == 1, text
        assert not_pass(report, "pairwise") == [("node3", "pair busbw", "SLOW")], text
        assert took <= BUDGET, f"{took:.0f}s > budget {BUDGET}s\n{text}"
        error = text.splitlines()[-2]
        assert error.startswith("Error: SLOW or FAIL: ") and "node3" in error, text
        # The pairwise section names node3 alone; the per-node checks (CPU-bound on a machine shared
        # with other work) are asserted in the healthy and restored runs.
        excluded = [line for line in exclude.read_text().splitlines() if not line.startswith("#")]
        assert "node3" in excluded, excluded

        # 3. the next job keeps node3 out
        n = str(4 - len(excluded))
        r = subprocess.run([PYTHON, "-m", "torchhpc", "run", "--scheduler", "slurm", "--nodes", n, "--json",
                            "--exclude", f"@{exclude}", "--output-dir", str(tmp_path), "--", "hostname"],
                           env=slurm_cluster.client_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        job_id = json.loads(r.stdout)["job_id"]
        assert hostlist.expand(slurm.job(job_id).get("ExcNodeList", "")) == excluded
        fields = slurm.wait(job_id, timeout=120)
        assert fields["JobState"] == "COMPLETED", fields
        ran = hostlist.expand(fields["NodeList"])
        assert "node3" not in ran and len(ran) == int(n), fields
    finally:
        r = subprocess.run([PYTHON, "-m", "torchhpc", "devcluster", "restore", "--state-dir", slurm_cluster.state_dir,
                            "node3"], capture_output=True, text=True, timeout=60)
        restore(slurm_cluster, "node3")  # a no-op after the command above; sure even if it failed
    assert r.returncode == 0 and "node3: link restored" in r.stdout, r.stdout + r.stderr

    # 4. restored: all PASS again
    rc, report, text, took = bench(slurm_cluster, tmp_path / "restored")
    assert rc == 0, text
    assert not_pass(report, "node") == [] and not_pass(report, "pairwise") == [], text
    figures.append(f"restored: ring busbw {sorted(p['busbw'] for p in report['pairs'] if p['stage'] == 'ring')}, "
                   f"{took:.0f}s")
    with capsys.disabled():
        print("\n  bench nodes: " + "\n  bench nodes: ".join(figures))
