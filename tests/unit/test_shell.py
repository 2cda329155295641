"""core.shell: every value survives a real bash unchanged and nothing it carries runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import HOSTILE
from torchhpc.core.shell import Raw, assignment, directive, export_lines, join, quote, splice_vars
from torchhpc.errors import QuotingError


def run_bash(script: str, cwd: Path) -> str:
    return subprocess.run(["bash", "-c", script], cwd=cwd, capture_output=True, text=True, check=True).stdout


def test_join_roundtrips_through_bash(hostile: str, tmp_path: Path) -> None:
    script = join(["printf", "%s\\0", hostile, "second"])
    out = run_bash(script, tmp_path)
    assert out.split("\0")[:2] == [hostile, "second"]
    assert not list(tmp_path.iterdir()), "a hostile value executed something"


def test_export_roundtrips_through_bash(hostile: str, tmp_path: Path) -> None:
    script = "\n".join([*export_lines({"V": hostile}), 'printf "%s" "$V"'])
    assert run_bash(script, tmp_path) == hostile
    assert not list(tmp_path.iterdir())


def test_raw_expands_and_quote_does_not(tmp_path: Path) -> None:
    env = {**os.environ, "X": "expanded"}
    out = subprocess.run(
        ["bash", "-c", join(["echo", Raw('"$X"'), "$X"])], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "expanded $X"
    assert repr(Raw("$X")) == "Raw('$X')"
    assert isinstance(Raw("a"), str)


def test_splice_vars_expands_only_named(tmp_path: Path) -> None:
    text = "out-$SLURM_JOB_ID-$HOME-$(touch pwned)`touch p2`.log"
    env = {**os.environ, "SLURM_JOB_ID": "42"}
    out = subprocess.run(
        ["bash", "-c", "printf %s " + splice_vars(text, ["SLURM_JOB_ID"])],
        env=env, cwd=tmp_path, capture_output=True, text=True, check=True,
    ).stdout
    assert out == "out-42-$HOME-$(touch pwned)`touch p2`.log"
    assert not list(tmp_path.iterdir())


def test_safe_words_stay_readable() -> None:
    assert quote("examples/pi.py") == "examples/pi.py"
    assert quote("--nproc-per-node=2") == "--nproc-per-node=2"
    assert quote("a b") == "'a b'"
    assert quote("") == "''"


@pytest.mark.parametrize("bad", ["1X", "A-B", "a b", ""])
def test_assignment_rejects_bad_names(bad: str) -> None:
    with pytest.raises(QuotingError, match="not a valid"):
        assignment(bad, "v")


def test_directive_escapes_sbatch_specials() -> None:
    assert directive("#SBATCH", "job-name", "plain") == "#SBATCH --job-name=plain"
    assert directive("#SBATCH", "job-name", "a b") == '#SBATCH --job-name="a b"'
    assert directive("#SBATCH", "job-name", 'a"b#c') == '#SBATCH --job-name=a\\"b\\#c'
    assert directive("#SBATCH", "exclusive") == "#SBATCH --exclusive"
    assert directive("#PBS", "N", "x y") == '#PBS -N "x y"'
    with pytest.raises(QuotingError, match="newline"):
        directive("#SBATCH", "job-name", "a\nb")
    with pytest.raises(QuotingError):
        directive("#SBATCH", "bad key", "x")


def _sbatch_argument(text: str) -> str:
    """Re-implementation of sbatch's directive argument reader (src/sbatch/opt.c, _get_argument)
    used to check our escaping: backslash escapes, double quotes group, unquoted # ends the line."""
    out, quoted, escaped = [], False, False
    for ch in text:
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == "#" and not quoted:
            break
        elif ch.isspace() and not quoted:
            break
        else:
            out.append(ch)
    return "".join(out)


@pytest.mark.parametrize("value", [v for v in HOSTILE if "\n" not in v and v])
def test_directive_value_reads_back(value: str) -> None:
    line = directive("#SBATCH", "job-name", value)
    arg = line.split("=", 1)[1]
    assert _sbatch_argument(arg) == value
