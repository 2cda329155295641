"""Pure parts of the dev cluster: config rendering, wrappers, state file, process records.

The wrapper tests run the generated shell scripts through a real ``sh``; only
``nsenter``/``unshare`` are stand-ins (a script on PATH that prints its argv),
because entering a namespace needs root and a running cluster.
"""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes import FakeRunner
from torchhpc.cli.main import main
from torchhpc.devcluster import ClusterState, config, daemons, netns
from torchhpc.devcluster.prepare import binds
from torchhpc.devcluster.state import default_state_dir, read_state
from torchhpc.errors import UsageError

SD = "/var/tmp/torchhpc-devcluster"


@pytest.fixture
def layout() -> config.Layout:
    return config.make_layout(SD, 3)


def conf_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_layout_names_addresses_and_namespaces(layout: config.Layout) -> None:
    assert layout.nodes == ("node1", "node2", "node3")
    assert layout.node_ips == ("10.77.0.11", "10.77.0.12", "10.77.0.13")
    assert layout.controller_ip == "10.77.0.1"
    assert layout.subnet == "10.77.0.0/24"
    assert layout.controller_netns == "torchhpc-ctl"
    assert layout.node_netns("node2") == "torchhpc-node2"
    assert layout.slurm_conf == f"{SD}/etc/slurm.conf"
    assert layout.slurmdbd_conf == f"{SD}/etc/slurmdbd.conf"


def test_other_state_dir_gets_its_own_namespace_prefix(tmp_path: Path) -> None:
    a = config.make_layout(str(tmp_path / "a"), 2)
    b = config.make_layout(str(tmp_path / "b"), 2)
    assert a.netns_prefix != b.netns_prefix
    assert a.netns_prefix.startswith("torchhpc-") and a.netns_prefix != "torchhpc"


@pytest.mark.parametrize("n", [0, -1, config.MAX_NODES + 1])
def test_layout_rejects_bad_node_counts(n: int) -> None:
    with pytest.raises(UsageError, match=f"--nodes {n}"):
        config.make_layout(SD, n)


def test_slurm_conf_essentials(layout: config.Layout) -> None:
    lines = conf_lines(config.render_slurm_conf(layout, accounting=False, real_memory_mb=8000))
    for expected in [
        "ClusterName=torchhpc",
        "SlurmctldHost=ctl(10.77.0.1)",
        "SlurmUser=root",
        f"AuthInfo=socket={SD}/munge/munge.socket,cred_expire=30",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SlurmdParameters=config_overrides",
        "ReturnToService=2",
        "MpiDefault=none",
        f"SlurmdSpoolDir={SD}/spool/slurmd-%n",
        f"TmpFS={SD}/tmp/%n",
        "AccountingStorageType=accounting_storage/none",
        "NodeName=node1 NodeAddr=10.77.0.11 NodeHostname=node1 CPUs=4 RealMemory=8000 State=UNKNOWN",
        "NodeName=node3 NodeAddr=10.77.0.13 NodeHostname=node3 CPUs=4 RealMemory=8000 State=UNKNOWN",
        "PartitionName=debug Nodes=node1,node2,node3 Default=YES MaxTime=INFINITE State=UP",
    ]:
        assert expected in lines
    assert not any(line.startswith("AccountingStorageHost") for line in lines)
    # Every line is Key=Value; an empty value (e.g. AccountingStorageEnforce=) is a parse error.
    for line in lines:
        key, _, value = line.partition("=")
        assert key and value, line


def test_slurm_conf_declares_the_cpus_asked_for(layout: config.Layout) -> None:
    lines = conf_lines(config.render_slurm_conf(layout, accounting=False, real_memory_mb=8000, cpus_per_node=12))
    nodes = [line for line in lines if line.startswith("NodeName=")]
    assert len(nodes) == 3 and all(" CPUs=12 " in line for line in nodes), nodes


@pytest.mark.parametrize("cpus", ["0", "-3", str(config.MAX_CPUS_PER_NODE + 1)])
def test_up_refuses_cpus_per_node_out_of_range_in_one_line(
    cpus: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torchhpc.devcluster.cluster as cluster

    # refused first: before the host (root, Linux), the state dir (too long under xdist) or any package
    monkeypatch.setattr(cluster, "check_host", lambda: pytest.fail("looked at the host"))
    monkeypatch.setattr(cluster, "ensure_packages", lambda *a, **k: pytest.fail("installed packages"))
    rc = main(["devcluster", "up", "--state-dir", str(tmp_path), "--cpus-per-node", cpus])
    err = capsys.readouterr().err
    assert rc == 2 and f"--cpus-per-node {cpus} is out of range" in err and "HINT: " in err, err
    assert "Traceback" not in err and not (tmp_path / "state.json").exists()


def test_slurm_conf_with_accounting(layout: config.Layout) -> None:
    lines = conf_lines(config.render_slurm_conf(layout, accounting=True, real_memory_mb=8000))
    assert "AccountingStorageType=accounting_storage/slurmdbd" in lines
    assert "AccountingStorageHost=10.77.0.1" in lines
    # Accounting connections ignore AuthInfo: the munge socket goes in the password field.
    assert f"AccountingStoragePass={SD}/munge/munge.socket" in lines
    assert "AccountingStorageType=accounting_storage/none" not in lines
    # QOS and association limits set with sacctmgr hold jobs back (the pending tests need them)
    assert "AccountingStorageEnforce=associations,limits,qos" in lines


def test_slurmdbd_conf(layout: config.Layout) -> None:
    lines = conf_lines(config.render_slurmdbd_conf(layout))
    assert "DbdHost=ctl" in lines
    assert "StorageType=accounting_storage/mysql" in lines
    assert "StorageHost=127.0.0.1" in lines
    assert f"AuthInfo=socket={SD}/munge/munge.socket" in lines


def test_hosts_and_dns_files(layout: config.Layout) -> None:
    hosts = config.render_hosts(layout)
    assert "127.0.0.1\tlocalhost" in hosts
    assert "10.77.0.1\tctl" in hosts
    assert "10.77.0.12\tnode2" in hosts
    # No node name on a loopback address: torch would bind its store there.
    assert not any(line.startswith("127.") and "node" in line for line in hosts.splitlines())
    assert config.render_resolv_conf(layout).strip().endswith("nameserver 10.77.0.1")


def test_ompi_env_runs_as_root_over_tcp_on_the_cluster_subnet(layout: config.Layout) -> None:
    env = config.ompi_env(layout)
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == env["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM"] == "1"
    assert env["OMPI_MCA_btl"] == "self,tcp"
    assert env["OMPI_MCA_pml"] == "ob1"
    assert env["OMPI_MCA_btl_tcp_if_include"] == env["OMPI_MCA_oob_tcp_if_include"] == "10.77.0.0/24"


def _fake_tools(tmp_path: Path) -> tuple[Path, Path]:
    """A fake 'real' program and a fake nsenter, both printing their argv NUL-separated."""
    bin_dir = tmp_path / "fakebin"
    bin_dir.mkdir()
    for name in ("nsenter", "realprog"):
        p = bin_dir / name
        p.write_text(f'#!/bin/sh\nprintf "%s\\0" "{name}" "$@"\n')
        p.chmod(0o755)
    return bin_dir, bin_dir / "realprog"


def _run_wrapper(tmp_path: Path, host_netns: str, args: list[str]) -> list[str]:
    bin_dir, real = _fake_tools(tmp_path)
    wrapper = tmp_path / "sbatch"
    binds = {"/state dir/etc/hosts": "/etc/hosts"}
    wrapper.write_text(config.render_client_wrapper("sbatch", str(real), host_netns, "/run/netns/x", binds))
    wrapper.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}")
    cp = subprocess.run([str(wrapper), *args], capture_output=True, text=True, env=env, timeout=10)
    assert cp.returncode == 0, cp.stderr
    return cp.stdout.split("\0")[:-1]


def test_wrapper_inside_a_job_runs_the_real_program_with_args_intact(tmp_path: Path, hostile: str) -> None:
    out = _run_wrapper(tmp_path, "net:[1]", ["--parsable", hostile])
    assert out == ["realprog", "--parsable", hostile]
    assert not (Path.cwd() / "pwned").exists()


def test_wrapper_from_the_host_enters_the_controller_namespace(tmp_path: Path) -> None:
    here = os.readlink("/proc/self/ns/net")
    out = _run_wrapper(tmp_path, here, ["a b", "$HOME"])
    assert out[0] == "nsenter"
    assert out[1:3] == ["--net=/run/netns/x", "--"]
    assert out[3:7] == ["unshare", "--mount", "--propagation", "private"]
    sh_c = out.index("-c")
    script = out[sh_c + 1]
    assert shlex.split(script)[:4] == ["mount", "--bind", "/state dir/etc/hosts", "/etc/hosts"]
    # "$0" "$@" of the inner sh: the real program, then the caller's args unchanged.
    assert out[sh_c + 2 :] == [str(tmp_path / "fakebin" / "realprog"), "a b", "$HOME"]


def test_in_namespace_argv_quotes_the_daemon_command() -> None:
    argv = netns.in_namespace(
        "torchhpc-node1", "node1", {"/s d/hosts": "/etc/hosts"}, ["/usr/sbin/slurmd", "-D", "-N", "node1"]
    )
    assert argv[:3] == ["nsenter", "--net=/run/netns/torchhpc-node1", "--"]
    assert argv[3:8] == ["unshare", "--mount", "--uts", "--propagation", "private"]
    script = argv[-1]
    assert script.endswith("exec /usr/sbin/slurmd -D -N node1")
    assert "mount --bind '/s d/hosts' /etc/hosts" in script
    assert "hostname node1" in script


def test_netns_create_wires_veths_from_the_controller_side(layout: config.Layout) -> None:
    runner = FakeRunner(responses={"ip": ""})
    netns.create(layout, runner)
    cmds = [" ".join(argv) for argv, _ in runner.calls]
    assert cmds[0] == "ip netns add torchhpc-ctl"
    assert "ip -n torchhpc-ctl link add vn2 type veth peer name eth0 netns torchhpc-node2" in cmds
    assert "ip -n torchhpc-node3 addr add 10.77.0.13/24 dev eth0" in cmds
    assert "ip -n torchhpc-ctl addr add 10.77.0.1/24 dev br0" in cmds
    # The host namespace is never touched: every link/addr command names a namespace.
    assert all(c.startswith("ip -n ") or c.startswith("ip netns add") for c in cmds)


def test_netns_existing_matches_only_its_own_prefix() -> None:
    listing = "torchhpc-node1 (id: 1)\ntorchhpc-ctl (id: 0)\ntorchhpc-abc123-ctl\nother\ntorchhpc-node1x\n"
    runner = FakeRunner(responses={"ip": listing})
    assert netns.existing("torchhpc", runner) == ["torchhpc-node1", "torchhpc-ctl"]
    assert netns.existing("torchhpc-abc123", runner) == ["torchhpc-abc123-ctl"]


def test_state_round_trip_and_client_env(tmp_path: Path) -> None:
    lay = config.make_layout(str(tmp_path), 2)
    state = ClusterState(
        state_dir=lay.state_dir,
        nodes=list(lay.nodes),
        node_ips=dict(zip(lay.nodes, lay.node_ips)),
        netns_names={"ctl": lay.controller_netns, **{n: lay.node_netns(n) for n in lay.nodes}},
        controller_ip=lay.controller_ip,
        subnet=lay.subnet,
        slurm_conf=lay.slurm_conf,
        munge_socket=lay.munge_socket,
        bin_dir=lay.bin_dir,
        host_netns="net:[1]",
        accounting=True,
        daemons=[daemons.Daemon("munged", 123, 456, None, "/x.log")],
        cpus_per_node=12,
    )
    state.save()
    back = read_state(str(tmp_path))
    assert back is not None and back.to_json() == state.to_json() and back.cpus_per_node == 12
    assert back.node_ip("node2") == "10.77.0.12" and back.node_ip("ctl") == "10.77.0.1"
    assert back.netns("node1") == lay.node_netns("node1")
    env = back.client_env({"PATH": f"/usr/bin:{lay.bin_dir}", "HOME": "/root"})
    assert env["PATH"] == f"{lay.bin_dir}:/usr/bin"
    assert env["SLURM_CONF"] == lay.slurm_conf
    assert env["OMPI_ALLOW_RUN_AS_ROOT"] == "1" and env["HOME"] == "/root"
    with pytest.raises(Exception, match="node9"):
        back.node_ip("node9")
    assert not back.healthy()  # pid 123 with that start time is not ours


def test_state_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("TORCHHPC_DEVCLUSTER_DIR", raising=False)
    assert default_state_dir() == SD
    monkeypatch.setenv("TORCHHPC_DEVCLUSTER_DIR", str(tmp_path))
    assert default_state_dir() == str(tmp_path)
    assert default_state_dir("/other") == "/other"


def test_binds_give_each_node_its_hostname(layout: config.Layout) -> None:
    assert binds(layout, "node2")[f"{SD}/etc/hostname.node2"] == "/etc/hostname"
    assert "/etc/hostname" not in binds(layout, None).values()


def test_each_node_has_its_own_shared_memory_and_no_one_else_does(layout: config.Layout) -> None:
    """A node's /dev/shm is its own folder in the machine's memory (a failed node's is emptied with it); the
    controller and the login node keep the machine's."""
    dirs = {binds(layout, n).get(layout.shm_dir(n)) for n in layout.nodes}
    assert dirs == {"/dev/shm"} and len({layout.shm_dir(n) for n in layout.nodes}) == len(layout.nodes)
    assert layout.shm_dir("node1").startswith("/dev/shm/.") and SD not in layout.shm_dir("node1")
    assert "/dev/shm" not in binds(layout, config.CONTROLLER).values() and "/dev/shm" not in binds(layout, None).values()
    other = config.make_layout("/tmp/another-cluster", 2)
    assert other.shm_dir("node1") != layout.shm_dir("node1")  # two clusters on one machine keep apart


def test_daemon_records_follow_a_real_process() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        st = daemons.proc_stat(proc.pid)
        assert st is not None
        d = daemons.Daemon("sleeper", proc.pid, st[1], None, "")
        assert daemons.alive(d)
        # Same PID, different start time: not ours, never signalled.
        stranger = daemons.Daemon("other", proc.pid, st[1] + 1, None, "")
        assert not daemons.alive(stranger)
        assert daemons.stop([stranger]) == []
        assert proc.poll() is None
        assert daemons.stop([d]) == ["sleeper"]
        assert not daemons.alive(d)
    finally:
        proc.kill()
        proc.wait()


def test_listening_reads_the_process_namespace() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        assert not daemons.listening(os.getpid(), port)
        s.listen()
        assert daemons.listening(os.getpid(), port)


def test_cli_exec_without_a_cluster_names_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["devcluster", "exec", "--state-dir", str(tmp_path), "--", "sinfo"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"no healthy dev cluster is up in {tmp_path}" in err
    assert "torchhpc devcluster up" in err


def test_cli_status_without_a_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devcluster", "status", "--state-dir", str(tmp_path)]) == 1
    assert "No dev cluster" in capsys.readouterr().out


def test_not_root_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from torchhpc.errors import DevClusterError

    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(DevClusterError, match="must run as root") as e:
        from torchhpc.devcluster import up

        up(state_dir=str(tmp_path), progress=None)
    assert e.value.hint and "sudo" in e.value.hint


def test_ensure_packages_installs_only_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """apt-get is a FakeRunner answer here: installing packages is not a unit test's business."""
    from torchhpc.devcluster import prepare

    monkeypatch.setattr(
        prepare, "which", lambda prog: None if prog in ("slurmdbd", "munged") else f"/x/{prog}"
    )
    monkeypatch.setattr(prepare.glob, "glob", lambda pattern: ["/found"])
    answers = iter([(100, "", "E: Unable to locate package munge"), (0, "", ""), (0, "", "")])
    runner = FakeRunner(responses={"apt-get": lambda argv, _in: next(answers)})
    said: list[str] = []
    assert prepare.ensure_packages(True, runner, said.append) == ["munge", "slurmdbd"]
    argvs = [argv for argv, _ in runner.calls]
    install = ["apt-get", "install", "-y", "--no-install-recommends", "munge", "slurmdbd"]
    assert argvs == [install, ["apt-get", "update"], install]
    assert any("apt-get update" in s for s in said)
    # Without --accounting, slurmdbd is not wanted.
    runner2 = FakeRunner(responses={"apt-get": ""})
    assert prepare.ensure_packages(False, runner2, said.append) == ["munge"]


def test_mariadb_template_is_made_once_and_keyed_by_the_server(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """mariadb-install-db is a FakeRunner answer that creates the datadir it is given."""
    from torchhpc.devcluster import bringup

    server = tmp_path / "mariadbd"
    server.write_text("v1")
    monkeypatch.setattr(bringup, "_real", lambda prog: str(server) if prog == "mariadbd" else f"/x/{prog}")

    def install(argv: list[str], _input: object) -> str:
        datadir = next(a.split("=", 1)[1] for a in argv if a.startswith("--datadir="))
        os.makedirs(os.path.join(datadir, "mysql"))
        return ""

    runner = FakeRunner(responses={"/x/mariadb-install-db": install})
    lay = config.make_layout(str(tmp_path / "sd"), 1)
    first = bringup._mariadb_template(lay, runner, 10)
    assert os.path.isdir(os.path.join(first, "mysql"))
    assert bringup._mariadb_template(lay, runner, 10) == first
    assert len(runner.calls) == 1
    server.write_text("v2, upgraded")  # a new server binary gets a fresh template
    assert bringup._mariadb_template(lay, runner, 10) != first
    assert len(runner.calls) == 2


def test_a_second_up_or_down_on_the_same_state_dir_is_refused(tmp_path: Path) -> None:
    import fcntl

    from torchhpc.devcluster.cluster import _exclusive
    from torchhpc.errors import DevClusterError

    with _exclusive(str(tmp_path)):
        with pytest.raises(DevClusterError, match="another `torchhpc devcluster up/down` is running"):
            with _exclusive(str(tmp_path)):
                pass
    with _exclusive(str(tmp_path)):  # released again
        with open(tmp_path / ".lock") as f:
            with pytest.raises(BlockingIOError):
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_down_hint_names_the_state_dir_only_when_not_default() -> None:
    from torchhpc.devcluster.state import down_hint

    assert down_hint(SD) == "torchhpc devcluster down"
    assert down_hint("/tmp/my dc") == "torchhpc devcluster down --state-dir '/tmp/my dc'"


def test_a_daemon_runs_in_its_logs_folder_so_a_core_lands_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """slurmd's core dump (2026-12-04) landed in the directory `devcluster up` was typed in: a checkout."""
    monkeypatch.chdir(tmp_path)
    log = tmp_path / "log" / "pwd.out"
    log.parent.mkdir()
    d = daemons.start("pwd", ["/bin/sh", "-c", "pwd"], str(log))
    daemons.wait_for("pwd to end", lambda: not daemons.alive(d), 10)
    assert log.read_text().strip() == str(log.parent)
