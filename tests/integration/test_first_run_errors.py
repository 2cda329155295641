"""A new user's first failed runs, through the CLI (issue 51, item 4): ``torchhpc run`` of a file with a
SyntaxError, of ``-m`` a module that is not installed, and of a program that fails inside pathlib."""

from __future__ import annotations

import os
import re
from pathlib import Path

from tests.cli_run import torchhpc


def _run(tmp_path: Path, *argv: str) -> tuple[str, str]:
    r = torchhpc(dict(os.environ), "run", "-n", "1", *argv, cwd=tmp_path, timeout=200)
    assert r.returncode != 0
    m = re.search(r"local:([0-9a-f]{10})", r.stderr) or re.search(r"jobs/local/([0-9a-f]{10})/", r.stderr)
    assert m, r.stderr
    return r.stderr, f"local:{m.group(1)}"


def test_a_syntax_error_is_classified_and_shown_by_logs_errors(clean_user_env: None, tmp_path: Path) -> None:
    (tmp_path / "syn.py").write_text("import os\n\ndef f(:\n    pass\n")
    err, handle = _run(tmp_path, str(tmp_path / "syn.py"))
    assert "diagnosis: user-exception" in err and "SyntaxError: invalid syntax" in err, err  # was: unknown
    assert f"at {tmp_path / 'syn.py'}:3" in err, err
    shown = torchhpc(dict(os.environ), "logs", handle, "--errors", cwd=tmp_path)
    assert "SyntaxError: invalid syntax" in shown.stdout and "No traceback" not in shown.stderr, shown.stdout + shown.stderr


def test_python_m_of_a_missing_module_is_the_environment(clean_user_env: None, tmp_path: Path) -> None:
    r = torchhpc(dict(os.environ), "run", "-n", "1", "-m", "nosuchmod_torchhpc", cwd=tmp_path, timeout=200)
    assert r.returncode != 0
    assert "diagnosis: environment" in r.stderr and "No module named nosuchmod_torchhpc" in r.stderr, r.stderr


def test_a_failure_inside_the_stdlib_names_the_users_line(clean_user_env: None, tmp_path: Path) -> None:
    prog = tmp_path / "badjson.py"
    prog.write_text("import json, pathlib, sys\n\ndef load(p):\n    return json.loads(pathlib.Path(p).read_text())\n\n"
                    "load(sys.argv[1])\n")
    err, _handle = _run(tmp_path, str(prog), str(tmp_path / "missing.json"))
    assert "diagnosis: user-exception" in err and f"at {prog}:4" in err, err
    assert "pathlib.py" not in "\n".join(ln for ln in err.splitlines() if ln.startswith("  at ")), err
