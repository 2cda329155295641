"""The MNIST CNN under PyTorch Lightning, multi-node, with torchhpc's environment feeding it.

    pip install 'torchhpc[lightning]'     # keep the container's torch: add -c constraints.txt
    torchhpc run -n 2 examples/lightning_ddp.py --epochs 1
    torchhpc run -s slurm -N 2 -n 2 --launcher srun examples/lightning_ddp.py

Why a custom ClusterEnvironment: Lightning guesses its environment from the
variables it knows (torchelastic, SLURM, LSF, ...) and guesses wrong in common
HPC set-ups — ``srun`` around ``torchrun`` makes it read SLURM_NTASKS as the
world size, ``mpirun`` is not recognised at all, RunAI counts pods. torchhpc's
detector (``torchhpc env`` shows its verdict) already resolved rank, world,
local rank, node rank and master for every launcher; :class:`TorchHPCEnvironment`
hands exactly that to Lightning, so ``devices`` and ``num_nodes`` always match.

Data: built-in digits (or ``--data DIR`` of MNIST IDX files), rendered in
``prepare_data`` — Lightning's own "local rank 0 first" hook — and loaded by every
rank in ``setup``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from models import MnistCNN

from torchhpc.dist import datasets
from torchhpc.env import DistEnv, detect

try:
    import lightning as L
    from lightning.fabric.plugins.environments import ClusterEnvironment
except ImportError as e:  # an optional extra: say how to get it, do not dump a traceback
    sys.stderr.write(
        f"Error: examples/lightning_ddp.py needs PyTorch Lightning ({e.name or 'lightning'} is not importable).\n"
        "HINT: pip install 'torchhpc[lightning]'; inside a container keep its torch with "
        "`pip install -c /path/to/constraints.txt lightning` (see `torchhpc container constraints`)\n"
    )
    raise SystemExit(2) from None


class TorchHPCEnvironment(ClusterEnvironment):
    """Lightning's view of the job, taken from torchhpc's detector instead of its own guesses."""

    def __init__(self, dist_env: DistEnv | None = None) -> None:
        super().__init__()
        self.env = dist_env or detect()

    @property
    def creates_processes_externally(self) -> bool:
        # torchrun / srun / mpirun started every rank already: Lightning must not spawn more.
        return True

    @property
    def main_address(self) -> str:
        return self.env.master_addr

    @property
    def main_port(self) -> int:
        return self.env.master_port

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self.env.world_size

    def set_world_size(self, size: int) -> None:
        if size != self.env.world_size:
            raise RuntimeError(
                f"Lightning computed world size {size} (devices × num_nodes) but the launcher started "
                f"{self.env.world_size} ranks ({self.env.source}); pass matching --devices/--num-nodes"
            )

    def global_rank(self) -> int:
        return self.env.rank

    def set_global_rank(self, rank: int) -> None:
        pass  # the launcher's rank is authoritative

    def local_rank(self) -> int:
        return self.env.local_rank

    def node_rank(self) -> int:
        return self.env.node_rank


class DigitsData(L.LightningDataModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.train: Any = None
        self.test: Any = None

    def _load(self) -> datasets.Digits:
        a = self.args
        return datasets.load_mnist(a.data) if a.data else datasets.builtin_digits(a.train_size, a.test_size, cache_dir=a.cache)

    def prepare_data(self) -> None:
        self._load()  # local rank 0 of each node renders and caches; the others wait

    def setup(self, stage: str) -> None:
        tx, ty, vx, vy = self._load().normalized()
        self.train = torch.utils.data.TensorDataset(tx, ty)
        self.test = torch.utils.data.TensorDataset(vx, vy)

    def train_dataloader(self) -> Any:
        # Lightning inserts the DistributedSampler (and calls set_epoch) itself.
        return torch.utils.data.DataLoader(self.train, batch_size=self.args.batch_size, shuffle=True)

    def val_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(self.test, batch_size=1000)


class LitCNN(L.LightningModule):
    def __init__(self, lr: float, gamma: float) -> None:
        super().__init__()
        self.model = MnistCNN()
        self.lr, self.gamma = lr, gamma

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.model(x), y)
        self.log("train_loss", loss, sync_dist=False)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        out = self.model(x)
        self.log("val_acc", (out.argmax(1) == y).float().mean(), sync_dist=True)
        self.log("val_loss", F.cross_entropy(out, y), sync_dist=True)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adadelta(self.parameters(), lr=self.lr)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=self.gamma)]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64, help="per rank")
    p.add_argument("--lr", type=float, default=1.0)
    p.add_argument("--gamma", type=float, default=0.7)
    p.add_argument("--data", default=None, metavar="DIR")
    p.add_argument("--train-size", type=int, default=10000)
    p.add_argument("--test-size", type=int, default=2000)
    p.add_argument("--cache", default=None, metavar="DIR")
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--seed", type=int, default=1)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    env = TorchHPCEnvironment()
    L.seed_everything(args.seed, workers=True)
    cuda = torch.cuda.is_available()
    trainer = L.Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=env.env.local_world_size,
        num_nodes=env.env.num_nodes,
        strategy="ddp" if env.env.world_size > 1 else "auto",
        plugins=[env] if env.env.world_size > 1 else None,
        max_epochs=args.epochs,
        max_steps=args.max_steps,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    trainer.fit(LitCNN(args.lr, args.gamma), datamodule=DigitsData(args))
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    if trainer.is_global_zero:
        print(
            f"lightning: world_size={trainer.world_size} nodes={trainer.num_nodes} "
            f"devices/node={trainer.num_devices} source={env.env.source} "
            f"val_acc={100 * metrics.get('val_acc', 0.0):.2f}%",
            flush=True,
        )
    return metrics


if __name__ == "__main__":
    main()
