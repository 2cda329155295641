"""The rules that decide which documented commands run (tests/doc_commands.py; the run itself is
tests/integration/test_docs_run.py on the dev cluster): each rule still matches something, the
commands a reader starts with run, and what the README's commands need is installed by setup.sh."""

from __future__ import annotations

import re

from tests.conftest import REPO
from tests.doc_commands import SKIPS, all_commands, skip_reason


def test_every_rule_is_used_and_most_commands_run() -> None:
    commands = all_commands()
    used = {c.skip.split(":")[0] for c in commands if c.skip}
    assert {rule for rule, _p, _r in SKIPS} <= used, "a skip rule matches no documented command: drop it"
    runs = [c for c in commands if not c.skip]
    assert len(runs) >= 35, [c.where for c in runs]
    readme = [c.command for c in runs if c.where.startswith("README.md:")]
    assert any(c.startswith("torchhpc run -n 4 examples/pi.py") for c in readme)
    assert any("--launcher srun examples/pi.py --wait" in c for c in readme)  # a real job on the dev cluster
    assert any("--plot ar.png" in c for c in readme) and any("--array 0-15%4" in c for c in readme)


def test_rules() -> None:
    assert skip_reason("torchhpc run --scheduler slurm --gpus-per-node 4 --dry-run train.py") == ""
    assert skip_reason("torchhpc run --scheduler slurm --gpus-per-node 4 train.py").startswith("gpu:")
    assert skip_reason("torchhpc run ... --dry-run").startswith("elided:")
    assert skip_reason("torchhpc logs slurm:123 --rank 3   # ... then more") .startswith("placeholder:")
    assert skip_reason("torchhpc logs slurm:1_2 --rank 0").startswith("placeholder:")
    assert skip_reason("torchhpc status slurm:1234") == ""
    assert skip_reason("sudo torchhpc devcluster up --nodes 3").startswith("machine:")
    assert skip_reason("torchhpc bench explain") == ""


def test_setup_installs_what_the_readme_uses() -> None:
    """`--plot ar.png` needs matplotlib, `Executor` cloudpickle, a named hang and top's COLL% py-spy:
    scripts/setup.sh always installs the plot, function and diagnose extras, which have them (issue 50)."""
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert re.search(r'^EXTRAS="plot,function,diagnose\$\{1:\+,\$1\}"', setup, re.M), setup
    pyproject = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^plot = \["matplotlib', pyproject, re.M)
    assert re.search(r'^function = \["cloudpickle', pyproject, re.M)
    assert re.search(r'^diagnose = \["py-spy', pyproject, re.M)
    assert "bench sweep --scheduler slurm -N 1,2,4 -n 4 --out sweep/ --dry-run" in (REPO / "README.md").read_text()
