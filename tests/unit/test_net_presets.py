"""Presets are documented data applied with setdefault: the user's values win, in Python and in bash."""

from __future__ import annotations

import subprocess

import pytest

from torchhpc.errors import UsageError
from torchhpc.network.presets import (
    PRESETS,
    apply,
    auto_lines,
    preset_env,
    preset_names,
    setdefault_lines,
    wants_auto,
)


def test_every_variable_is_documented() -> None:
    assert set(PRESETS) == {"tcp", "infiniband", "roce", "lumi-slingshot", "debug"}
    for p in PRESETS.values():
        assert p.summary
        for name, value, why in p.env:
            assert name.isupper() and value and why, (p.name, name)


def test_seed_values() -> None:
    assert preset_env("lumi-slingshot")["NCCL_SOCKET_IFNAME"] == "hsn0,hsn1,hsn2,hsn3"  # seed 002
    assert preset_env("lumi-slingshot")["NCCL_NET_GDR_LEVEL"] == "3"
    roce = preset_env("roce")  # seed 004
    assert roce["NCCL_IB_HCA"] == "mlx5"
    assert roce["NCCL_SOCKET_NTHREADS"] == "4" and roce["NCCL_NSOCKS_PERTHREAD"] == "8"
    assert preset_env("debug")["TORCH_DISTRIBUTED_DEBUG"] == "DETAIL"
    assert preset_env("debug")["NCCL_DEBUG"] == "INFO"
    assert preset_env("tcp")["NCCL_IB_DISABLE"] == "1"


def test_combination_first_wins_and_auto_adds_nothing() -> None:
    env = preset_env("tcp,infiniband")
    assert env["NCCL_IB_DISABLE"] == "1" and env["NCCL_NET"] == "Socket"
    assert preset_env("auto") == {}
    assert preset_env("auto,debug") == preset_env("debug")
    assert wants_auto("auto,debug") and not wants_auto("roce")


@pytest.mark.parametrize("bad", ["nope", "", ",", "roce,nope"])
def test_unknown_names_list_the_valid_ones(bad: str) -> None:
    with pytest.raises(UsageError) as e:
        preset_env(bad)
    assert "roce" in (e.value.hint or "") and "lumi-slingshot" in (e.value.hint or "")
    assert preset_names()[0] == "auto"


def test_apply_is_setdefault() -> None:
    env = {"NCCL_DEBUG": "WARN"}
    done = apply(env, preset_env("debug"))
    assert env["NCCL_DEBUG"] == "WARN"
    assert "NCCL_DEBUG" not in done and "TORCH_DISTRIBUTED_DEBUG" in done


def _bash(script: str, env: dict[str, str]) -> str:
    return subprocess.run(
        ["bash", "-euc", script], capture_output=True, text=True, env=env, check=True, timeout=30
    ).stdout


def test_setdefault_lines_in_bash_keep_user_values(hostile: str) -> None:
    values = {"NCCL_SOCKET_IFNAME": hostile, "NCCL_IB_HCA": hostile}
    script = "\n".join(setdefault_lines(values)) + '\nprintf "%s|%s" "$NCCL_SOCKET_IFNAME" "$NCCL_IB_HCA"'
    # Unset: the preset's (hostile) value arrives unchanged and nothing is executed.
    out = _bash(script, {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"})
    assert out == f"{hostile}|{hostile}"
    # Set by the user, even to "": untouched.
    out = _bash(script, {"PATH": "/usr/bin:/bin", "NCCL_SOCKET_IFNAME": "user0", "NCCL_IB_HCA": ""})
    assert out == "user0|"


def test_auto_lines_parse_and_pass_the_master(tmp_path: object) -> None:
    lines = auto_lines(python="python3")
    text = "\n".join(lines)
    assert 'eval "$(python3 -m torchhpc net detect --export ${MASTER_ADDR:+--master "$MASTER_ADDR"})"' in text
    subprocess.run(["bash", "-n", "-c", text], check=True)


def test_docs_list_every_preset_variable() -> None:
    from tests.conftest import REPO

    text = (REPO / "docs" / "network.md").read_text()
    for p in PRESETS.values():
        assert f"`{p.name}`" in text
        for name, value, _ in p.env:
            assert f"`{name}`" in text and f"`{value}`" in text, (p.name, name)


def test_script_lines_run_in_bash_with_user_values_first() -> None:
    from torchhpc.network.presets import script_lines

    lines = script_lines("auto,debug", python="true")  # `true` stands in for the detector: prints nothing
    assert lines[0].startswith("# torchhpc --network auto,debug")
    assert lines[-1].startswith('eval "$(true -m torchhpc net detect --export')
    script = "\n".join(lines) + '\nprintf "%s|%s" "$NCCL_DEBUG" "$TORCH_DISTRIBUTED_DEBUG"'
    out = _bash(script, {"PATH": "/usr/bin:/bin", "NCCL_DEBUG": "WARN", "MASTER_ADDR": "10.0.0.1"})
    assert out == "WARN|DETAIL"
    assert script_lines("lumi-slingshot")[1] == '[ -n "${NCCL_SOCKET_IFNAME+x}" ] || export NCCL_SOCKET_IFNAME=hsn0,hsn1,hsn2,hsn3'
    assert not any("eval" in line for line in script_lines("roce"))
