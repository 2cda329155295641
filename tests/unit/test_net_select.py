"""HCA / GID / interface selection on fake sysfs trees, against seed 004's one-liner run by a real bash.

The trees (tests/data/sysfs/*, written by build.py) are fakes: no RDMA
hardware exists here. They follow the kernel's layout and formats for mlx5
ConnectX ports (gids/N, gid_attrs/types/N, gid_attrs/ndevs/N, unused slots
all-zero with no readable type), /sys/class/net and /proc/net. The seed's
one-liner is run for real by bash over the same files, with only its
hardcoded /sys prefix pointed at the tree.
"""

from __future__ import annotations

import ipaddress
import subprocess
from pathlib import Path

from tests.conftest import REPO, missing
from tests.data.sysfs.build import CASES
from torchhpc.network.select import detect, pick_gid
from torchhpc.network.sysfs import Gid, IBPort, probe

TREES = REPO / "tests" / "data" / "sysfs"
SEED_004 = REPO.parent / "shared" / "seeds" / "004_9a2a736c85114e8b.txt"

# Verbatim from seed 004 (RCP_run_app.sh): the GID index of the RoCE v2 IPv4-mapped GID.
ONE_LINER = (
    "grep 'RoCE v2' $(grep '0000:0000:0000:0000:0000:ffff' /sys/class/infiniband/mlx5_bond_0/ports/1/gids/* "
    "| cut -d ':' -f 1 | sed 's/gids/gid_attrs\\/types/') |  sed -e 's/.*\\/\\([0-9]*\\):.*/\\1/'"
)


def one_liner(case: str) -> str:
    """What the seed's one-liner prints on a tree (stdin closed: with no file it would read stdin)."""
    root = TREES / case
    script = ONE_LINER.replace("/sys/class/infiniband", f"{root}/sys/class/infiniband")
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    return done.stdout


def ours(case: str, master: str | None = None) -> dict[str, str]:
    return detect(probe(TREES / case), master or CASES[case]["master"]).env


def test_one_liner_is_the_seeds() -> None:
    if not SEED_004.exists():
        missing("shared/seeds not beside the repository (CI has it beside the clone)")
    assert ONE_LINER in SEED_004.read_text()


def test_connectx_roce_agrees_with_the_one_liner() -> None:
    # The seed's own situation: one bonded device, one IPv4 address. Both say 5 (not the folklore 3,
    # which here is the IPv6 RoCE v2 GID).
    assert one_liner("connectx-roce").strip() == "5"
    env = ours("connectx-roce")
    assert env["NCCL_IB_GID_INDEX"] == "5"
    assert env["NCCL_IB_HCA"] == "mlx5_bond_0:1"
    assert env["NCCL_SOCKET_IFNAME"] == "bond0"


def test_bond_with_vlan_one_liner_prints_two_indices() -> None:
    out = one_liner("connectx-roce-bond-vlan")
    assert out.split() == ["3", "5"]  # NCCL_IB_GID_INDEX="3\n5" is not a number
    # Ours: the GID on the netdev that routes to the master.
    assert ours("connectx-roce-bond-vlan", "10.2.0.1")["NCCL_IB_GID_INDEX"] == "5"
    assert ours("connectx-roce-bond-vlan", "10.1.0.1")["NCCL_IB_GID_INDEX"] == "3"
    assert ours("connectx-roce-bond-vlan", "10.2.0.1")["NCCL_SOCKET_IFNAME"] == "bond0.100"
    # bond0 is a prefix of bond0.100: NCCL's prefix match would take both, so exact match.
    assert ours("connectx-roce-bond-vlan", "10.1.0.1")["NCCL_SOCKET_IFNAME"] == "=bond0"
    assert ours("connectx-roce-bond-vlan", "10.1.0.1")["GLOO_SOCKET_IFNAME"] == "bond0"


def test_multi_device_one_liner_prints_nothing() -> None:
    assert one_liner("connectx-roce-multi").strip() == ""  # no mlx5_bond_0 on this machine
    env = ours("connectx-roce-multi")
    assert env["NCCL_IB_GID_INDEX"] == "3"
    assert env["NCCL_IB_HCA"] == "mlx5_0:1,mlx5_1:1"  # mlx5_2 is DOWN: left out
    assert env["NCCL_SOCKET_IFNAME"] == "ens1f0"


def test_ipv6_only_one_liner_prints_nothing() -> None:
    assert one_liner("connectx-roce-ipv6").strip() == ""
    env = ours("connectx-roce-ipv6")
    assert env["NCCL_IB_GID_INDEX"] == "3"  # the global (not link-local fe80) RoCE v2 GID
    assert env["NCCL_SOCKET_FAMILY"] == "AF_INET6"
    assert env["NCCL_SOCKET_IFNAME"] == "bond0"


def test_infiniband_has_no_gid_index() -> None:
    env = ours("connectx-ib")
    assert "NCCL_IB_GID_INDEX" not in env
    assert env["NCCL_IB_HCA"] == "mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1"
    assert env["NCCL_SOCKET_IFNAME"] == "ib0"
    det = detect(probe(TREES / "connectx-ib"), "10.10.0.1")
    assert any("nvidia_peermem" in w for w in det.warnings)


def test_slingshot_keeps_all_rails_for_nccl_and_one_for_gloo() -> None:
    det = detect(probe(TREES / "slingshot"), "10.252.1.1")
    assert det.env == {
        "NCCL_SOCKET_IFNAME": "hsn0,hsn1,hsn2,hsn3",
        "GLOO_SOCKET_IFNAME": "hsn0",
        "NCCL_NET_GDR_LEVEL": "3",
    }
    assert det.gpu_kind == "amd"
    assert any("RCCL" in w for w in det.warnings)


def test_slingshot_without_master_still_prefers_hsn_over_default_route() -> None:
    env = detect(probe(TREES / "slingshot"), None).env
    assert env["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"  # the default route is on nmn0


def test_no_fabric_picks_the_routed_interface_never_docker() -> None:
    env = ours("no-fabric")
    assert env == {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}


def test_loopback_only_when_the_master_is_this_machine() -> None:
    inv = probe(TREES / "no-fabric")
    det = detect(inv, "127.0.0.1")
    assert det.env["NCCL_SOCKET_IFNAME"] == "lo" and "single node" in det.choices[0].reason
    # This node is the master of a multi-node job: its own address, on eth0, is where peers come in.
    det = detect(inv, "10.0.0.5")
    assert det.env["NCCL_SOCKET_IFNAME"] == "eth0" and "this node's address on eth0" in det.choices[0].reason
    # A remote master off every subnet goes through the default route's interface, not lo.
    assert detect(inv, "192.0.2.77").env["NCCL_SOCKET_IFNAME"] == "eth0"


def test_hostname_resolving_to_loopback_never_binds_lo() -> None:
    """Debian's `127.0.1.1 node1` line: on node1 itself the master name is loopback, elsewhere it is not."""
    inv = probe(TREES / "no-fabric")
    det = detect(inv, "node1", resolve=lambda h: [ipaddress.ip_address("127.0.1.1")])
    assert det.env["NCCL_SOCKET_IFNAME"] == "eth0"
    assert any("resolves to loopback" in w for w in det.warnings)
    # Known to be a single node: loopback is fine.
    det = detect(inv, "node1", resolve=lambda h: [ipaddress.ip_address("127.0.1.1")], nodes=1)
    assert det.env["NCCL_SOCKET_IFNAME"] == "lo"
    # A literal loopback master with several nodes cannot work: say so.
    det = detect(inv, "127.0.0.1", nodes=2)
    assert any("cannot reach it" in w for w in det.warnings)


def test_unresolvable_master_leaves_interfaces_unset() -> None:
    det = detect(probe(TREES / "no-fabric"), "no-such-host.invalid", resolve=lambda h: [])
    assert "NCCL_SOCKET_IFNAME" not in det.env
    assert any("does not resolve" in w for w in det.warnings)


def test_every_choice_has_a_reason() -> None:
    for case in CASES:
        for c in detect(probe(TREES / case), CASES[case]["master"]).choices:
            assert c.reason, (case, c)


def test_missing_tree_is_no_fabric_not_a_crash(tmp_path: Path) -> None:
    det = detect(probe(tmp_path), "10.0.0.1")
    assert det.env == {}
    assert any("proc/net/route" in w for w in det.warnings)


def test_pick_gid_prefers_ipv4_then_global_ipv6_then_link_local() -> None:
    ll = Gid(0, "fe80:0000:0000:0000:0000:0000:0000:0001", "RoCE v2", "eth2")
    v6 = Gid(1, "fd00:0000:0000:0000:0000:0000:0000:0005", "RoCE v2", "eth2")
    v4 = Gid(2, "0000:0000:0000:0000:0000:ffff:0a01:0005", "RoCE v2", "eth2")
    v4v1 = Gid(3, "0000:0000:0000:0000:0000:ffff:0a01:0005", "IB/RoCE v1", "eth2")
    port = IBPort("mlx5_0", 1, "ACTIVE", "LinkUp", "Ethernet", gids=(ll, v6, v4v1, v4))
    assert pick_gid(port)[0] == v4
    assert pick_gid(IBPort("d", 1, gids=(ll, v6)))[0] == v6
    g, why = pick_gid(IBPort("d", 1, gids=(ll,)))
    assert g == ll and "link-local" in why
    g, why = pick_gid(IBPort("d", 1, gids=(Gid(0, v4.gid, None),)))
    assert g is None and "unreadable" in why


def test_exact_match_hca_when_names_share_a_prefix() -> None:
    from torchhpc.network.select import _hca_value

    assert _hca_value(["mlx5_1:1"], ["mlx5_1", "mlx5_10"]) == "=mlx5_1:1"
    assert _hca_value(["mlx5_0:1", "mlx5_1:1"], ["mlx5_0", "mlx5_1"]) == "mlx5_0:1,mlx5_1:1"
