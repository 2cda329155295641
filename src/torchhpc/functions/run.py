"""The rank side of ``Executor.submit``: ``python -m torchhpc.functions.run FUNCTION_DIR``.

Every rank of the job runs this under the job's launcher (torchrun, srun,
mpirun), container and scheduler, as it would run a training script:

1. compare the submitting side's versions (``meta.json``) with its own, and
   refuse with a HINT *before* unpickling anything;
2. unpickle the function, start the process group (``torchhpc.dist.init``);
3. call it (an array task with its own item; a checkpointable function with
   a :class:`torchhpc.Stop` holding the previous attempt's state);
4. write its record, whole or not at all: the value, or the exception's type,
   message, host and traceback text (so the submitter can re-raise it without
   importing the exception's class), or a checkpoint to resume from.

A failing rank writes its record and leaves at once with exit 1 (no barrier
that would wait for peers it may have broken): the launcher then stops the
others, as it does for a failing training script.
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import time
import traceback
from typing import Any, Optional

from torchhpc.errors import TorchHPCError
from torchhpc.functions.pack import (
    FunctionDir,
    _installed,
    _release,
    atomic_write,
    load_cloudpickle,
    submit_versions,
    version_mismatch,
)

EXIT_REFUSED = 2


def host() -> str:
    """The node's name as the scheduler knows it (the dev cluster's nodes share one UTS name)."""
    return os.environ.get("SLURMD_NODENAME") or os.environ.get("PBS_NODENAME") or socket.gethostname()


def _rank() -> int:
    from torchhpc.env import detect

    try:
        return int(detect(os.environ).rank)
    except Exception:  # a broken environment is reported by dist.init below; name rank 0 meanwhile
        return int(os.environ.get("RANK", "0") or 0)


def _task() -> Optional[int]:
    text = os.environ.get("TORCHHPC_ARRAY_INDEX")
    return int(text) if text and text.isdigit() else None


def fail(fdir: FunctionDir, rank: int, task: Optional[int], kind: str, message: str, tb: str) -> None:
    record = {"ok": False, "rank": rank, "host": host(), "type": kind, "message": message, "traceback": tb,
              "time": time.time(), "pid": os.getpid()}
    try:
        atomic_write(fdir.result_path(rank, task), pickle.dumps(record))
    except OSError as e:
        print(f"torchhpc: rank {rank} could not record its failure: {e}", file=sys.stderr, flush=True)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m torchhpc.functions.run FUNCTION_DIR", file=sys.stderr)
        return EXIT_REFUSED
    fdir = FunctionDir(argv[0])
    rank, task = _rank(), _task()
    try:
        meta = fdir.meta()
        why = version_mismatch(meta.get("versions", {}), submit_versions_here())
        if why is not None:
            raise TorchHPCError(
                f"rank {rank} on {host()} refuses the function: {why}",
                "run the ranks with the same Python minor, cloudpickle and torch as the submitting "
                "session (the same venv or container image), or submit from inside that environment",
            )
        if _already_returned(fdir, task, int(meta.get("world_size") or 0)):
            print(f"torchhpc: rank {rank}: the function already returned on every rank (this attempt was "
                  "requeued after it finished); nothing to do", file=sys.stderr, flush=True)
            return 0
        cloudpickle = load_cloudpickle()
        with open(fdir.pickle_path, "rb") as f:
            call = cloudpickle.load(f)
    except TorchHPCError as e:
        print(f"Error: {e.message}" + (f"\nHINT: {e.hint}" if e.hint else ""), file=sys.stderr, flush=True)
        fail(fdir, rank, task, type(e).__name__, str(e), str(e) + "\n")
        return EXIT_REFUSED
    except Exception as e:
        fail(fdir, rank, task, type(e).__name__, f"cannot load the function: {e}", traceback.format_exc())
        traceback.print_exc()
        return EXIT_REFUSED
    return _call(fdir, rank, task, call, cloudpickle, meta.get("source_file"))


def _already_returned(fdir: FunctionDir, task: Optional[int], world_size: int) -> bool:
    """Every rank's value is recorded: a time-limit warning that came as the function returned still
    requeues the job (the batch shell cannot tell), and that attempt must not run it a second time."""
    if world_size < 1:
        return False
    records = fdir.records(task)
    return all(records.get(r, {}).get("ok") for r in range(world_size))


def submit_versions_here() -> dict[str, Optional[str]]:
    """This rank's versions, torch's from its metadata (not imported yet)."""
    return {**submit_versions(), "torch": _release(_installed("torch"))}


def _call(fdir: FunctionDir, rank: int, task: Optional[int], call: dict[str, Any], cloudpickle: Any,
          source_file: Optional[str] = None) -> int:
    import torchhpc.dist as thd

    fn, args, kwargs = call["fn"], tuple(call["args"]), dict(call["kwargs"])
    try:
        thd.init(single_group=True)
        if call.get("items") is not None:
            if task is None:
                raise TorchHPCError("an array function ran outside an array task (no TORCHHPC_ARRAY_INDEX)")
            args = (call["items"][task], *args)
        stop_param = call.get("stop_param")
        if stop_param:
            from torchhpc.functions.requeue import Stop

            state_file = fdir.state_path(rank, task)
            state = cloudpickle.loads(state_file.read_bytes()) if state_file.exists() else None
            restarts = int(os.environ.get("SLURM_RESTART_COUNT") or os.environ.get("PBS_RUN_COUNT") or 0)
            kwargs[stop_param] = Stop(state, restarts)
        value = fn(*args, **kwargs)
    except BaseException as e:  # SystemExit/KeyboardInterrupt in user code are failures of the call too
        # The user's frames only: the runner's own frame (this call) is noise in every report.
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None))
        if source_file:  # the submitted function's own file, where cloudpickle left "<dynamic-code>"
            tb = tb.replace('File "<dynamic-code>"', f'File "{source_file}"')
        sys.stderr.write(tb)
        fail(fdir, rank, task, type(e).__name__, str(e), tb)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    from torchhpc.functions.requeue import Checkpoint

    if isinstance(value, Checkpoint):
        atomic_write(fdir.state_path(rank, task), cloudpickle.dumps(value.state))
        _touch_stop_file()
        print(f"torchhpc: rank {rank} checkpointed; the job requeues and resumes from it", file=sys.stderr, flush=True)
    else:
        try:
            payload = cloudpickle.dumps(value)
        except Exception as e:
            fail(fdir, rank, task, type(e).__name__, f"cannot pickle the return value: {e}", traceback.format_exc())
            os._exit(1)
        record = {"ok": True, "rank": rank, "host": host(), "value": payload, "time": time.time()}
        atomic_write(fdir.result_path(rank, task), pickle.dumps(record))
    thd.cleanup()
    return 0


def _touch_stop_file() -> None:
    """A checkpoint means "requeue me": make sure the batch shell sees the stop file, and that a rank took it."""
    from torchhpc.dist.stop import taken, touch_stop_file

    touch_stop_file()
    taken()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
