"""Write the planted-hang Flight Recorder dumps of this directory (run once; the nccl_trace_rank_N files are committed).

No NCCL can run where torchhpc is developed, so these are not NCCL's own dumps: they are built in the
format torch 2.13 writes (``torch._C._distributed_c10d._dump_fr_trace()``, version "2.10"), with the keys
and values copied from a real dump of a 2-rank gloo job here (TORCH_FR_BUFFER_SIZE=100), for a 4-rank
NCCL job in which rank 3 never enqueued its second all_reduce: ranks 0-2 wait in it (state "started").
"""

import pickle
from pathlib import Path


def entry(seq: int, state: str) -> dict[str, object]:
    return {"frames": [], "record_id": seq - 1, "pg_id": 0, "process_group": ("0", "default_pg"),
            "thread_name": "python", "thread_id": "140465024396160", "collective_seq_id": seq, "p2p_seq_id": 0,
            "op_id": seq, "profiling_name": "nccl:all_reduce", "time_created_ns": 1795664972021501884 + seq,
            "input_sizes": [[4]], "input_dtypes": ["Float"], "output_sizes": [[4]], "output_dtypes": ["Float"],
            "state": state, "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
            "retired": state == "completed", "timeout_ms": 600000, "is_p2p": False}


for rank in range(4):
    last = 1 if rank == 3 else 2
    entries = [entry(1, "completed")] + ([entry(2, "started")] if last == 2 else [])
    dump = {"version": "2.10", "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2, 3]"}},
            "comm_lib_version": "2.27.5",
            "pg_status": {"0": {"last_enqueued_collective": last, "last_started_collective": last,
                                "last_completed_collective": 1}},
            "entries": entries}
    (Path(__file__).parent / f"nccl_trace_rank_{rank}").write_bytes(pickle.dumps(dump))
