"""Hugging Face Trainer as its docs show (no torchhpc import): a tiny GPT-2 built from a config, random
tokens, DDP over gloo on CPU, 20 steps, no hub access, then one all_reduce in the Trainer's group.

It never destroys the process group: like most scripts, it just ends. That used to abort a rank at
interpreter exit about half the time on a loaded machine (torch's gloo exit race, issue 29), which
torchhpc's exit cure (src/torchhpc/boot/sitecustomize.py) now settles in every rank it starts.
"""

import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever downloaded: the model comes from a config
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch
import torch.distributed as dist
from accelerate import PartialState
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

set_seed(0)
config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(config)
tokens = torch.randint(0, config.vocab_size, (160, 16), generator=torch.Generator().manual_seed(0))
data = [{"input_ids": t, "labels": t} for t in tokens]
args = TrainingArguments(
    output_dir=(out := tempfile.mkdtemp(prefix="hf-compat-")),  # one per rank, removed at the end
    per_device_train_batch_size=2, max_steps=20, learning_rate=1e-3, use_cpu=True, ddp_backend="gloo",
    ddp_find_unused_parameters=False,
    report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0,
)
trainer = Trainer(model=model, args=args, train_dataset=data)
result = trainer.train()
state = PartialState()
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
print(
    f"COMPAT row=hf_trainer rank={rank} world={world} sum={t.item():g} via={state.distributed_type.value} "
    f"steps={trainer.state.global_step} loss={result.training_loss:.6f} boot={'_torchhpc_boot' in sys.modules}",
    flush=True,
)
shutil.rmtree(out, ignore_errors=True)
if os.environ.get("COMPAT_DESTROY") == "1":  # the "obvious workaround" of issue 29 (benchmarks/soak_compat.py)
    dist.destroy_process_group()
