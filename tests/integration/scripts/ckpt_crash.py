"""SIGKILL every rank of an FSDP2 run at random moments while it checkpoints asynchronously every step.

usage: ckpt_crash.py WORK --world 2 --rounds 20 --seed S [--kill-after LO HI] [--tail 5] [--tier memory]

The harness imports torch once and forks the ranks of each round (a real gloo
group per round, on a fresh port, through ``torchhpc.dist.init``), so a round costs
a fork, not a launch: twenty kills fit in about a minute on two cores. Every rank
of a round is in one process group; the harness SIGKILLs that group at a random
moment: in every 5th round within 0.4 s of the fork (start-up, resume), in the others
``--kill-after`` seconds after rank 0 resumed (training, the copy to host memory, the
background write, the rename, the pruning). After each kill it notes ``latest()`` (the newest complete
checkpoint) and whether a save was caught half written (a ``.tmp`` directory).
The next round resumes and must land there. A last round runs ``--tail`` steps to
its end; then an uninterrupted run without checkpoints (the reference) goes as far.

``--tier memory`` saves to the memory tier every step instead (each rank a node of its own under
``WORK/shm``, so every save also makes a peer copy): ``latest`` is then the newest step whose parts the
nodes' memory holds between them (own copies and peer copies), what a resume must take.

Rank 0 of each round appends to ``WORK/log``: ``R round step digest`` for the state
it resumed (``step`` 0: a fresh start), ``S round step digest`` after each step, and
``P round step`` once a save it made is complete. ``digest`` is a SHA-256 of the
full (unsharded) parameters, optimizer state and rank 0's RNG state. Written to
``WORK/report.json``: the rounds and the reference digests, for the test to check.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import random
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch._dynamo  # imported once here, not in every forked rank (FSDP2 loads it lazily: 1.5 s)
import torch.distributed.checkpoint.state_dict
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

import torchhpc.dist as thd
from torchhpc.dist import checkpoint, checkpoint_state, context  # noqa: F401

p = argparse.ArgumentParser()
p.add_argument("work")
p.add_argument("--world", type=int, default=2)
p.add_argument("--rounds", type=int, default=20)
p.add_argument("--seed", type=int, default=0)
p.add_argument("--kill-after", type=float, nargs=2, default=(0.0, 1.2), help="seconds after the resume")
p.add_argument("--tail", type=int, default=5)
p.add_argument("--step-sleep", type=float, default=0.01)
p.add_argument("--tier", choices=("disk", "memory"), default="disk")
a = p.parse_args()
work = Path(a.work)
ckpt, log = work / "ckpt", work / "log"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def digest(model: Any, opt: Any) -> str:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    buf = io.BytesIO()
    torch.save({"model": msd, "optim": osd, "rng": torch.get_rng_state()}, buf)
    return hashlib.sha256(buf.getvalue()).hexdigest()[:16]


def rank_main(rank: int, round_: int, stop_at: int | None, save: bool, where: Path) -> None:
    """One rank of one round: resume, then train (saving every step) until ``stop_at`` or killed."""
    torch.set_num_threads(1)
    thd.init()
    torch.manual_seed(100 + rank)
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Dropout(0.1), nn.Linear(256, 256), nn.Tanh(),
                          nn.Linear(256, 1))
    with torch.no_grad():
        for prm in model.parameters():
            prm.copy_(torch.randn(prm.shape, generator=g) * 0.05)
    for child in model.children():
        if any(True for _ in child.parameters()):
            fully_shard(child)
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    start = int(checkpoint.resume(where, model=model, optimizer=opt).get("step", 0)) if save else 0
    out = open(log, "a", buffering=1) if rank == 0 else None
    d = digest(model, opt)
    if out:
        out.write(f"R {round_} {start} {d} {time.time():.3f}\n")
    step, pending = start, None
    while stop_at is None or step < stop_at:
        gen = torch.Generator().manual_seed(1000 * step + rank)
        x = torch.randn(16, 64, generator=gen)
        y = x.sum(1, keepdim=True) + torch.randn(16, 1) * 0.01
        loss = ((model(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        d = digest(model, opt)
        if out:
            out.write(f"S {round_} {step} {d} {time.time():.3f}\n")
        if save:
            if a.tier == "memory":
                checkpoint.save(where, step=step, model=model, optimizer=opt, tier="memory")
            else:
                checkpoint.save(where, step=step, model=model, optimizer=opt, blocking=False, keep=3)
            if out and pending is not None:
                out.write(f"P {round_} {pending}\n")  # save() waited for the one before: it is complete
            pending = step
        time.sleep(a.step_sleep)
    checkpoint.wait()
    if out and pending is not None:
        out.write(f"P {round_} {pending}\n")
    thd.cleanup()


def start_round(round_: int, stop_at: int | None, save: bool, where: Path) -> list[int]:
    """Fork the ranks, all in one new process group (the first rank's pid); returns their pids."""
    port = free_port()
    pids: list[int] = []
    for rank in range(a.world):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.setpgid(0, pids[0] if pids else 0)
                os.environ.update(RANK=str(rank), WORLD_SIZE=str(a.world), LOCAL_RANK=str(rank),
                                  LOCAL_WORLD_SIZE=str(a.world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
                if a.tier == "memory":  # each rank a node: its shared memory a directory of WORK/shm
                    os.environ.update(TORCHHPC_NODE_NAME=f"n{rank}", TORCHHPC_SHM_DIR=str(work / "shm"),
                                      TORCHELASTIC_RUN_ID="crash")
                rank_main(rank, round_, stop_at, save, where)
            except BaseException as e:
                print(f"rank {rank} of round {round_}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
                code = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        try:
            os.setpgid(pid, pids[0] if pids else pid)  # also here: no race with the kill
        except OSError:
            pass
        pids.append(pid)
    return pids


def reap(pids: list[int]) -> list[int]:
    return [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]


def newest_complete(where: Path) -> int:
    """The step a resume must land on: on disk, the newest complete checkpoint; in memory, the newest step whose
    files (``files.json``) the nodes hold between them, own and peer copies (torchhpc.dist.memtier)."""
    if a.tier == "disk":
        found = checkpoint.latest(where)
        return int(found.name.split("-")[1].split(".")[0]) if found else 0
    held: dict[int, set[str]] = {}
    listing: dict[int, set[str]] = {}
    for d in (work / "shm").glob("torchhpc-crash-*/*/*"):
        if not d.is_dir() or d.name.startswith("."):
            continue
        step = int(d.name.split("-")[1].split(".")[0])
        held.setdefault(step, set()).update(f.name for f in d.iterdir())
        if (d / "files.json").exists():
            listing[step] = set(json.loads((d / "files.json").read_text()))
    return max((s for s, names in held.items() if s in listing and listing[s] <= names), default=0)


def lines(kind: str) -> list[list[str]]:
    text = log.read_text() if log.exists() else ""
    return [ln.split() for ln in text.splitlines() if ln.startswith(kind + " ") and len(ln.split()) >= 3]


work.mkdir(parents=True, exist_ok=True)
rng = random.Random(a.seed)
rounds: list[dict[str, Any]] = []
for r in range(a.rounds):
    pids = start_round(r, None, True, ckpt)
    t0 = time.monotonic()
    # Every 5th round dies in start-up (init, model, resume); the others after rank 0 resumed,
    # so that a loaded machine's slower start moves no kill out of the training and saving.
    phase = "start-up" if r % 5 == 4 else "training"
    if phase == "training":
        while not any(int(x[1]) == r for x in lines("R")) and time.monotonic() - t0 < 60:
            time.sleep(0.01)
    wait_s = rng.uniform(0.0, 0.4) if phase == "start-up" else rng.uniform(*a.kill_after)
    time.sleep(wait_s)
    os.killpg(pids[0], signal.SIGKILL)
    codes = reap(pids)
    torn_in = ckpt if a.tier == "disk" else work / "shm"
    rounds.append({
        "round": r, "phase": phase, "killed_after_s": round(time.monotonic() - t0, 3), "exit_codes": codes,
        "latest": newest_complete(ckpt),
        "torn": sorted(q.name for q in torn_in.rglob(".ckpt-*.tmp")) if torn_in.exists() else [],
        "published": max((int(x[2]) for x in lines("P") if int(x[1]) == r), default=None),
    })
last = rounds[-1]["latest"] if rounds else 0
codes = reap(start_round(a.rounds, last + a.tail, True, ckpt))
assert codes == [0] * a.world, f"the last round failed: {codes}"
reached = max(int(x[2]) for x in lines("S"))
ref_log = log.read_text()
log.write_text("")
codes = reap(start_round(-1, reached, False, work / "unused"))
assert codes == [0] * a.world, f"the reference run failed: {codes}"
reference = {int(x[2]): x[3] for x in lines("S")}
reference[0] = next(x[3] for x in lines("R"))
log.write_text(ref_log)
if a.tier == "memory":  # the job's end, as the local scheduler ends one: the newest memory step to disk, memory freed
    from torchhpc.jobdir.shm import release

    release("crash", str(work / "shm"))
(work / "report.json").write_text(json.dumps({"rounds": rounds, "reference": reference, "reached": reached}, indent=1))
print(f"{a.rounds} kills, reached step {reached}", flush=True)
