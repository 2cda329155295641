"""The completion scripts under the real shells, driven by a real TAB (issue 50, item 8).

``eval "$(torchhpc completion zsh)"`` (README) failed at the first TAB with ``_torchhpc:18:
command not found: mapfile``: zsh's bashcompinit runs bash completion functions but has no
``mapfile``. A unit test of the generated text could not see that; zsh itself, in a pseudo
terminal (its own ``zsh/zpty`` module), does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, missing

ZPTY = r"""
zmodload zsh/zpty
out=""
# Read the terminal until its text matches $1, for up to 90 s: a wait on the thing itself, not a
# sleep. Under load (CI runs this beside 3 workers) `eval "$(torchhpc completion zsh)"` starts a
# Python and once took longer than the 2 s a fixed sleep allowed; the TAB then went to a shell still
# busy and the ^C meant for the line cancelled the eval.
await() {
  local chunk deadline=$((SECONDS + 90))
  while ((SECONDS < deadline)); do
    while zpty -r -t z chunk; do out+="$chunk"; done
    [[ ${out//$'\r'/} == *$~1* ]] && return 0
    sleep 0.1
  done
  print -r -- "timed out waiting for: $1"
  return 1
}
zpty -b z 'zsh -f -i'
zpty -w z 'PS1="%% "; autoload -U +X compinit && compinit -u; print READY$((1))'
await 'READY1'
# The echo of the typed line shows READY$((2)); only the shell's own output shows READY2.
zpty -w z 'eval "$(torchhpc completion zsh)"; print READY$((2))'
await 'READY2'
zpty -w -n z $'torchhpc stat\t'
await 'torchhpc status'
# ^U empties the line (emacs keymap). Not ^C: the tty's interrupt flushes input typed after it.
zpty -w -n z $'\x15'
zpty -w -n z $'torchhpc run --scheduler slu\t'
await '--scheduler slurm'
zpty -w -n z $'\x15'
zpty -w z 'exit'
sleep 0.5
while zpty -r -t z chunk; do out+="$chunk"; done
print -r -- "$out"
"""


def _bin_dir(tmp_path: Path) -> str:
    """A PATH entry whose ``torchhpc`` is this checkout's, run by this interpreter."""
    exe = tmp_path / "bin" / "torchhpc"
    exe.parent.mkdir()
    exe.write_text(f"#!/bin/sh\nexec {PYTHON} -m torchhpc \"$@\"\n")
    exe.chmod(0o755)
    return str(exe.parent)


def test_zsh_tab_completes_a_command_and_a_scheduler(tmp_path: Path) -> None:
    if shutil.which("zsh") is None:
        missing("zsh is not installed (scripts/test.sh installs it)")
    env = {**os.environ, "PATH": _bin_dir(tmp_path) + os.pathsep + os.environ["PATH"], "HOME": str(tmp_path)}
    script = tmp_path / "tab.zsh"
    script.write_text(ZPTY)
    done = subprocess.run(["zsh", "-f", str(script)], capture_output=True, text=True, env=env, timeout=120)
    out = done.stdout.replace("\r", "")
    assert "_torchhpc:" not in out and "mapfile" not in out, out  # no error from the completion function
    assert "torchhpc status" in out, out  # `stat<TAB>` became `status`
    assert "--scheduler slurm" in out, out  # `slu<TAB>` after --scheduler became `slurm`


@pytest.mark.parametrize("words", [["torchhpc", "sta"], ["torchhpc", "run", "--scheduler", "s"]])
def test_bash_completes_the_same(tmp_path: Path, words: list[str]) -> None:
    env = {**os.environ, "PATH": _bin_dir(tmp_path) + os.pathsep + os.environ["PATH"]}
    line = " ".join(words)
    done = subprocess.run(
        ["bash", "-c", f'eval "$(torchhpc completion bash)"; COMP_WORDS=({line}); COMP_CWORD={len(words) - 1}; '
                       '_torchhpc; printf "%s\\n" "${COMPREPLY[@]}"'],
        capture_output=True, text=True, env=env, timeout=60,
    )
    assert done.returncode == 0 and not done.stderr, done.stderr
    assert ("status" if words[-1] == "sta" else "slurm") in done.stdout.split(), done.stdout
