"""Records the real rank output that tests/unit/test_top.py parses: tqdm, a Hugging Face Trainer
run and a Lightning run, each tiny, on CPU, with nothing downloaded (models built from configs).

    python tests/data/progress/record.py   # rewrites tqdm.log, trainer.log, lightning*.log here

Each file holds what the rank wrote to its log (stdout and stderr together, not a terminal), as
torchhpc's per-rank files do.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

TQDM = """
import time
from tqdm import tqdm
for _ in tqdm(range(50), mininterval=0.1):
    time.sleep(0.01)
"""

TRAINER = """
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

torch.manual_seed(0)
config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=32, max_position_embeddings=16, num_labels=2)
model = BertForSequenceClassification(config)
data = [{"input_ids": torch.randint(0, 64, (8,)), "labels": torch.tensor(i % 2)} for i in range(64)]
args = TrainingArguments(output_dir="OUT", max_steps=40, logging_steps=10, per_device_train_batch_size=4,
                         report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=False)
Trainer(model=model, args=args, train_dataset=data).train()
"""

LIGHTNING = """
import torch
import lightning as L
from torch.utils.data import DataLoader, TensorDataset

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
    def training_step(self, batch, _i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 4), torch.randn(256, 1))
L.Trainer(max_epochs=2, accelerator="cpu", devices=1, enable_checkpointing=False, default_root_dir="OUT",
          callbacks=BAR).fit(Tiny(), DataLoader(data, batch_size=8))
"""


def record(name: str, code: str, tmp: Path) -> None:
    code = code.replace('"OUT"', repr(str(tmp / name)))
    done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    # no machine path in the project: the venv and the temporary directory become placeholders
    text = done.stdout.replace(sys.prefix.encode(), b"VENV").replace(str(tmp).encode(), b"TMP")
    (HERE / f"{name}.log").write_bytes(text)
    print(f"{name}.log: {len(text)} bytes, exit {done.returncode}")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        # Lightning's bar is Rich's where rich is installed (its default), else tqdm's
        lightning_tqdm = LIGHTNING.replace("callbacks=BAR", "callbacks=[L.pytorch.callbacks.TQDMProgressBar()]")
        for name, code in (("tqdm", TQDM), ("trainer", TRAINER), ("lightning", LIGHTNING.replace("callbacks=BAR", "")),
                           ("lightning_tqdm", lightning_tqdm)):
            record(name, code, Path(tmp))
