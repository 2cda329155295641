"""torchhpc.dist helpers in one process: sharding, epoch handling, data, wrap, sync.

Multi-rank behaviour (main_first ordering and failure propagation, DDP across
ranks) is tested with real processes in tests/integration/test_examples_train.py;
here a one-rank gloo group on an in-memory store stands in where a group is needed.
"""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler, TensorDataset

from torchhpc.dist import data, datasets, ddp, sync
from torchhpc.errors import UsageError

# ------------------------------------------------------------------ sharding


@pytest.mark.parametrize("n,world,drop_last", [(10, 3, False), (10, 3, True), (12, 4, False), (5, 8, False), (7, 2, True)])
@pytest.mark.parametrize("shuffle", [True, False])
def test_shard_indices_match_torch_distributed_sampler(n: int, world: int, drop_last: bool, shuffle: bool) -> None:
    """Same permutation, padding and striding as DistributedSampler, so both paths see the same samples."""
    ds = TensorDataset(torch.arange(n))
    for epoch in (0, 3):
        for r in range(world):
            ref = DistributedSampler(ds, num_replicas=world, rank=r, shuffle=shuffle, seed=7, drop_last=drop_last)
            ref.set_epoch(epoch)
            ours = data.shard_indices(n, epoch, rank=r, world_size=world, shuffle=shuffle, seed=7, drop_last=drop_last)
            assert ours.tolist() == list(ref)


def test_shards_cover_everything_once_when_divisible() -> None:
    parts = [data.shard_indices(12, 1, rank=r, world_size=3, shuffle=True, seed=0, drop_last=False) for r in range(3)]
    assert sorted(torch.cat(parts).tolist()) == list(range(12))
    assert {len(p) for p in parts} == {4}


# -------------------------------------------------------------- TensorLoader


def test_tensor_loader_reshuffles_every_epoch_without_set_epoch() -> None:
    x = torch.arange(40).float().unsqueeze(1) * 10
    y = torch.arange(40)
    tl = data.TensorLoader(x, y, batch_size=8, seed=3, rank=0, world_size=1)
    first = torch.cat([b[1] for b in tl])
    second = torch.cat([b[1] for b in tl])
    assert sorted(first.tolist()) == sorted(second.tolist()) == list(range(40))
    assert first.tolist() != second.tolist()  # the epoch advanced by itself
    tl.set_epoch(0)
    again = torch.cat([b[1] for b in tl])
    assert again.tolist() == first.tolist()  # resuming at epoch 0 replays it


def test_tensor_loader_rows_stay_paired_and_sharded() -> None:
    x = torch.arange(21).float() * 2
    y = torch.arange(21)
    seen = []
    for r in range(2):
        tl = data.TensorLoader(x, y, batch_size=4, rank=r, world_size=2)
        assert len(tl) == 3  # ceil(ceil(21/2)=11 / 4)
        for bx, by in tl:
            assert torch.equal(bx, by.float() * 2)
            seen += by.tolist()
    assert set(seen) == set(range(21)) and len(seen) == 22  # one padded sample, as DistributedSampler


def test_tensor_loader_drop_last_gives_full_batches_only() -> None:
    tl = data.TensorLoader(torch.arange(30), batch_size=7, drop_last=True, rank=1, world_size=2)
    sizes = [b[0].shape[0] for b in tl]
    assert sizes == [7, 7] and len(tl) == 2


def test_tensor_loader_refuses_mismatched_tensors() -> None:
    with pytest.raises(UsageError, match="tensor 1 has 3 rows but tensor 0 has 4"):
        data.TensorLoader(torch.zeros(4), torch.zeros(3), batch_size=2)
    with pytest.raises(UsageError, match="batch_size=0"):
        data.TensorLoader(torch.zeros(4), batch_size=0)


# ------------------------------------------------------------------- loader()


def test_loader_sets_epoch_on_its_distributed_sampler() -> None:
    ds = TensorDataset(torch.arange(32))
    el = data.loader(ds, 4, rank=1, world_size=2, seed=5)
    assert isinstance(el.sampler, DistributedSampler)
    e0 = [int(v) for (b,) in el for v in b]
    assert el.sampler.epoch == 0
    e1 = [int(v) for (b,) in el for v in b]
    assert el.sampler.epoch == 1
    assert e0 != e1 and len(e0) == len(e1) == 16
    assert el.batch_size == 4 and len(el) == 4  # DataLoader attributes pass through


def test_loader_single_process_still_reshuffles_reproducibly() -> None:
    ds = TensorDataset(torch.arange(20))
    a = [int(v) for (b,) in data.loader(ds, 5, seed=1) for v in b]
    el = data.loader(ds, 5, seed=1)
    first = [int(v) for (b,) in el for v in b]
    second = [int(v) for (b,) in el for v in b]
    assert first == a and first != second and sorted(second) == list(range(20))


def test_loader_refuses_a_custom_sampler() -> None:
    with pytest.raises(UsageError, match="DistributedSampler"):
        data.loader(TensorDataset(torch.arange(4)), 2, sampler=[0, 1, 2, 3])


# ---------------------------------------------------------------------- sync


def test_sync_helpers_without_a_group_are_single_process() -> None:
    t = torch.tensor([1.0, 3.0])
    out = sync.all_reduce_mean(t)
    assert torch.equal(out, t) and out is not t
    assert sync.all_reduce_mean(torch.tensor([3])).dtype == torch.float64
    assert sync.average_metrics({"b": 2, "a": 1.5}, weight=10) == {"a": 1.5, "b": 2.0}
    with sync.main_first() as first:
        assert first is True
    assert sync.rank() == 0 and sync.world_size() == 1
    sync.barrier()


def test_sync_helpers_in_a_one_rank_group(one_rank_group: None) -> None:
    assert sync.is_distributed()
    assert sync.all_reduce_sum(torch.tensor([2.0])).item() == 2.0
    assert sync.all_reduce_max(torch.tensor([5.0, 1.0])).tolist() == [5.0, 1.0]
    assert sync.average_metrics({"loss": 0.5, "acc": 0.9}, weight=3) == pytest.approx({"loss": 0.5, "acc": 0.9})
    with sync.main_first() as first:
        assert first is True
    with sync.main_first(local=True) as first:  # hostname exchange: lowest rank on this host
        assert first is True
    with sync.main_first(first=False) as first:  # a waiter that finds everyone fine
        assert first is False


def test_main_first_failure_is_reraised_on_the_first_rank(one_rank_group: None) -> None:
    with pytest.raises(ValueError, match="download broke"), sync.main_first():
        raise ValueError("download broke")
    # the collective inside main_first completed: the group still works afterwards
    assert sync.all_reduce_sum(torch.tensor([1.0])).item() == 1.0


def test_seed_everything_is_reproducible() -> None:
    s = sync.seed_everything(11)
    a = torch.rand(3)
    assert s == 11
    sync.seed_everything(11)
    assert torch.equal(a, torch.rand(3))


# ---------------------------------------------------------------------- wrap


def test_wrap_without_a_group_returns_the_plain_model() -> None:
    m = torch.nn.Linear(2, 2)
    out = ddp.wrap(m, device="cpu")
    assert out is m and ddp.unwrap(out) is m


def test_wrap_in_a_group_gives_ddp_with_our_defaults(one_rank_group: None) -> None:
    m = torch.nn.Linear(2, 2)
    w = ddp.wrap(m, device="cpu", bucket_cap_mb=1, static_graph=True)
    assert type(w).__name__ == "DistributedDataParallel"
    assert ddp.unwrap(w) is m
    assert w.gradient_as_bucket_view is True  # type: ignore[comparison-overlap]
    w(torch.ones(1, 2)).sum().backward()
    assert m.weight.grad is not None


def test_wrap_refuses_bad_options(one_rank_group: None) -> None:
    with pytest.raises(UsageError, match="strategy='zero'"):
        ddp.wrap(torch.nn.Linear(1, 1), strategy="zero")
    with pytest.raises(UsageError, match="compression='int8'"):
        ddp.wrap(torch.nn.Linear(1, 1), compression="int8")
    with pytest.raises(UsageError, match="needs CUDA, but this rank trains on cpu"):
        ddp.wrap(torch.nn.Linear(1, 1), device="cpu", strategy="fsdp")


# ------------------------------------------------------------------ datasets


def _write_idx(path: Path, t: torch.Tensor, gz: bool) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, t.dim()) + struct.pack(f">{t.dim()}i", *t.shape)
    blob = header + t.to(torch.uint8).numpy().tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(blob))
    else:
        path.write_bytes(blob)


@pytest.mark.parametrize("gz", [True, False])
def test_load_mnist_reads_idx_files_under_mnist_raw(tmp_path: Path, gz: bool) -> None:
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    imgs = torch.randint(0, 256, (5, 28, 28), dtype=torch.uint8)
    labs = torch.tensor([3, 1, 4, 1, 5], dtype=torch.uint8)
    for split in ("train", "test"):
        names = datasets.MNIST_FILES[split]
        _write_idx(raw / names[0], imgs, gz)
        _write_idx(raw / names[1], labs, gz)
    d = datasets.load_mnist(tmp_path)
    assert torch.equal(d.train_images, imgs) and d.train_labels.tolist() == [3, 1, 4, 1, 5]
    assert d.test_labels.dtype == torch.int64
    x, _, _, _ = d.normalized()
    assert x.shape == (5, 1, 28, 28) and x.dtype == torch.float32


def test_mnist_errors_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="MNIST files missing: train_images, train_labels"):
        datasets.load_mnist(tmp_path)
    bad = tmp_path / "x-idx1-ubyte"
    bad.write_bytes(b"\x00\x00\x08\x01" + struct.pack(">i", 10) + b"\x01\x02")
    with pytest.raises(UsageError, match="truncated"):
        datasets.read_idx(bad)
    bad.write_bytes(b"PK\x03\x04")
    with pytest.raises(UsageError, match="not an IDX file"):
        datasets.read_idx(bad)


def test_render_digits_is_deterministic_and_varied() -> None:
    a_x, a_y = datasets.render_digits(64, seed=5)
    b_x, b_y = datasets.render_digits(64, seed=5)
    c_x, _ = datasets.render_digits(64, seed=6)
    assert a_x.shape == (64, 28, 28) and a_x.dtype == torch.uint8
    assert torch.equal(a_x, b_x) and torch.equal(a_y, b_y)
    assert not torch.equal(a_x, c_x)
    assert set(a_y.tolist()) == set(range(10))
    ink = (a_x > 128).float().mean(dim=(1, 2))
    assert bool((ink > 0.03).all()) and bool((ink < 0.5).all())  # every image has a digit, none is a blob
    same = (a_y == a_y[0]).nonzero().flatten()
    assert len(same) > 1 and not torch.equal(a_x[same[0]], a_x[same[1]])  # same digit, different drawing


def test_builtin_digits_cache_is_written_once_and_reused(tmp_path: Path) -> None:
    d1 = datasets.builtin_digits(50, 20, cache_dir=tmp_path)
    files = list(tmp_path.glob("digits-*.pt"))
    assert len(files) == 1 and str(files[0]) in d1.source
    stamp = files[0].stat().st_mtime_ns
    d2 = datasets.builtin_digits(50, 20, cache_dir=tmp_path)
    assert files[0].stat().st_mtime_ns == stamp
    assert torch.equal(d1.train_images, d2.train_images) and torch.equal(d1.test_labels, d2.test_labels)
    assert list(tmp_path.glob("*.tmp")) == []
    d3 = datasets.builtin_digits(50, 20, cache_dir="")
    assert d3.source == "builtin:uncached" and torch.equal(d3.train_images, d1.train_images)
    with pytest.raises(UsageError, match="positive sizes"):
        datasets.builtin_digits(0, 10, cache_dir="")


def test_default_cache_dir_follows_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHHPC_CACHE", str(tmp_path / "c"))
    assert datasets.default_cache_dir() == tmp_path / "c"
    monkeypatch.delenv("TORCHHPC_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert datasets.default_cache_dir() == tmp_path / "torchhpc"

