"""core.shell: every value survives a real bash unchanged and nothing it carries runs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import HOSTILE
from torchhpc.core.shell import (
    Raw,
    TrustedScript,
    assignment,
    directive,
    export_lines,
    join,
    quote,
)
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


def test_f1_trailing_newline_is_never_a_safe_word(tmp_path: Path) -> None:
    """F1: ``$`` also matched before a final newline, so ``x\\n`` came out bare and the next
    argument started a new command line in the batch shell."""
    assert quote("x\n") != "x\n"
    script = join(["printf", "%s\\0", "train.py", "x\n", "touch", "PWNED"])
    out = run_bash(script, tmp_path)
    assert out.split("\0")[:4] == ["train.py", "x\n", "touch", "PWNED"]
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize("value", ["x\n", "a\n#PBS -q evil\n", "\r#SBATCH -p x", "tab\there", "\x1b[31m", "a\x7f"])
def test_f2_control_characters_never_reach_the_script_raw(value: str, tmp_path: Path) -> None:
    """F2: a value with a newline must not put a line start (``#PBS ...``) into a script
    sbatch or qsub reads line by line: it is written in bash's one-line ``$'...'`` form."""
    text = quote(value)
    assert "\n" not in text and "\r" not in text and text.startswith("$'")
    out = subprocess.run(["bash", "-c", "printf %s " + text], capture_output=True, check=True).stdout
    assert out == value.encode()


def test_undecodable_bytes_roundtrip_as_bytes(tmp_path: Path) -> None:
    value = b"caf\xe9-\xff".decode("utf-8", "surrogateescape")
    text = quote(value)
    text.encode("utf-8")  # the script file can hold it
    out = subprocess.run(["bash", "-c", "printf %s " + text], capture_output=True, check=True).stdout
    assert out == b"caf\xe9-\xff"
    with pytest.raises(QuotingError, match="NUL"):
        quote("a\0b")


def test_trusted_script_stays_a_readable_block() -> None:
    block = TrustedScript("set -e\n# a comment\nexec \"$@\"\n")
    assert quote(block) == "'set -e\n# a comment\nexec \"$@\"\n'"
    with pytest.raises(QuotingError, match="directive"):
        TrustedScript("echo\n#PBS -q x\n")


def test_env_names_reserved_prefix_and_identifiers() -> None:
    from torchhpc.core.validate import check_name

    assert check_name("OK_1") == "OK_1"
    for bad in ("_torchhpc_x", "_TORCHHPC_X", "A\n", "A-B", "1A", ""):
        with pytest.raises(QuotingError):
            check_name(bad)


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
    out: list[str] = []
    quoted, escaped = "", False
    for ch in text:
        if escaped:
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif quoted:
            if ch == quoted:
                quoted = ""
            else:
                out.append(ch)
        elif ch in "\"'":
            quoted = ch
        elif ch == "#":
            break
        elif ch.isspace():
            break
        else:
            out.append(ch)
    return "".join(out)


@pytest.mark.parametrize("value", [v for v in [*HOSTILE, "O'Brien", "it's a 'b'", "a\\'b"] if "\n" not in v and v])
def test_directive_value_reads_back(value: str) -> None:
    line = directive("#SBATCH", "job-name", value)
    arg = line.split("=", 1)[1]
    assert _sbatch_argument(arg) == value
