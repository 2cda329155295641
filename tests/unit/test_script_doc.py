"""docs/script.md shows the srun render after issue 25: its "After" block is the srun golden, kept equal.

The golden is regenerated with ``TORCHHPC_REGEN_GOLDEN=1``; the same command rewrites the block here.
The "Before" block is history (main at 18d5283) and is not checked.
"""

from __future__ import annotations

import os
import re

from tests.conftest import REPO

DOC = REPO / "docs" / "script.md"
GOLDEN = REPO / "tests" / "golden" / "slurm" / "srun.sbatch"
BLOCK = re.compile(r"(<!-- after: tests/golden/slurm/srun\.sbatch[^\n]*-->\n```shell\n)(.*?)(```\n)", re.S)


def test_after_block_is_the_srun_golden() -> None:
    text = DOC.read_text()
    m = BLOCK.search(text)
    assert m, "docs/script.md lost its After block marker"
    golden = GOLDEN.read_text()
    if os.environ.get("TORCHHPC_REGEN_GOLDEN") == "1" and m.group(2) != golden:
        DOC.write_text(text[: m.start(2)] + golden + text[m.end(2) :])
        return
    assert m.group(2) == golden, "docs/script.md's After block differs from tests/golden/slurm/srun.sbatch: " \
        "TORCHHPC_REGEN_GOLDEN=1 pytest tests/unit/test_slurm_render.py tests/unit/test_script_doc.py"
