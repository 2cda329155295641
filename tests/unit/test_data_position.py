"""Issue 67: a loader's place in the data is the job's, so a resume on another world size sees every sample
of the epoch once. Real loaders of torchhpc.dist.data, one object per rank (their rank and world given, as
each rank's own process would have them), on CPU tensors; the ledger's files read back as a test reads them.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import need

torch = need("torch")

from torchhpc.dist.data import TensorLoader, loader, strided_sampler  # noqa: E402
from torchhpc.dist.position import accumulation, read_ledger  # noqa: E402
from torchhpc.errors import UsageError  # noqa: E402

N, B = 48, 2


def tensor_loaders(world: int, ledger: str | None = None) -> list[TensorLoader]:
    data = torch.arange(N)
    return [TensorLoader(data, batch_size=B, seed=5, rank=r, world_size=world, ledger=ledger) for r in range(world)]


def take(loaders: list[TensorLoader], steps: int | None) -> tuple[list[int], list[object]]:
    """``steps`` batches from every rank in lockstep (None: to the epoch's end); the samples and the iterators."""
    its = [iter(x) for x in loaders]
    seen: list[int] = []
    n = 0
    while steps is None or n < steps:
        try:
            batches = [next(it) for it in its]
        except StopIteration:
            break
        seen.extend(int(v) for b in batches for v in b[0])
        n += 1
    return seen, its


def test_the_handed_out_samples_are_a_prefix_of_the_epochs_order() -> None:
    loaders = tensor_loaders(3)
    seen, _its = take(loaders, 3)
    order = torch.randperm(N, generator=torch.Generator().manual_seed(5)).tolist()
    assert sorted(seen) == sorted(order[: 3 * B * 3])
    assert {str(x.state_dict()) for x in loaders} == {str({"epoch": 0, "consumed": 18})}


@pytest.mark.parametrize("after", [2, 4, 1, 6])
def test_a_resume_on_another_world_sees_each_sample_once(after: int) -> None:
    first = tensor_loaders(3)
    seen, _its = take(first, 3)
    state = first[0].state_dict()
    rest = tensor_loaders(after)
    for x in rest:
        x.load_state_dict(state)
    more, _its = take(rest, None)
    counts = Counter(seen + more)
    assert set(counts) == set(range(N))
    pad = -(N - 18) % after  # without drop_last the last step is padded by wrapping, as DistributedSampler does
    assert sum(c - 1 for c in counts.values()) == pad
    assert rest[0].state_dict() == {"epoch": 1, "consumed": 0}


def test_a_finished_epoch_is_the_next_ones_start() -> None:
    loaders = tensor_loaders(2)
    take(loaders, None)
    assert loaders[1].state_dict() == {"epoch": 1, "consumed": 0}
    again = tensor_loaders(2)
    for x in again:
        x.load_state_dict({"epoch": 1, "consumed": 0})
    seen, _its = take(again, None)
    assert sorted(seen) == list(range(N))


def test_the_dataset_loader_keeps_distributed_samplers_order_and_resumes_the_same_way() -> None:
    from torch.utils.data import DistributedSampler, TensorDataset

    ds = TensorDataset(torch.arange(50))
    for r in range(3):
        ours = strided_sampler(50, rank=r, world_size=3, shuffle=True, seed=7, drop_last=False)
        theirs = DistributedSampler(ds, num_replicas=3, rank=r, shuffle=True, seed=7)  # type: ignore[arg-type]
        ours.set_epoch(2)
        theirs.set_epoch(2)
        assert list(ours) == list(theirs)
    first = [loader(ds, batch_size=B, seed=7, rank=r, world_size=3) for r in range(3)]
    its = [iter(x) for x in first]
    seen = [int(v) for _ in range(4) for it in its for v in next(it)[0]]
    state = first[0].state_dict()
    assert state == {"epoch": 0, "consumed": 24}
    rest = [loader(ds, batch_size=B, seed=7, rank=r, world_size=2) for r in range(2)]
    for x in rest:
        x.load_state_dict(state)
    seen += [int(v) for x in rest for batch in x for v in batch[0]]
    assert set(seen) == set(range(50)) and len(seen) == 50


def test_the_ledger_keeps_what_the_job_consumed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Attempt 0 hands out 5 steps on 3 ranks, checkpoints after 3; attempt 1 resumes from there on 2 ranks."""
    ledger = str(tmp_path / "ledger")
    monkeypatch.setenv("TORCHHPC_RESTART_COUNT", "0")
    first = tensor_loaders(3, ledger)
    its = [iter(x) for x in first]
    for _ in range(3):
        [next(it) for it in its]
    saved = first[0].state_dict()
    for _ in range(2):  # lost with the node: dealt again below
        [next(it) for it in its]
    monkeypatch.setenv("TORCHHPC_RESTART_COUNT", "1")
    rest = tensor_loaders(2, ledger)
    for x in rest:
        x.load_state_dict(saved)
    take(rest, None)
    consumed = read_ledger(ledger)
    assert set(consumed) == {0} and set(consumed[0]) == set(range(N)) and set(consumed[0].values()) == {1}


def test_accumulation_keeps_the_global_batch() -> None:
    assert accumulation(24, 2, world_size=6) == 2 and accumulation(24, 2, world_size=4) == 3
    with pytest.raises(UsageError) as e:
        accumulation(24, 2, world_size=5)
    assert "global batch of 24" in e.value.message and e.value.hint
