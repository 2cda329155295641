"""The value every detector produces, and the small helpers they share.

A detector is a pure function of an environment mapping (plus a file reader
for PBS's nodefile): it never writes ``os.environ``. It answers with a
:class:`Verdict` (matched or not, and why) so ``torchhpc env --explain`` can
show every detector's reasoning, not only the winner's.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field

from torchhpc.errors import EnvironmentDetectionError

__all__ = [
    "DEFAULT_PORT",
    "PORT_BASE",
    "PORT_SPAN",
    "DistEnv",
    "FileReader",
    "Verdict",
    "derive_port",
    "read_text",
]

# MASTER_PORT = PORT_BASE + job_number % PORT_SPAN, i.e. 10000..29999: above the
# privileged range, below Linux's ephemeral range (32768+), so a derived port
# never collides with a kernel-assigned client port. The Slurm batch scripts
# compute the same in shell: $(( 10000 + SLURM_JOB_ID % 20000 )).
PORT_BASE = 10000
PORT_SPAN = 20000
# torch's own default, used only when there is no job id to derive from.
DEFAULT_PORT = 29500

FileReader = Callable[[str], str]


def read_text(path: str) -> str:
    """The default file reader (PBS nodefiles): tests inject their own."""
    with open(path, encoding="utf-8") as f:
        return f.read()


def _job_number(job_id: str) -> int:
    """The number inside a job id: ``4242`` -> 4242, ``1234.pbs01`` -> 1234, ``12[3].srv`` -> 123.

    Only the part before the first ``.`` counts (PBS appends the server name),
    and all its digits are used so array elements get distinct ports. In shell:
    ``id=${PBS_JOBID%%.*}; id=${id//[!0-9]/}``. A job id without digits falls
    back to a CRC32 of the text, still the same on every rank.
    """
    head = job_id.strip().split(".", 1)[0]
    digits = re.sub(r"\D", "", head)
    if digits:
        return int(digits)
    return zlib.crc32(job_id.strip().encode())


def derive_port(job_id: str, step: str | None = None) -> int:
    """MASTER_PORT from the job id, so every rank agrees without talking.

    Job level (the default): ``10000 + job % 20000``. The rendered Slurm scripts start
    from the same value, ``$(( 10000 + (SLURM_JOB_ID + try * 7919) % 20000 ))`` with
    ``try`` 0, and move to ``try`` 1..7 only while something listens on it on the first
    node (schedulers/slurm/slurm.py ``port_lines``). Each array task has its own
    ``SLURM_JOB_ID``, so two tasks on one node get different ports.

    ``step`` gives a step-aware variant for several concurrent ``srun`` steps
    in one allocation: the step number shifts the port by a large odd stride,
    so steps of one job differ from each other and from the job-level port.
    """
    job = _job_number(job_id)
    if step is None or not str(step).strip():
        return PORT_BASE + job % PORT_SPAN
    step_digits = re.sub(r"\D", "", str(step))
    s = int(step_digits) if step_digits else zlib.crc32(str(step).encode())
    return PORT_BASE + (job + 7919 * (s + 1)) % PORT_SPAN


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job, in torchrun's vocabulary.

    ``source`` names the detector that produced it; ``scheduler`` the
    allocation around it (``slurm``, ``pbs``, ``kubernetes``, ``runai`` or
    None) which may have supplied the master address and port.
    """

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    source: str
    job_id: str | None = None
    scheduler: str | None = None
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def as_torch_env(self) -> dict[str, str]:
        """torch's ``env://`` contract (what torchrun gives its workers)."""
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "GROUP_RANK": str(self.node_rank),
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "notes": list(self.notes)}  # every field, in their order

    def validate(self, variables: str) -> DistEnv:
        """Reject impossible geometry, naming the variables it came from."""
        problems: list[str] = []
        if self.world_size < 1:
            problems.append(f"world_size={self.world_size} < 1")
        if not 0 <= self.rank < max(self.world_size, 1):
            problems.append(f"rank={self.rank} outside 0..{self.world_size - 1}")
        if self.local_world_size < 1:
            problems.append(f"local_world_size={self.local_world_size} < 1")
        if not 0 <= self.local_rank < max(self.local_world_size, 1):
            problems.append(f"local_rank={self.local_rank} outside 0..{self.local_world_size - 1}")
        if self.local_world_size > self.world_size:
            problems.append(f"local_world_size={self.local_world_size} > world_size={self.world_size}")
        if not 0 <= self.node_rank < max(self.num_nodes, 1):
            problems.append(f"node_rank={self.node_rank} outside 0..{self.num_nodes - 1}")
        if not 0 < self.master_port < 65536:
            problems.append(f"master_port={self.master_port} is not a TCP port")
        if problems:
            raise EnvironmentDetectionError(
                f"{self.source}: inconsistent environment ({'; '.join(problems)}) from {variables}",
                "check how the processes were launched; `torchhpc env --explain` shows every variable read",
            )
        return self


@dataclass(frozen=True)
class Verdict:
    """One detector's answer: did it match, why, and what it found.

    ``error`` is set when the detector recognised its launcher but the values
    are unusable (detect() raises it; explain() only reports it).
    """

    name: str
    matched: bool
    reason: str
    env: DistEnv | None = None
    error: EnvironmentDetectionError | None = None
    priority_reason: str = ""
    chosen: bool = False

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "matched": self.matched,
            "chosen": self.chosen,
            "reason": self.reason,
            "error": str(self.error) if self.error else None,
            "priority_reason": self.priority_reason,
            "env": self.env.as_dict() if self.env else None,
        }


def get_int(env: Mapping[str, str], *names: str, default: int | None = None) -> int | None:
    """The first of ``names`` present in ``env`` as an int; a non-integer value is an error naming it."""
    for name in names:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            return int(raw.strip())
        except ValueError:
            raise EnvironmentDetectionError(
                f"{name}={raw!r} is not an integer (from the environment)",
                f"unset {name} or set it to a whole number",
            ) from None
    return default


def need_int(env: Mapping[str, str], *names: str) -> int:
    value = get_int(env, *names)
    if value is None:
        raise EnvironmentDetectionError(
            f"none of {', '.join(names)} is set",
            "the launcher did not export its rank variables; see `torchhpc env --explain`",
        )
    return value


def first_set(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """``(name, value)`` of the first non-empty variable among ``names``."""
    for name in names:
        value = env.get(name)
        if value is not None and value.strip() != "":
            return name, value.strip()
    return None
