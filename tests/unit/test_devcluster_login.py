"""The login node's pure parts: sshd_config, the client's Host block, names and addresses.

The real sshd runs in tests/integration (test_devcluster.py, test_remote.py).
"""

from __future__ import annotations

import pytest

from torchhpc.devcluster import config, login
from torchhpc.errors import DevClusterError


def test_login_node_has_its_own_address_namespace_and_name() -> None:
    lay = config.make_layout("/var/tmp/x", 2, login=True)
    assert lay.login_ip == "10.77.0.5" and lay.login_netns.endswith("-login")
    assert "10.77.0.5\tlogin" in config.render_hosts(lay)
    assert "login" not in config.render_hosts(config.make_layout("/var/tmp/x", 2))


def test_sshd_config_keys_per_user_in_the_state_dir_and_the_cluster_env() -> None:
    lay = config.make_layout("/var/tmp/x", 2, login=True)
    text = login.render_sshd_config(lay, login.session_env(lay))
    assert "AuthorizedKeysFile /var/tmp/x/login/authorized_keys/%u" in text
    assert "PasswordAuthentication no" in text and "ListenAddress 10.77.0.5:22" in text
    assert "SLURM_CONF=/var/tmp/x/etc/slurm.conf" in text and "TORCHHPC_DEVCLUSTER_DIR=/var/tmp/x" in text


def test_ssh_config_reaches_the_node_through_the_controller_namespace() -> None:
    lay = config.make_layout("/var/tmp/my dir", 2, login=True)
    text = login.render_ssh_config(lay, "alice")
    assert text.startswith(f"Host {login.host_alias(lay)}\n")
    assert '  IdentityFile "/var/tmp/my dir/login/id_ed25519"' in text and "  User alice" in text
    assert f"ProxyCommand nsenter --net=/run/netns/{lay.controller_netns} -- socat STDIO TCP:%h:%p" in text


def test_a_value_ssh_config_cannot_hold_is_refused() -> None:
    lay = config.make_layout('/var/tmp/a"b', 2, login=True)
    with pytest.raises(DevClusterError, match="cannot be written into an ssh config"):
        login.render_ssh_config(lay, "alice")
