"""The resume idioms of docs/resilience.md, each a few lines as a user would write them.

usage: resume_idioms.py IDIOM DIR  (IDIOM: checkpoint | plain | hf | lightning)

20 optimizer steps, a checkpoint every 5. In the first attempt (TORCHHPC_RESTART_COUNT=0) rank 1
stops in a sleep once step 10's checkpoint is on disk: a hang the in-allocation supervisor must
catch and restart. Rank 0 prints ``RESUMED at=S`` (the step the attempt starts from) and
``FINISHED at=20``.
"""

import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
idiom, where = sys.argv[1], sys.argv[2]
first = os.environ.get("TORCHHPC_RESTART_COUNT", "0") == "0"
STEPS, EVERY, HANG_AFTER = 20, 5, 10


def hang_here(rank: int, step: int) -> None:
    if first and rank == 1 and step == HANG_AFTER:
        print(f"planted hang after step {step}", flush=True)
        time.sleep(3600)


def say(rank: int, text: str) -> None:
    if rank == 0:
        print(text, flush=True)


import torch  # noqa: E402

if idiom in ("checkpoint", "plain"):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if idiom == "checkpoint":
        from torchhpc.dist import checkpoint

        start = checkpoint.resume(where, model=model, optimizer=opt).get("step", 0)
    else:  # a plain loop: one file, written under a temporary name and renamed
        path = os.path.join(where, "last.pt")
        state = torch.load(path) if os.path.exists(path) else None
        start = 0 if state is None else state["step"]
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
    say(rank, f"RESUMED at={start}")
    for step in range(start, STEPS):
        g = torch.Generator().manual_seed(step * 10 + rank)
        x = torch.randn(8, 4, generator=g)
        loss = ((ddp(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        done = step + 1
        if done % EVERY == 0:
            if idiom == "checkpoint":
                checkpoint.save(where, step=done, model=model, optimizer=opt)
            elif rank == 0:
                os.makedirs(where, exist_ok=True)
                torch.save({"step": done, "model": model.state_dict(), "opt": opt.state_dict()}, path + ".tmp")
                os.replace(path + ".tmp", path)
            dist.barrier()  # the save is on disk before any rank goes on
        hang_here(rank, done)
    say(rank, f"FINISHED at={STEPS}")
    dist.destroy_process_group()

elif idiom == "hf":
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )
    from transformers.trainer_utils import get_last_checkpoint

    class Hang(TrainerCallback):
        def on_save(self, args, state, control, **kw):  # called once the checkpoint is written
            hang_here(args.process_index, state.global_step)

    set_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    tokens = torch.randint(0, 64, (160, 16), generator=torch.Generator().manual_seed(0))
    args = TrainingArguments(
        output_dir=where, per_device_train_batch_size=2, max_steps=STEPS, save_steps=EVERY, learning_rate=1e-3,
        use_cpu=True, ddp_backend="gloo", report_to="none", logging_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0,
    )
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=[{"input_ids": t, "labels": t} for t in tokens],
                      callbacks=[Hang()])
    last = get_last_checkpoint(where) if os.path.isdir(where) else None  # the idiom: resume when one exists
    rank = args.process_index
    say(rank, f"RESUMED at={int(last.rsplit('-', 1)[1]) if last else 0}")
    trainer.train(resume_from_checkpoint=last)
    say(rank, f"FINISHED at={trainer.state.global_step}")

elif idiom == "lightning":
    import lightning as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
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

    class Hang(Callback):
        def on_train_batch_start(self, trainer, *a, **kw):  # step 10's checkpoint was written at its end
            hang_here(trainer.global_rank, trainer.global_step)

    class Start(Callback):
        def on_train_start(self, trainer, *a):
            say(trainer.global_rank, f"RESUMED at={trainer.global_step}")

    torch.manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(400, 4), torch.randn(400, 1)), batch_size=4)
    ckpt = ModelCheckpoint(dirpath=where, every_n_train_steps=EVERY, save_last=True, save_top_k=-1)
    trainer = L.Trainer(accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "2")), num_nodes=1,
                        max_steps=STEPS, logger=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[ckpt, Hang(), Start()])
    trainer.fit(Tiny(), data, ckpt_path="last")  # the idiom: from last.ckpt when there is one
    say(trainer.global_rank, f"FINISHED at={trainer.global_step}")
else:
    raise SystemExit(f"unknown idiom {idiom!r}")
