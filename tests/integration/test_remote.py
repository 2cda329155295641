"""``--remote`` against the dev cluster's login node: a real sshd, a real second Unix user, real Slurm.

The cluster must be up with ``--login --login-user thpcremote`` (scripts/test.sh does it). The
submitting side is this process's user (root) with its own home; the login node's user is
``thpcremote``, whose home holds the shipped code, the job records and the job directories. That
user runs this checkout's torchhpc and torch through a venv of its own whose ``.pth`` adds this
checkout's site-packages: root's Python lives under /root, which no other user can enter.

One ssh master connection serves the whole module: every test shares one private ControlPath
directory, and the last test counts sshd's "Accepted publickey" lines.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, missing
from torchhpc.devcluster import ClusterState
from torchhpc.devcluster.login import host_alias, render_ssh_config

pytestmark = pytest.mark.cluster("slurm")

USER = "thpcremote"
VENV = f"/home/{USER}/.thpc-venv"
CMD = [sys.executable, "-m", "torchhpc"]


class Remote:
    def __init__(self, host: str, env: dict[str, str], sshd_log: str, repo: Path) -> None:
        self.host, self.env, self.sshd_log, self.repo = host, env, sshd_log, repo
        self.accepted_before = self.accepted()

    def accepted(self) -> int:
        with open(self.sshd_log) as f:
            return sum(f"Accepted publickey for {USER}" in line for line in f)

    def torchhpc(self, *args: str, check: bool = True, env: dict[str, str] | None = None,
                 timeout: float = 300) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*CMD, *args], cwd=self.repo, env={**self.env, **(env or {})}, capture_output=True,
                              text=True, timeout=timeout)
        if check:
            assert done.returncode == 0, f"{args}: rc={done.returncode}\n{done.stdout}\n{done.stderr}"
        return done

    def submit(self, *args: str) -> tuple[str, str]:
        """(handle, the shipped/already-there line) of a `run --remote` without --wait."""
        done = self.torchhpc("run", "--remote", self.host, *args)
        handle = re.search(r"Submitted (\S+) on ", done.stdout)
        assert handle, done.stdout + done.stderr
        ship = [line for line in done.stderr.splitlines() if line.startswith(("Shipped", "Code already"))]
        return handle.group(1), ship[0]


def _user_venv(cluster: ClusterState, acl: list[tuple[Path, bool]]) -> None:
    """A venv of the login user's own (system python, same minor version) that sees this checkout's packages.
    Each directory given an ACL entry for the login user is appended to ``acl``, with whether it had an
    extended ACL before (the fixture then removes that entry, or the whole extended ACL it made)."""
    site = sysconfig.get_paths()["purelib"]
    ver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not os.path.exists(f"/usr/bin/{ver}"):
        missing(f"/usr/bin/{ver} (the login user's Python, same minor version as this venv) is not installed")
    probe = ["runuser", "-u", USER, "--", "test", "-r", os.path.join(site, "torch", "__init__.py")]
    if subprocess.run(probe, timeout=60).returncode != 0 and shutil.which("setfacl"):
        # A checkout under a private directory (root's home): let this one user pass through each
        # parent (execute only, nothing listed or read), as an ACL entry that names it alone.
        for parent in reversed(Path(site).parents):
            if not os.stat(parent).st_mode & 0o001:
                had = subprocess.run(["getfacl", "--skip-base", "--absolute-names", str(parent)],
                                     capture_output=True, text=True, timeout=30).stdout.strip()
                subprocess.run(["setfacl", "-m", f"u:{USER}:x", str(parent)], check=True, timeout=30)
                acl.append((parent, bool(had)))
    if subprocess.run(probe, timeout=60).returncode != 0:
        missing(f"{USER} cannot read {site} (a parent directory is private): check out the repository "
                "where other users may enter")
    script = (f"test -x {VENV}/bin/python || /usr/bin/{ver} -m venv --without-pip {VENV} && "
              f"echo 'import site; site.addsitedir(\"{site}\")' > {VENV}/lib/{ver}/site-packages/thpc-dev.pth")
    subprocess.run(["runuser", "-u", USER, "--", "sh", "-c", script], check=True, timeout=120)


@pytest.fixture(scope="module")
def remote(slurm_cluster: ClusterState) -> Iterator[Remote]:
    if not slurm_cluster.login_ip or USER not in slurm_cluster.login_users:
        missing(f"the dev cluster has no login node for {USER}: "
                f"`torchhpc devcluster up --nodes 4 --cpus-per-node 12 --accounting --login --login-user {USER}`")
    acl: list[tuple[Path, bool]] = []
    try:
        yield from _remote(slurm_cluster, acl)
    finally:  # the host's ACLs as before: the entries _user_venv added, removed (with the mask they made)
        for parent, had in acl:
            undo = ["setfacl", "-x", f"u:{USER}"] if had else ["setfacl", "-b"]
            subprocess.run([*undo, str(parent)], check=False, timeout=30)


def _fresh_records() -> None:
    """The login user's job records and job directories of earlier dev clusters, removed.

    A new dev cluster (a new state directory) gives job ids from 1 again, so an earlier run's
    ``~/.torchhpc/jobs/pi-497`` or record ``slurm-497`` would meet this run's job 497: the product
    refuses to write into a job directory it did not make (by design), and the test would fail by
    chance. This user exists for these tests alone; its venv and its shipped code stay.
    """
    home = Path(f"/home/{USER}")
    for old in (home / ".torchhpc" / "jobs", home / ".cache" / "torchhpc"):
        shutil.rmtree(old, ignore_errors=True)


def _remote(slurm_cluster: ClusterState, acl: list[tuple[Path, bool]]) -> Iterator[Remote]:
    _user_venv(slurm_cluster, acl)
    _fresh_records()
    work = Path(tempfile.mkdtemp(prefix="thpc-remote-test-"))
    conf = work / "ssh_config"
    conf.write_text(render_ssh_config(slurm_cluster._layout(), USER))
    ctl = work / "ctl"
    ctl.mkdir(mode=0o700)
    repo = work / "checkout"
    (repo / "examples").mkdir(parents=True)
    shutil.copy(REPO / "examples" / "pi.py", repo / "examples" / "pi.py")
    (repo / "examples" / "marker.py").write_text("print('MARK-A')\n")
    (repo / ".env").write_text("SECRET=1\n")  # never ships (built-in ignore)
    # The code directory there is named by content: a fresh tree each run, or the last run's copy is found.
    (repo / "nonce.txt").write_text(f"{uuid.uuid4()}\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "examples", "nonce.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "pi"], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHHPC_")}
    env.update(TORCHHPC_SSH_CONFIG=str(conf), TORCHHPC_SSH_CONTROL_DIR=str(ctl),
               TORCHHPC_REMOTE_COMMAND=f"{VENV}/bin/python -m torchhpc", TORCHHPC_STATE_DIR=str(work / "state"))
    r = Remote(host_alias(slurm_cluster._layout()), env, os.path.join(slurm_cluster.state_dir, "log", "sshd.out"),
               repo)
    yield r
    subprocess.run(["ssh", "-F", str(conf), "-o", f"ControlPath={ctl}/%C", "-O", "exit", r.host], capture_output=True)
    shutil.rmtree(work, ignore_errors=True)


def test_run_wait_ships_a_git_checkout_and_runs_2x2(remote: Remote) -> None:
    done = remote.torchhpc("run", "--remote", remote.host, "--scheduler", "slurm", "--nodes", "2",
                           "--nproc-per-node", "2", "examples/pi.py", "--wait")
    assert re.search(r"Shipped \d+ files", done.stderr), done.stderr
    ranks = set(re.findall(r"rank (\d)/4 on (node\d)", done.stdout))
    assert {r for r, _n in ranks} == {"0", "1", "2", "3"} and len({n for _r, n in ranks}) == 2, done.stdout
    assert "pi ≈ 3.14159" in done.stdout


def test_job_runs_the_shipped_copy_and_same_tree_ships_nothing(remote: Remote) -> None:
    t0 = time.monotonic()
    first, line = remote.submit("--scheduler", "slurm", "--launcher", "srun", "examples/marker.py")
    t_first = time.monotonic() - t0
    assert line.startswith("Code already on"), line  # the tree the previous test shipped
    print(f"\nsecond submit of the same tree: {t_first:.2f} s, {line}")
    marker = remote.repo / "examples" / "marker.py"
    marker.write_text("print('MARK-B')\n")  # after the submit: the job must not see it
    remote.torchhpc("wait", first, "--remote", remote.host, timeout=180)
    assert "MARK-A" in remote.torchhpc("logs", first, "--remote", remote.host).stdout
    # The edit is an uncommitted change: it ships as a patch into a new directory and runs there.
    second, line = remote.submit("--scheduler", "slurm", "--launcher", "srun", "examples/marker.py")
    assert line.startswith("Shipped"), line
    remote.torchhpc("wait", second, "--remote", remote.host, timeout=180)
    assert "MARK-B" in remote.torchhpc("logs", second, "--remote", remote.host).stdout
    refused = remote.torchhpc("run", "--remote", remote.host, "--ship", "committed", "--scheduler", "slurm",
                              "examples/marker.py", check=False)
    assert refused.returncode == 2 and "uncommitted changes (examples/marker.py)" in refused.stderr
    assert "HINT:" in refused.stderr


def test_status_logs_rank_diagnose_cancel(remote: Remote) -> None:
    sleeper = remote.repo / "examples" / "sleeper.py"
    sleeper.write_text("import os, time\nprint('rank', os.environ.get('RANK'), flush=True)\ntime.sleep(300)\n")
    handle, _line = remote.submit("--scheduler", "slurm", "--nodes", "2", "--nproc-per-node", "1",
                                  "--launcher", "srun", "examples/sleeper.py")
    try:
        deadline = time.monotonic() + 120
        while not all(f"rank {r}" in remote.torchhpc("logs", handle, "--remote", remote.host, check=False).stdout
                      for r in (0, 1)):
            assert time.monotonic() < deadline, "the ranks never printed"
            time.sleep(2)
        one = remote.torchhpc("logs", handle, "--remote", remote.host, "--rank", "1").stdout
        assert "rank 1" in one and "rank 0" not in one, one  # rank 1's line, and none of rank 0's
        assert "RUNNING" in remote.torchhpc("status", handle, "--remote", remote.host).stdout
        diag = remote.torchhpc("diagnose", handle, "--remote", remote.host, check=False)
        assert "evidence:" in diag.stdout, diag.stdout + diag.stderr
        assert f"Cancelled {handle}" in remote.torchhpc("cancel", handle, "--remote", remote.host).stdout
        deadline = time.monotonic() + 60
        while "CANCELLED" not in remote.torchhpc("status", handle, "--remote", remote.host, check=False).stdout:
            assert time.monotonic() < deadline
            time.sleep(1)
    finally:  # an assertion above must not leave the sleeper queued
        remote.torchhpc("cancel", handle, "--remote", remote.host, check=False)


def test_pbs_renders_and_submits_over_the_same_ssh(remote: Remote) -> None:
    """No PBS server can be installed here (shared/README.md), so a stand-in ``qsub`` on the login
    node's PATH keeps the script it is given and answers a PBS job id; everything before it (ssh,
    shipping, the remote torchhpc's PBS render and submit) is the real path."""
    stub = Path(tempfile.mkdtemp(prefix="thpc-qsub-", dir="/var/tmp"))
    stub.chmod(0o755)
    # qsub's working directory is PBS_O_WORKDIR, where the script cd's: the stand-in keeps it too.
    (stub / "qsub").write_text(f'#!/bin/sh\ncp "$1" {stub}/got.pbs\npwd > {stub}/cwd\necho 4242.pbs-server\n')
    (stub / "qsub").chmod(0o755)
    for name in ("got.pbs", "cwd"):
        (stub / name).touch()
        (stub / name).chmod(0o666)
    try:
        cmd = f"env PATH={stub}:/usr/bin:/bin {VENV}/bin/python -m torchhpc"
        done = remote.torchhpc("run", "--remote", remote.host, "--scheduler", "pbs", "--nodes", "2",
                               "--nproc-per-node", "2", "--json", "examples/pi.py",
                               env={"TORCHHPC_REMOTE_COMMAND": cmd})
        assert '"handle": "pbs:4242.pbs-server"' in done.stdout and f'"remote": "{remote.host}"' in done.stdout
        script = (stub / "got.pbs").read_text()
        assert "#PBS -l select=2" in script
        assert 'cd "${PBS_O_WORKDIR:-.}"' in script and "examples/pi.py" in script
        assert re.fullmatch(rf"/home/{USER}/\.torchhpc/code/[0-9a-f]{{24}}\n", (stub / "cwd").read_text())
    finally:
        shutil.rmtree(stub, ignore_errors=True)


def test_one_ssh_master_served_the_module(remote: Remote) -> None:
    """Runs last (file order): every command above went through one authenticated connection."""
    assert remote.accepted() - remote.accepted_before == 1
