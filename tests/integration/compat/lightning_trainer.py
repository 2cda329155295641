"""Lightning Trainer with its default cluster detection (no torchhpc import): one training step."""

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


data = DataLoader(TensorDataset(torch.randn(16, 4), torch.randn(16, 1)), batch_size=4)
trainer = L.Trainer(
    accelerator="cpu", devices=2, num_nodes=2, max_steps=1, logger=False,
    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
)
trainer.fit(Tiny(), data)
total = trainer.strategy.reduce(torch.tensor(float(trainer.global_rank + 1)), reduce_op="sum")
env = type(trainer.strategy.cluster_environment).__name__
print(f"COMPAT row=lightning_trainer rank={trainer.global_rank} world={trainer.world_size} sum={total.item():g} via={env}", flush=True)
