"""The memory tier with real ranks: 4 ranks as 2 "nodes" of 2 (``TORCHHPC_NODE_NAME``), each node's shared
memory a directory of its own under ``TORCHHPC_SHM_DIR``.

usage: ckpt_memory.py ROOT train|lose|resume NODES

``NODES`` names each rank's node, comma separated (``n0,n0,n1,n1``). ``train``: FSDP2 trains 5 steps,
saving to memory every step and to disk at step 2; rank 0 dumps the full state at step 5. ``resume``:
restores (the newest of memory, a peer's copy, disk) and rank 0 dumps the state as restored with the step and
the tier it came from. ``lose``: ``train``, but node ``n1``'s ranks end (``os._exit``) as they start the
peer copy of step 5, their own copy of it just published: a node lost with its copy in flight. Rank 0 dumps
the full state at step 4 instead. ``lose-half``: the same, but only rank 3 ends there, 3 s late: rank 2's peer
copy of step 5 completes, rank 3's never starts.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

rank = int(os.environ["RANK"])
os.environ["TORCHHPC_NODE_NAME"] = sys.argv[3].split(",")[rank]

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402

import torchhpc.dist as thd  # noqa: E402
from torchhpc.dist import checkpoint  # noqa: E402

root, mode = Path(sys.argv[1]), sys.argv[2]
ctx = thd.init(single_group=True)
g = torch.Generator().manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
with torch.no_grad():
    for prm in model.parameters():
        prm.copy_(torch.randn(prm.shape, generator=g) * 0.3)
for child in model.children():
    if any(True for _ in child.parameters()):
        fully_shard(child)
fully_shard(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)


def dump(name: str, **info: object) -> None:
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"model": msd, "optim": osd}, root / f"{name}.pt")
        (root / f"{name}.json").write_text(json.dumps(info))


if mode in ("lose", "lose-half"):
    import time

    import torchhpc.dist.memtier as memtier

    exchange = memtier._exchange

    def lost_in_flight(files: dict, to: object, sources: list, step: int, where: Path, pg: object) -> None:
        if step == 5 and os.environ["TORCHHPC_NODE_NAME"] == "n1" and (mode == "lose" or rank == 3):
            if mode == "lose-half":
                time.sleep(3)  # rank 2's copy of step 5 reaches its peer first; rank 3's never does
            os._exit(3)
        exchange(files, to, sources, step, where, pg)  # type: ignore[arg-type]

    memtier._exchange = lost_in_flight  # type: ignore[assignment]

if mode in ("train", "lose", "lose-half"):
    for step in range(5):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * step + rank))
        loss = ((model(x) - x.sum(1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        checkpoint.save(root / "ckpt", step=step + 1, model=model, optimizer=opt, tier="memory")
        if step + 1 == 2:
            checkpoint.save(root / "ckpt", step=step + 1, model=model, optimizer=opt)
        if mode != "train" and step + 1 == 4:
            checkpoint.wait()
            dump("trained-4")
    if mode != "train":
        checkpoint.wait()  # raises: n1 is gone
    dump("trained")
else:
    state = checkpoint.resume(root / "ckpt", model=model, optimizer=opt)
    dump(f"resumed-{sys.argv[4]}", step=state.get("step"), tier=state.get("tier"))
checkpoint.wait()
if rank == 0:
    print("DONE", flush=True)
thd.cleanup()
