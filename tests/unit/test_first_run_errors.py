"""The first errors a new user meets, classified and shown (issue 51, item 4): a SyntaxError (Python
prints no "Traceback" header for it), ``python -m`` of a module that is not there, and a traceback
whose last frame is in the standard library (the user's own deepest frame is named, not pathlib.py)."""

from __future__ import annotations

from torchhpc.diagnose.classify import classify_text, user_file
from torchhpc.diagnose.hang_verdict import user_frame
from torchhpc.jobdir.logs import Line
from torchhpc.jobdir.tracebacks import first_tracebacks

SYNTAX = ['  File "/home/u/train.py", line 3', "    def f(:", "          ^", "SyntaxError: invalid syntax"]
INDENT = ['  File "/home/u/train.py", line 7', "    return x", "IndentationError: unexpected indent"]
NO_MODULE = ["/home/u/venv/bin/python: No module named nosuchmod"]
STDLIB = ["Traceback (most recent call last):",
          '  File "/home/u/train.py", line 6, in <module>', "    load(sys.argv[1])",
          '  File "/home/u/train.py", line 4, in load', "    return json.loads(pathlib.Path(p).read_text())",
          '  File "/root/.pyenv/versions/3.11.7/lib/python3.11/pathlib.py", line 1058, in read_text',
          "    with self.open(encoding=encoding, errors=errors) as f:",
          '  File "/usr/lib/python3.11/pathlib.py", line 1044, in open',
          "    return io.open(self, mode, buffering, encoding, errors, newline)",
          "FileNotFoundError: [Errno 2] No such file or directory: '/nonexistent/x.json'"]


def test_a_syntax_error_is_a_user_exception_at_its_line() -> None:
    assert classify_text(SYNTAX) == ("user-exception", "SyntaxError: invalid syntax", "/home/u/train.py:3")
    assert classify_text(INDENT) == ("user-exception", "IndentationError: unexpected indent", "/home/u/train.py:7")
    # torch's own rank prefix in front of it changes nothing
    assert classify_text([f"[rank0]: {t}" for t in SYNTAX])[0] == "user-exception"


def test_a_syntax_error_in_an_imported_file_is_named_there() -> None:
    tb = ["Traceback (most recent call last):", '  File "/home/u/train.py", line 1, in <module>', "    import model",
          '  File "/home/u/model.py", line 9', "    x = = 1", "        ^", "SyntaxError: invalid syntax"]
    assert classify_text(tb) == ("user-exception", "SyntaxError: invalid syntax", "/home/u/model.py:9")


def test_logs_errors_shows_a_syntax_error() -> None:
    lines = [Line(0, "rank 0 up")] + [Line(0, t) for t in SYNTAX] + [Line(1, "rank 1 up")]
    tbs = first_tracebacks(lines)
    assert tbs.by_rank == ((0, tuple(SYNTAX)),)
    assert "SyntaxError: invalid syntax" in tbs.render()


def test_a_missing_module_of_python_m_is_the_environment() -> None:
    assert classify_text(NO_MODULE) == ("environment", NO_MODULE[0], "")


def test_the_deepest_frame_in_the_users_files_is_named_not_the_stdlib() -> None:
    klass, error, where = classify_text(STDLIB)
    assert (klass, where) == ("user-exception", "/home/u/train.py:4") and error.startswith("FileNotFoundError")
    assert not user_file("/usr/lib/python3.11/pathlib.py") and not user_file("/opt/conda/lib/python3.12/json/decoder.py")
    assert not user_file("<frozen runpy>") and user_file("/home/u/lib/python/mine.py")
    # the hang watch's stacks (innermost first) skip the interpreter's library too
    frames = [("wait", "/usr/lib/python3.11/threading.py", 320), ("get", "/usr/lib/python3.11/queue.py", 171),
              ("load_batch", "/home/u/train.py", 21)]
    assert user_frame(frames) == "/home/u/train.py:21"
