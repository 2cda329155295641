"""The pipeline file: run's flags as keys, every problem one line, steps in dependency order."""

from __future__ import annotations

from pathlib import Path

import pytest

from torchhpc import pipeline
from torchhpc.cli.main import main
from torchhpc.cli.pipeline_file import load_pipeline
from torchhpc.errors import ConfigError

pytestmark = pytest.mark.usefixtures("clean_user_env")

GOOD = """
name = "chain"
[defaults]
scheduler = "slurm"
output_dir = "runs"
env = {SEED = "1"}

[steps.eval]
program = "examples/pi.py --steps 10"
after = ["train"]
after_fail = ["prep"]

[steps.prep]
program = ["examples/pi.py"]
opt = {constraint = "big"}
exclude = "node3"

[steps.train]
program = ["examples/pi.py"]
nodes = 2
nproc-per-node = 2
launcher = "srun"
time = "00:10:00"
requeue = true
after = ["prep"]
"""


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "p.toml"
    path.write_text(text)
    return str(path)


def test_steps_mean_what_runs_flags_mean(tmp_path: Path) -> None:
    name, steps = load_pipeline(write(tmp_path, GOOD))
    assert name == "chain"
    by = {s.name: s for s in steps}
    train = by["train"].spec
    assert (train.nodes, train.nproc_per_node, str(train.launcher), train.time, train.requeue) == (2, 2, "srun", "00:10:00", True)
    assert train.name == "train" and train.output_dir == "runs" and train.env_dict["SEED"] == "1"
    assert by["prep"].spec.options_dict == {"constraint": "big", "exclude": "node3"}
    assert by["eval"].spec.entrypoint.args == ("--steps", "10")
    assert by["eval"].after == (("ok", "train"), ("fail", "prep"))
    assert [s.name for s in pipeline.check(steps)] == ["prep", "train", "eval"]  # parents first


def test_every_problem_is_one_line_and_nothing_else_happens(tmp_path: Path) -> None:
    bad = """
[defaults]
scheduler = "slurm"
[steps.a]
program = ["examples/pi.py"]
nodez = 2
after = ["c"]
[steps.b]
program = ["examples/pi.py"]
nodes = "two"
after = ["zzz"]
[steps.c]
program = ["examples/pi.py"]
mem = "12"
after = ["a"]
[steps.d]
scheduler = "local"
program = ["examples/pi.py"]
after = ["a"]
"""
    with pytest.raises(ConfigError) as e:
        load_pipeline(write(tmp_path, bad))
    lines = e.value.message.splitlines()
    assert len(lines) == 6, lines
    assert any("step a: unknown key 'nodez' (did you mean nodes?)" in x for x in lines)
    assert any("step b: nodes = 'two' is not a whole number" in x for x in lines)
    assert any("step c: mem = '12' has no unit" in x for x in lines)
    assert any("step b: after names 'zzz', which is no step" in x for x in lines)
    assert any("the steps a -> c -> a wait for each other in a cycle" in x for x in lines)
    assert any("step d (local) cannot wait for step a (slurm)" in x for x in lines)


def test_the_cli_prints_the_lines_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, '[steps.a]\nprogram = ["examples/pi.py"]\nafter = ["a"]\n')
    assert main(["pipeline", path]) == 2
    err = capsys.readouterr().err
    assert "step a: after names the step itself" in err and "HINT: fix the lines above; nothing was submitted" in err


@pytest.mark.parametrize("name", ["train v2", "\u00fcn\u00ef", "-x", "a/b", "a" * 64])
def test_a_step_name_outside_the_rule_is_refused_when_the_file_is_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str) -> None:
    """Such a name would reach the job name, the status table, `logs STEP` and the dry run's <STEP>
    placeholder; the reader refuses it, naming the step and the characters allowed (docs/pipelines.md)."""
    path = write(tmp_path, f'[steps."{name}"]\nprogram = ["examples/pi.py"]\n'
                           f'[steps.next]\nprogram = ["examples/pi.py"]\nafter = ["{name}"]\n')
    assert main(["pipeline", path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert f"step {name!r}: a step's name is 1-63 ASCII letters, digits, '_', '.' or '-'" in err, err
    assert "<" not in err and "--after-ok" not in err, err  # no placeholder, no flag the user never typed
    assert err.count("\n") == 2, err  # one line, and the HINT


def test_good_step_names_go_everywhere(tmp_path: Path) -> None:
    path = write(tmp_path, '[steps."train.v2_b-1"]\nprogram = ["examples/pi.py"]\n'
                           '[steps.eval]\nprogram = ["examples/pi.py"]\nafter = ["train.v2_b-1"]\n')
    _, steps = load_pipeline(path)
    assert [s.name for s in pipeline.check(steps)] == ["train.v2_b-1", "eval"]
    assert steps[0].spec.name == "train.v2_b-1"
    assert pipeline.render(steps)[1][1].script is not None


def test_an_option_error_names_the_key_as_written_with_the_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, '[defaults]\nscheduler = "slurm"\n'
                           '[steps.X]\nprogram = ["examples/pi.py"]\npartition = "p\\nx"\n'
                           '[steps.Y]\nprogram = ["examples/pi.py"]\nopt = {constraint = "a\\nb"}\n'
                           '[steps.Z]\nprogram = ["examples/pi.py"]\nnproc-per-node = 0\n')
    assert main(["pipeline", path, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "step X: partition = 'p\\nx' contains a newline or carriage return" in err, err
    assert "step Y: opt.constraint = 'a\\nb' contains a newline" in err, err
    assert "step Z: nproc-per-node = 0 must be at least 1" in err, err
    assert "--opt" not in err and "--partition" not in err and "--nproc" not in err, err


def test_the_command_line_names_its_own_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--scheduler", "slurm", "--dry-run", "--partition", "p\nx", "examples/pi.py"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Error: --partition 'p\\nx' contains a newline") and "--opt" not in err, err


def test_dry_run_renders_every_step_with_its_parents_as_placeholders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pipeline", write(tmp_path, GOOD), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert [line for line in out.splitlines() if line.startswith("# =====")] == [
        "# ===== step prep =====", "# ===== step train =====", "# ===== step eval ====="]
    assert "#SBATCH --dependency=afterok:<prep>\n" in out
    assert "#SBATCH --dependency=afterok:<train>,afternotok:<prep>\n" in out


def test_descendants_are_what_cancel_stops() -> None:
    rec = pipeline.PipelineRecord("id", "p", "", steps=[
        {"name": "prep", "scheduler": "slurm", "job_id": "1", "after": []},
        {"name": "train", "scheduler": "slurm", "job_id": "2", "after": [["ok", "prep"]]},
        {"name": "report", "scheduler": "slurm", "job_id": "4", "after": [["any", "train"]]},
        {"name": "other", "scheduler": "slurm", "job_id": "3", "after": []},
    ])
    assert pipeline.descendants(rec, "prep") == ["prep", "train", "report"]
    assert pipeline.descendants(rec, "train") == ["train", "report"]
    with pytest.raises(ConfigError, match="has no step 'nope'"):
        pipeline.descendants(rec, "nope")


def test_a_record_is_found_by_file_record_and_id(tmp_path: Path) -> None:
    rec = pipeline.PipelineRecord("20261126-010203-abcd", "p", str(tmp_path / "p.toml"),
                                  steps=[{"name": "a", "scheduler": "local", "job_id": "x", "after": []}])
    pipeline._save(rec, str(tmp_path / "out"))
    for what in (str(tmp_path / "p.toml"), rec.path, rec.id):
        assert pipeline.find_record(what).steps == rec.steps
    with pytest.raises(ConfigError, match="has not been submitted from here"):
        pipeline.find_record(str(tmp_path / "other.toml"))
