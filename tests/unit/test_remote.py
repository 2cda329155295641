"""``--remote`` without a login node: the bundle, the remote scripts and the forwarding.

Real git, tar, bash and ``git apply`` throughout. Only the transport is a stand-in: an ``ssh``
on PATH that runs the line it is given with ``sh -c`` here, under a "remote" HOME in the test's
tmp dir (the real sshd is in tests/integration/test_remote.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchhpc import __version__
from torchhpc.cli.main import main
from torchhpc.errors import RemoteError, UsageError
from torchhpc.remote import forward as fw
from torchhpc.remote.ship import Ignore, collect

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]


def git(repo: Path, *args: str) -> None:
    subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    (r / "pkg").mkdir(parents=True)
    (r / "train.py").write_text("print('v1')\n")
    (r / "pkg" / "gone.py").write_text("x = 1\n")
    (r / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (r / "run.sh").chmod(0o755)
    git(r, "init", "-q")
    git(r, "add", ".")
    git(r, "commit", "-qm", "one")
    return r


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in transport; returns the remote HOME. Every ssh argv is logged to ssh.log."""
    bindir, home = tmp_path / "bin", tmp_path / "remote-home"
    bindir.mkdir()
    home.mkdir()
    (bindir / "ssh").write_text(
        f"#!{sys.executable}\nimport json, os, subprocess, sys\n"
        f"open({str(tmp_path / 'ssh.log')!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        "if '-O' in sys.argv or '-N' in sys.argv: sys.exit(0)\n"
        f"env = dict(os.environ, HOME={str(home)!r})\n"
        "sys.exit(subprocess.call(['sh', '-c', sys.argv[sys.argv.index('--') + 1]], env=env, cwd=env['HOME']))\n"
    )
    (bindir / "ssh").chmod(0o755)
    (bindir / "echo-torchhpc").write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"if sys.argv[1:] == ['--version']: print('torchhpc {__version__}'); sys.exit(0)\n"
        "print(json.dumps({'argv': sys.argv[1:], 'cwd': os.getcwd()}))\n"
    )
    (bindir / "echo-torchhpc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    monkeypatch.setenv("TORCHHPC_REMOTE_COMMAND", str(bindir / "echo-torchhpc"))
    monkeypatch.setenv("TORCHHPC_SSH_CONTROL_DIR", str(tmp_path / "ctl"))
    monkeypatch.delenv("TORCHHPC_REMOTE", raising=False)
    monkeypatch.delenv(fw.ENV_SIDE, raising=False)
    return home


def test_ignore_patterns_are_gitignore_like() -> None:
    ig = Ignore([".env", "data/", "/top.txt", "*.ckpt", "logs/*.txt", "!keep.ckpt"])
    assert ig.ignored(".env") and ig.ignored("sub/.env")
    assert ig.ignored("data/x.bin") and ig.ignored("a/data/x") and not ig.ignored("data")
    assert ig.ignored("top.txt") and not ig.ignored("sub/top.txt")
    assert ig.ignored("m/a.ckpt") and not ig.ignored("keep.ckpt")
    assert ig.ignored("logs/a.txt") and not ig.ignored("train.py")


def test_clean_checkout_ships_head_and_its_digest_is_stable(repo: Path) -> None:
    a, b = collect(str(repo)), collect(str(repo))
    assert a.kind == "git" and not a.patch and a.digest == b.digest
    assert sorted(p for p, _s in a.files) == ["pkg/gone.py", "run.sh", "train.py"]


def test_dirty_checkout_ships_a_patch_that_applies_there(repo: Path, fake_ssh: Path) -> None:
    clean = collect(str(repo)).digest
    (repo / "train.py").write_text("print('v2')\n")
    (repo / "new.py").write_text("n = 2\n")
    (repo / "pkg" / "gone.py").unlink()
    (repo / ".env").write_text("SECRET=1\n")
    b = collect(str(repo))
    assert b.digest != clean and b.changed == ["new.py", "pkg/gone.py", "train.py"]
    # The remote side's own script, through a real bash, tar and git apply.
    done = subprocess.run(["bash", "-c", fw.upload_script(b.digest)], input=b.payload(), env={**os.environ,
                          "HOME": str(fake_ssh)}, capture_output=True)
    assert done.returncode == 0, done.stderr
    code = fake_ssh / ".torchhpc" / "code" / b.digest
    assert (code / "train.py").read_text() == "print('v2')\n" and (code / "new.py").exists()
    assert not (code / "pkg" / "gone.py").exists() and not (code / ".env").exists()
    assert os.access(code / "run.sh", os.X_OK)
    with pytest.raises(UsageError, match="uncommitted changes") as e:
        collect(str(repo), mode="committed")
    assert e.value.hint and "--ship committed" in e.value.hint


def test_size_limit_names_the_largest_file(repo: Path) -> None:
    (repo / "big.bin").write_bytes(b"x" * 4096)
    with pytest.raises(RemoteError, match=r"over the 1\.0 KiB limit \(largest: big\.bin") as e:
        collect(str(repo), limit=1024)
    assert e.value.hint and ".torchhpcignore" in e.value.hint
    (repo / ".torchhpcignore").write_text("*.bin\n")
    assert "big.bin" not in {p for p, _s in collect(str(repo), limit=4000).files}


def test_plain_directory_ships_as_a_tarball(tmp_path: Path, fake_ssh: Path) -> None:
    d = tmp_path / "plain"
    (d / "data").mkdir(parents=True)
    (d / "a.py").write_text("a\n")
    (d / "data" / "big").write_text("b\n")
    (d / ".torchhpcignore").write_text("data/\n")
    b = collect(str(d))
    assert b.kind == "dir" and [p for p, _s in b.files] == [".torchhpcignore", "a.py"] and b.excluded == ["data/"]
    subprocess.run(["bash", "-c", fw.upload_script(b.digest)], input=b.payload(), check=True,
                   env={**os.environ, "HOME": str(fake_ssh)})
    assert (fake_ssh / ".torchhpc" / "code" / b.digest / "a.py").read_text() == "a\n"


def test_hostile_values_reach_the_remote_torchhpc_unchanged(hostile: str, fake_ssh: Path,
                                                            capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["logs", "--remote", "login.example", "slurm:12", "--grep", hostile]) == 0
    got = json.loads(capfd.readouterr().out)
    assert got["argv"] == ["logs", "slurm:12", "--grep", hostile]
    assert not list(fake_ssh.glob("pwned*"))


def test_run_ships_once_then_runs_in_the_copy(repo: Path, fake_ssh: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch,
                                             capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(repo)
    argv = ["run", "--remote", "login.example", "--scheduler", "slurm", "--nodes", "2", "train.py", "--lr", "1"]
    assert main(argv) == 1  # the echo stand-in answers no handle: its JSON is printed
    out = capfd.readouterr()
    got = json.loads(out.out)
    digest = collect(str(repo)).digest
    assert got["cwd"] == str(fake_ssh / ".torchhpc" / "code" / digest)
    assert got["argv"][-4:] == ["--json", "train.py", "--lr", "1"] and "--remote" not in got["argv"]
    assert "Shipped 3 files" in out.err
    main(argv)
    assert "Code already on login.example" in capfd.readouterr().err


def test_dry_run_lists_the_files_and_touches_nothing(repo: Path, fake_ssh: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(repo)
    assert main(["run", "--remote", "me@login", "--scheduler", "slurm", "--dry-run", "train.py"]) == 0
    out = capfd.readouterr().out
    assert "#   train.py" in out and "ships 3 files" in out and "exec \"${cmd[@]}\" run --scheduler slurm" in out
    assert not (tmp_path / "ssh.log").exists()


@pytest.mark.parametrize("answer,code,words", [("", 127, "Error: no torchhpc on"),
                                               ("torchhpc 0.0.1", 2, "runs torchhpc 0.0.1, this is")])
def test_missing_or_other_remote_torchhpc_is_one_line_with_a_hint(
        answer: str, code: int, words: str, fake_ssh: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "bin" / "other"
    other.write_text(f"#!/bin/sh\n{'echo ' + repr(answer) if answer else 'exit 127'}\n")
    other.chmod(0o755)
    monkeypatch.setenv("TORCHHPC_REMOTE_COMMAND", str(other if answer else tmp_path / "nowhere" / "torchhpc"))
    assert main(["status", "--remote", "login.example", "slurm:1"]) == code
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 2 and words in err[0] and err[1].startswith("HINT: install torchhpc")


def test_remote_target_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHHPC_CONFIG", str(tmp_path / "c.toml"))
    (tmp_path / "c.toml").write_text('remote = "from-config"\n')
    monkeypatch.delenv("TORCHHPC_REMOTE", raising=False)
    monkeypatch.delenv("TORCHHPC_PROFILE", raising=False)
    monkeypatch.delenv(fw.ENV_SIDE, raising=False)
    assert fw.target("status", None) == ("from-config", f"config file ({tmp_path / 'c.toml'})")
    assert fw.target("devcluster", None) is None  # only the job commands follow the default
    monkeypatch.setenv("TORCHHPC_REMOTE", "from-env")
    assert fw.target("logs", None)[0] == "from-env"  # type: ignore[index]
    assert fw.target("logs", "given")[0] == "given"  # type: ignore[index]
    monkeypatch.setenv(fw.ENV_SIDE, "1")
    assert fw.target("logs", "given") is None  # the remote side never forwards again
    with pytest.raises(UsageError, match="is not a host"):
        monkeypatch.delenv(fw.ENV_SIDE)
        fw.target("logs", "-oProxyCommand=x")
