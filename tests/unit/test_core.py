"""core.hostlist, core.units and core.spec: table tests from Slurm's documented formats."""

from __future__ import annotations

import pytest

from torchhpc.core.hostlist import compress, expand, first_host, read_nodefile
from torchhpc.core.spec import ContainerSpec, Entrypoint, JobSpec
from torchhpc.core.units import counted, format_bytes, format_walltime, parse_size, parse_walltime, plural
from torchhpc.errors import SpecError


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3,7]", ["node1", "node2", "node3", "node7"]),
        ("gpu[01-04]", ["gpu01", "gpu02", "gpu03", "gpu04"]),
        ("gpu[08-10]", ["gpu08", "gpu09", "gpu10"]),
        ("a[1-2]-b[3-4]", ["a1-b3", "a1-b4", "a2-b3", "a2-b4"]),
        ("as01r1b[05,07],as02r2b01", ["as01r1b05", "as01r1b07", "as02r2b01"]),
        ("nid[005123-005124],login1", ["nid005123", "nid005124", "login1"]),
        ("a1-[1-3]-b", ["a1-1-b", "a1-2-b", "a1-3-b"]),
        ("", []),
    ],
)
def test_expand(text: str, hosts: list[str]) -> None:
    assert expand(text) == hosts


@pytest.mark.parametrize("bad", ["node[1-", "node1]", "node[a-b]", "node[3-1]"])
def test_expand_rejects(bad: str) -> None:
    with pytest.raises(SpecError):
        expand(bad)


def test_compress_roundtrip() -> None:
    for text in ["node[1-3,7]", "gpu[01-04]", "login1,node[1-2]"]:
        assert expand(compress(expand(text))) == expand(text)
    assert compress(["node1", "node2", "node3", "node7"]) == "node[1-3,7]"
    assert first_host("gpu[02-04]") == "gpu02"


def test_nodefile_dedup_keeps_order() -> None:
    assert read_nodefile("n2\nn2\nn1\nn1\n\n") == ["n2", "n1"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 1800), ("00:05:30", 330), ("01:30:00", 5400), ("2-00:00:00", 172800), ("1-12", 129600), ("1-0:30", 88200)],
)
def test_walltime(text: str, seconds: int) -> None:
    assert parse_walltime(text) == seconds
    assert parse_walltime(format_walltime(seconds)) == seconds


def test_walltime_mm_ss_is_refused_with_both_readings() -> None:
    """`--time 1:30` meant an hour and a half; Slurm would read 90 seconds (issue 50)."""
    with pytest.raises(SpecError) as e:
        parse_walltime("1:30", "--time")
    assert "ambiguous" in e.value.message and "90 s" in e.value.message
    assert "01:30:00" in (e.value.hint or "") and "00:01:30" in (e.value.hint or "")


@pytest.mark.parametrize("bad", ["1:99:00", "abc", "0", "-5", "1:2:3:4"])
def test_walltime_rejects(bad: str) -> None:
    with pytest.raises(SpecError, match="time"):
        parse_walltime(bad)


def test_sizes() -> None:
    assert parse_size("128M") == 128 * 2**20
    assert parse_size("8G") == 8 * 2**30
    assert parse_size("1K") == 1024
    assert parse_size("4096") == 4096
    assert format_bytes(8 * 2**30) == "8G"
    with pytest.raises(SpecError, match="not a size"):
        parse_size("lots")


def test_spec_geometry_and_errors() -> None:
    e = Entrypoint.parse(["train.py", "--lr", "1"])
    assert e.argv("py") == ["py", "train.py", "--lr", "1"]
    assert Entrypoint.parse([], module="pkg.m").script_argv() == ["-m", "pkg.m"]
    assert Entrypoint.parse(["hostname"]).argv() == ["hostname"]
    s = JobSpec(e, nodes=2, nproc_per_node=4, launcher="srun")
    assert s.world_size == 8 and s.expected_tasks_per_node() == 4
    assert JobSpec(e, nproc_per_node=4).expected_tasks_per_node() == 1
    with pytest.raises(SpecError, match="torchrun's one task per node"):
        JobSpec(e, nproc_per_node=4, launcher="torchrun", ntasks_per_node=4)
    with pytest.raises(SpecError, match="one task per process"):
        JobSpec(e, nproc_per_node=4, launcher="srun", ntasks_per_node=1)
    with pytest.raises(SpecError, match="at least 1"):
        JobSpec(e, nodes=0)
    with pytest.raises(SpecError, match="not a launcher"):
        JobSpec(e, launcher="mpiexec")
    with pytest.raises(SpecError, match="wall time"):
        JobSpec(e, time="soon")
    with pytest.raises(SpecError, match="container runtime"):
        ContainerSpec("img", runtime="lxc")


def test_counted_says_one_or_many_never_parenthesised() -> None:
    assert [counted(n, "node") for n in (0, 1, 2)] == ["0 nodes", "1 node", "2 nodes"]
    assert counted(1, "process", "processes") == "1 process" and counted(3, "process", "processes") == "3 processes"


def test_no_message_counts_with_a_parenthesised_plural() -> None:
    """`1 node(s) x 2 rank(s)` on every submit: counts read as a person writes them (core.units.counted)."""
    import re
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "src" / "torchhpc"
    found = [f"{p.relative_to(src)}:{i}" for p in src.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\}\s*[\w ]*\w\((s|es)\)", line) and "help=" not in line]
    assert not found, found


def test_plural_is_the_word_alone() -> None:
    assert [plural(n, "rank") for n in (0, 1, 2)] == ["ranks", "rank", "ranks"]
    assert plural(1, "is", "are") == "is" and plural(3, "is", "are") == "are" and plural(1.0, "day") == "day"
