"""Record the subgroup dumps of this directory (``gloo<W>-<LAYOUT>-<MODE>/``) from real gloo jobs.

Each case runs tests/integration/scripts/planted_subgroup.py under the local scheduler,
``torchhpc run -n W --hang-timeout 6 planted_subgroup.py LAYOUT MODE BAD``, and copies the Flight
Recorder dumps its ranks wrote into the job directory's ``fr/`` (``rank-N`` on the hang watch's
request, ``rank-N.left`` at an exit with the process group still up). A size mismatch in a pair leaves
no dumps: gloo aborts both ranks ("Received data size doesn't match"), so it is recorded in a group of 4
ranks only. Run from the repository root:
``.venv/bin/python tests/data/flight_recorder/record_subgroups.py [W:LAYOUT:MODE:BAD ...]``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLANTED = HERE.parent.parent / "integration" / "scripts" / "planted_subgroup.py"
CASES = ("4:pairs:skip:3", "4:strides:skip:3", "4:row:skip:3", "4:col:skip:3", "4:pairs:gather:3",
         "4:pairs:finish:3", "8:halves:skip:5", "8:strides:skip:5", "8:pairs:skip:5",
         "8:row:skip:5", "8:col:skip:5", "8:halves:size:5", "8:halves:gather:5", "8:row:finish:5")


def record(case: str) -> str:
    world, layout, mode, bad = case.split(":")
    state = tempfile.mkdtemp(prefix="fr-record-")
    env = {**os.environ, "TORCHHPC_STATE_DIR": state}
    done = subprocess.run([sys.executable, "-m", "torchhpc", "run", "-n", world, "--hang-timeout", "6",
                           str(PLANTED), layout, mode, bad], env=env, capture_output=True, text=True, timeout=600)
    [job] = (Path(state) / "jobs" / "local").iterdir()
    out = HERE / f"gloo{world}-{layout}-{mode}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    for f in sorted((job / "fr").glob("rank-*")):
        if not f.name.endswith(".error"):
            shutil.copy(f, out / f.name)
    said = [ln for ln in done.stderr.splitlines() if ln.startswith(("torchhpc: hang:", "diagnosis:"))]
    shutil.rmtree(state, ignore_errors=True)
    return f"{case}: rc {done.returncode}, {len(list(out.iterdir()))} dumps\n  " + "\n  ".join(said)


if __name__ == "__main__":
    for c in sys.argv[1:] or CASES:
        print(record(c), flush=True)
