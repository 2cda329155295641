"""Where the suite's CPU goes, by process: which programs, how many, and how many of them imported torch.

scripts/test_times.py says which tests take the time; on two cores the full suite is CPU-bound, and what
would make it shorter is less work, so this says whose work it is. Two sources, both optional:

- **Process accounting** (Debian's ``acct``: ``accton FILE``): every process that ended, killed ones
  and container ranks included, with its CPU time and command name (``pt_elastic``: torchrun's agent,
  which renames its main thread). ``--acct FILE`` reads ``dump-acct FILE``'s lines.
- **A shim in the venv** (``install VENV FILE``): a sitecustomize that appends one JSON line per Python
  process at a normal exit: its argv, CPU, and whether it imported torch, Lightning or transformers.
  A killed process writes none, so the shim sees less than accounting does. ``uninstall VENV`` removes it.

    python scripts/cpu_census.py install .venv /tmp/procs.jsonl && accton /tmp/pacct
    CI=true ./scripts/test.sh
    accton off; python scripts/cpu_census.py uninstall .venv
    python scripts/cpu_census.py report --acct /tmp/pacct --procs /tmp/procs.jsonl

docs/testing.md ("Where the CPU goes") has a run's tables.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

HEAVY = ("torch", "lightning", "transformers")
SHIM = '''# scripts/cpu_census.py's shim (measurement only; `cpu_census.py uninstall` removes it)
import atexit, json, os, resource, sys, time

_T0 = time.time()


def _census_line() -> None:
    try:
        r = resource.getrusage(resource.RUSAGE_SELF)
        heavy = [m for m in {heavy!r} if m in sys.modules]
        line = json.dumps({{"argv": [str(a)[:120] for a in sys.argv[:4]], "cpu": round(r.ru_utime + r.ru_stime, 2),
                           "wall": round(time.time() - _T0, 2), "heavy": heavy,
                           "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0][:160]}})
        fd = os.open({out!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        os.write(fd, (line + "\\n").encode())
        os.close(fd)
    except Exception:
        pass


atexit.register(_census_line)
'''


def _site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise SystemExit(f"Error: no lib/python3*/site-packages under {venv}: give the venv's folder (e.g. .venv)")
    return found[0]


def install(venv: Path, out: Path) -> None:
    target = _site_packages(venv) / "sitecustomize.py"
    if target.exists() and "cpu_census" not in target.read_text():
        raise SystemExit(f"Error: {target} exists and is not the census shim: move it aside first")
    out.touch()
    out.chmod(0o666)  # ranks of other users (the dev cluster's login user) append too
    target.write_text(SHIM.format(heavy=HEAVY, out=str(out.resolve())))
    print(f"cpu_census: every Python process of {venv} appends to {out} at exit; uninstall when done")


def uninstall(venv: Path) -> None:
    target = _site_packages(venv) / "sitecustomize.py"
    if target.exists() and "cpu_census" in target.read_text():
        target.unlink()
        print(f"cpu_census: removed {target}")


def program(argv: list[str]) -> str:
    """A process's program as a reader names it: the script, ``torchhpc SUBCOMMAND``, or ``torchrun``."""
    if not argv:
        return "?"
    head, rest = argv[0], argv[1:]
    name = Path(head).name
    if name == "__main__.py":  # python -m PACKAGE
        name = Path(head).parent.name
    if name == "torchhpc" and rest:
        return f"torchhpc {rest[0]}"
    if head.endswith("torch/distributed/run.py") or name == "torchrun":
        return "torchrun (agent)"
    if name == "-c":
        return "python -c"
    return name


def acct_table(text: str) -> list[tuple[str, int, float]]:
    """(command, processes, CPU-seconds) from ``dump-acct``'s lines, most CPU first."""
    by: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for line in text.splitlines():
        f = [x.strip() for x in line.split("|")]
        if len(f) < 4:
            continue
        try:
            cpu = (float(f[2]) + float(f[3])) / 100.0  # clock ticks of 1/100 s
        except ValueError:
            continue
        by[f[0]][0] += 1
        by[f[0]][1] += cpu
    return sorted(((k, int(v[0]), v[1]) for k, v in by.items()), key=lambda r: -r[2])


def procs_table(lines: list[dict]) -> list[tuple[str, int, int, float]]:
    """(program, processes, of them with torch imported, CPU-seconds), most CPU first."""
    by: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for p in lines:
        k = program(p.get("argv", []))
        by[k][0] += 1
        by[k][1] += "torch" in p.get("heavy", [])
        by[k][2] += float(p.get("cpu", 0.0))
    return sorted(((k, int(v[0]), int(v[1]), v[2]) for k, v in by.items()), key=lambda r: -r[3])


def report(acct: Path | None, procs: Path | None, top: int) -> None:
    if acct is not None:
        text = subprocess.run(["dump-acct", str(acct)], capture_output=True, text=True, check=True).stdout
        rows = acct_table(text)
        total = sum(r[2] for r in rows)
        print(f"Process accounting: {sum(r[1] for r in rows)} processes, {total / 60:.1f} CPU-minutes\n")
        print("| CPU-min | share | processes | command |\n|---:|---:|---:|---|")
        for name, n, cpu in rows[:top]:
            print(f"| {cpu / 60:.1f} | {cpu / total:.0%} | {n} | {name} |")
        print()
    if procs is not None:
        lines = [json.loads(x) for x in procs.read_text().splitlines() if x.strip()]
        prows = procs_table(lines)
        total = sum(r[3] for r in prows)
        torch_n = sum(r[2] for r in prows)
        torch_cpu = sum(float(p["cpu"]) for p in lines if "torch" in p.get("heavy", []))
        print(f"The shim: {len(lines)} Python processes ended normally, {total / 60:.1f} CPU-minutes; "
              f"{torch_n} imported torch ({torch_cpu / 60:.1f} CPU-minutes, {torch_cpu / max(total, 1e-9):.0%})\n")
        print("| CPU-s | processes | with torch | CPU-s each | program |\n|---:|---:|---:|---:|---|")
        for name, n, t, cpu in prows[:top]:
            print(f"| {cpu:.0f} | {n} | {t} | {cpu / n:.2f} | {name} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("install", help="put the shim into a venv")
    i.add_argument("venv", type=Path)
    i.add_argument("out", type=Path, help="the JSON-lines file every process appends to")
    u = sub.add_parser("uninstall", help="take the shim out of a venv")
    u.add_argument("venv", type=Path)
    r = sub.add_parser("report", help="the tables")
    r.add_argument("--acct", type=Path, help="a process-accounting file (accton FILE)")
    r.add_argument("--procs", type=Path, help="the shim's JSON lines")
    r.add_argument("--top", type=int, default=20)
    a = ap.parse_args(argv)
    if a.cmd == "install":
        install(a.venv, a.out)
    elif a.cmd == "uninstall":
        uninstall(a.venv)
    else:
        if a.acct is None and a.procs is None:
            ap.error("report needs --acct FILE, --procs FILE, or both")
        report(a.acct, a.procs, a.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
