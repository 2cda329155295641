"""Say where a job goes (issue 26, item 2; docs/slurm-target.md), against the real dev cluster.

Without a site configuration ($SLURM_CONF unset, no /etc/slurm/slurm.conf) the running dev cluster
takes the job, and ``run``, ``shell`` and ``bench`` say so in one stderr line that ``--json``
carries too; with a site configuration (here: $SLURM_CONF, pointed at the same cluster's file so
that the job can still run) nothing is said and the JSON's ``target`` is null.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, missing
from torchhpc.schedulers.slurm import site as site_mod

pytestmark = pytest.mark.cluster("slurm")
PI = str(REPO / "examples" / "pi.py")
LINE = "torchhpc: Slurm target: the torchhpc dev cluster"


def cli(*args: str, site_conf: str | None, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_CONF",) and not k.startswith("TORCHHPC_")}
    env.update(HOME=str(cwd), TORCHHPC_STATE_DIR=str(cwd / "state"), PYTHONPATH=str(REPO / "src"))
    if site_conf:
        env["SLURM_CONF"] = site_conf
    return subprocess.run([sys.executable, "-m", "torchhpc", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=240)


@pytest.fixture(autouse=True)
def _no_site_conf() -> None:
    if any(os.path.exists(p) for p in site_mod.SITE_CONFS):
        missing("this machine has a site slurm.conf: the dev cluster never stands in for it here")


def test_dev_cluster_is_named_once_on_stderr_and_in_json(slurm_cluster: Any, tmp_path: Path) -> None:
    conf = slurm_cluster.client_env()["SLURM_CONF"]
    # a dry run: the render only on the screen, the target in its JSON
    dry = cli("run", "--scheduler", "slurm", "--dry-run", PI, site_conf=None, cwd=tmp_path)
    assert dry.returncode == 0 and "Slurm target" not in dry.stderr, dry.stderr
    js = cli("run", "--scheduler", "slurm", "--dry-run", "--json", PI, site_conf=None, cwd=tmp_path)
    assert json.loads(js.stdout)["target"].startswith("Slurm target: the torchhpc dev cluster")

    # a real job: it went to the dev cluster, said so in one stderr line, and the JSON after --wait carries it
    real = cli("run", "--scheduler", "slurm", "--nodes", "1", "--json", "--wait", "--output-dir", str(tmp_path),
               PI, "--steps", "10000", site_conf=None, cwd=tmp_path)
    assert real.returncode == 0, real.stdout + real.stderr
    status = json.loads(real.stdout.strip().splitlines()[-1])
    assert status["state"] == "COMPLETED" and conf in status["target"]
    lines = [ln for ln in real.stderr.splitlines() if "Slurm target" in ln]
    assert len(lines) == 1 and lines[0].startswith(LINE) and conf in lines[0], real.stderr

    # bench nodes on 2 dev-cluster nodes: the line once, and its --json file carries it
    out = tmp_path / "bench.json"
    b = cli("bench", "nodes", "--scheduler", "slurm", "--nodes", "2", "--budget", "120", "--out", str(tmp_path / "bn"),
            "--json", str(out), site_conf=None, cwd=tmp_path)
    assert b.stderr.count(LINE) == 1, b.stdout + b.stderr
    assert conf in json.loads(out.read_text())["target"], b.stdout + b.stderr


def test_site_configuration_wins_and_nothing_is_said(slurm_cluster: Any, tmp_path: Path) -> None:
    site = slurm_cluster.client_env()["SLURM_CONF"]  # "the site's" file: the clients still reach a cluster
    dry = cli("run", "--scheduler", "slurm", "--dry-run", "--json", PI, site_conf=site, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "Slurm target" not in dry.stderr and json.loads(dry.stdout)["target"] is None
    local = cli("run", "--dry-run", PI, site_conf=None, cwd=tmp_path)
    assert local.returncode == 0 and "Slurm target" not in local.stderr


def test_site_conf_file_wins_over_a_running_dev_cluster(slurm_cluster: Any, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The other way a site says it has Slurm: a slurm.conf in the default place (a stand-in path here)."""
    from torchhpc.config import _devcluster_env
    from torchhpc.schedulers import SITE_ENV

    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.setitem(SITE_ENV, "slurm", [_devcluster_env])
    assert site_mod.dev_target() is not None  # the dev cluster is up, and would be used
    fake = tmp_path / "slurm.conf"
    fake.write_text("ClusterName=site\n")
    monkeypatch.setattr(site_mod, "SITE_CONFS", (str(fake),))
    assert site_mod.dev_target() is None
    assert site_mod.site_env() is None  # the clients run as they are, against the site
