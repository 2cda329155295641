"""The hostile-input matrix of issue 20: a corpus through every field of every renderer.

Each case renders ``torchhpc run ... --dry-run`` in-process (the public CLI), so it
survives refactors of the schedulers. A value is either refused (exit 2, one
``Error:`` line naming the field, no traceback) or rendered; a rendered script is run
by a real bash with stub commands on PATH (``srun`` records its argv, then runs the
task command; ``python``, ``mpirun``, container runtimes... only record), and its
records must equal those of the same case rendered with a placeholder, the
placeholder replaced by the value: the value arrives exactly where it should and
nothing else changes. No ``CANARY`` file may appear. Slurm scripts are also read by
the real ``sbatch -v --test-only`` (stopped once it printed the options it parsed;
a throw-away slurm.conf, no controller), whose options must be the intended ones.
Kubernetes manifests are parsed by PyYAML and their pod command run the same way;
RunAI's command line runs with a stub ``runai`` that replays the pod (CLI v1: its second shell).

What is fake: the stub commands (we check what would run, not run a cluster), the
Kubernetes API server and the RunAI CLI (neither can run here).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "hostile"
PLACEHOLDER = "q7ph"
CANARIES = ("CANARY", "PWNED")
SHELLCHECK_CODES = "SC1070,SC1133,SC1009,SC1072,SC1073,SC1078,SC1079,SC2037,SC2283"

# --------------------------------------------------------------------------- stubs

_RECORD = r"""
_rec() {
  local n=${0##*/} v envs
  read -ra envs <<< "${STUB_ENV:-}"
  { printf '%s\0%s\0' "$n" "$#"
    [ $# -gt 0 ] && printf '%s\0' "$@"
    printf '%s\0' "${#envs[@]}"
    for v in "${envs[@]}"; do printf '%s\0' "${!v-<unset>}"; done
  } >> "${STUB_LOG:?}"
}
"""

STUBS: dict[str, str] = {
    # srun records, then runs the task command (the first word that is not an option)
    "srun": _RECORD + '_rec "$@"\nwhile [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done\n'
    "export SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_STEP_NUM_TASKS=1 SLURM_STEP_TASKS_PER_NODE=1\n"
    '[ $# -gt 0 ] && exec "$@"\nexit 0\n',
    "scontrol": _RECORD + 'if [ "${1:-}" = show ] && [ "${2:-}" = hostnames ]; then echo node1; exit 0; fi\n_rec "$@"\n',
    "getent": "#!/bin/bash\necho '10.0.0.1        STREAM node1'\n",
    "ss": "#!/bin/bash\nexit 0\n",
    # RunAI: record, then what its pod does. CLI v1 (submit-dist): the words after `--` joined and read by a
    # shell again; the current CLI with --command: the words after `--` are the container's argv.
    "runai": _RECORD + '_rec "$@"\ncmd=0\nwhile [ $# -gt 0 ] && [ "$1" != -- ]; do [ "$1" = --command ] && cmd=1; '
    'shift; done\nshift\nexport RANK=0 WORLD_SIZE=1 MASTER_ADDR=10.0.0.1 MASTER_PORT=23456\n'
    '[ "$cmd" = 1 ] && exec "$@"\nexec bash -c "$*"\n',
}
RECORDERS = (
    "python", "python3", "mpirun", "pbsdsh", "apptainer", "singularity", "enroot", "docker", "podman",
    "ch-run", "kubectl", "torchrun", "sbatch", "qsub",
)

_stub_dir: Path | None = None


def stub_dir() -> Path:
    """A directory of stub commands (made once per process)."""
    global _stub_dir
    if _stub_dir is None:
        d = Path(tempfile.mkdtemp(prefix="torchhpc-hostile-stubs-"))
        for name, text in {**STUBS, **{n: _RECORD + '_rec "$@"\n' for n in RECORDERS}}.items():
            p = d / name
            p.write_text(text if text.startswith("#!") else "#!/bin/bash\n" + text)
            p.chmod(0o755)
        _stub_dir = d
    return _stub_dir


def parse_records(data: bytes) -> list[list[bytes]]:
    """The stub log: per call ``name, argc, args..., envc, env values...``, all NUL-terminated."""
    parts = data.split(b"\0")[:-1]
    out: list[list[bytes]] = []
    i = 0
    try:
        while i < len(parts):
            argc = int(parts[i + 1])
            envc = int(parts[i + 2 + argc])
            end = i + 3 + argc + envc
            if end > len(parts):
                raise ValueError
            out.append([*parts[i : i + 2 + argc], *parts[i + 3 + argc : end]])
            i = end
    except (ValueError, IndexError):
        out.append([b"<unreadable stub log>", *parts[i:]])
    return out


# --------------------------------------------------------------------------- sbatch's parser

_SLURM_CONF = """ClusterName=hostile
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=1
AuthType=auth/none
NodeName=n1 CPUs=4 State=UNKNOWN
PartitionName=debug Nodes=n1 Default=YES
"""


def sbatch_options(script: str, tmp: Path) -> dict[str, str]:
    """The options the real sbatch parses from ``script`` (its ``-v`` dump), without a controller."""
    conf = tmp / "hostile-slurm.conf"
    if not conf.exists():
        conf.write_text(_SLURM_CONF)
    path = tmp / "sbatch-input.sh"
    path.write_bytes(script.encode("utf-8", "surrogateescape"))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for k in list(env):
        if k.startswith(("SBATCH_", "SLURM_")) and k != "SLURM_CONF":
            del env[k]
    proc = subprocess.Popen(
        ["sbatch", "-v", "--test-only", str(path)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
        env=env, cwd=tmp, start_new_session=True,
    )
    assert proc.stderr is not None
    opts: dict[str, str] = {}
    lines: list[str] = []
    inside = False
    deadline = time.monotonic() + 30
    try:
        for raw in proc.stderr:
            line = raw.decode("utf-8", "surrogateescape").rstrip("\n")
            lines.append(line)
            if "defined options" in line and "end of" not in line:
                inside = True
            elif "end of defined options" in line:
                break
            elif inside and ": " in line and not line.startswith("sbatch: ----"):
                body = line[len("sbatch: "):] if line.startswith("sbatch: ") else line
                key, _, value = body.partition(" : ")
                opts[key.strip()] = value
            if time.monotonic() > deadline:
                break
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    if not inside:
        opts["<error>"] = " | ".join(lines[-3:])
    for k in ("verbose", "test-only"):
        opts.pop(k, None)
    return opts


# --------------------------------------------------------------------------- the matrix


@dataclass(frozen=True)
class Setup:
    name: str
    args: tuple[str, ...]
    kind: str  # local, slurm, pbs, kubernetes, runai
    tags: frozenset[str] = frozenset()


def _setups() -> list[Setup]:
    out = [Setup("local", ("-n", "1"), "local")]
    for launcher in ("torchrun", "srun", "mpirun"):
        tags = {"slurm", "torchrun"} if launcher == "torchrun" else {"slurm"}
        out.append(Setup(f"slurm-{launcher}", ("--scheduler", "slurm", "--launcher", launcher), "slurm", frozenset(tags)))
    out.append(Setup("pbs-mpirun", ("--scheduler", "pbs", "--launcher", "mpirun"), "pbs", frozenset({"pbs"})))
    out.append(Setup("pbs-torchrun", ("--scheduler", "pbs", "--launcher", "torchrun"), "pbs", frozenset({"pbs", "torchrun"})))
    out.append(Setup("kubernetes", ("--scheduler", "kubernetes", "--image", "img:1"), "kubernetes",
                     frozenset({"kubernetes", "torchrun", "image"})))
    out.append(Setup("runai", ("--scheduler", "runai", "--image", "img:1"), "runai", frozenset({"runai", "torchrun", "image"})))
    images = {"apptainer": "/img.sif", "singularity": "/img.sif", "pyxis": "/img.sqsh", "enroot": "/img.sqsh",
              "docker": "img:1", "podman": "img:1", "charliecloud": "/img"}
    for rt, image in images.items():
        out.append(Setup(f"slurm-srun-{rt}", ("--scheduler", "slurm", "--launcher", "srun", "--container", image,
                                              "--runtime", rt), "slurm", frozenset({"slurm", "container"})))
    out.append(Setup("slurm-torchrun-apptainer-cleanenv", ("--scheduler", "slurm", "--container", "/img.sif",
                     "--cleanenv"), "slurm", frozenset({"slurm", "torchrun", "container"})))
    for rt, image in (("podman", "img:1"), ("apptainer", "/img.sif")):
        out.append(Setup(f"local-{rt}", ("-n", "1", "--container", image, "--runtime", rt), "local",
                         frozenset({"container"})))
    return out


SETUPS = _setups()
PROGRAM = ("train.py", "--steps", "3")


@dataclass(frozen=True)
class Field:
    """How a value enters a job: CLI args, the program, variables for the torchhpc process."""

    name: str
    build: Callable[[str], tuple[list[str], list[str], dict[str, str]]]
    needs: str = ""  # a setup tag; "" for every setup
    exact: bool = True  # the value must arrive verbatim (else: only where the placeholder was)
    stub_env: str = ""  # variables the stubs record
    varies: bool = False  # the value picks a code path (an image file needs no `enroot import`): compare the launch only
    command: str = "run"  # the torchhpc command rendering it (`sweep` for --grid)


def _flags(*flags: str) -> Callable[[str], tuple[list[str], list[str], dict[str, str]]]:
    return lambda v: ([*(f.replace("{V}", v) for f in flags)], list(PROGRAM), {})


FIELDS: list[Field] = [
    Field("arg", lambda v: ([], ["train.py", v], {})),
    Field("arg-mid", lambda v: ([], ["train.py", "--lr", v, "--end"], {})),
    Field("command", lambda v: (["--"], [v, "a"], {})),
    Field("module", lambda v: (["-m", v], ["a"], {})),
    Field("python", lambda v: (["--python", v], list(PROGRAM), {})),
    Field("env-value", _flags("--env", "HV={V}"), stub_env="HV"),
    Field("env-name", _flags("--env", "{V}=1"), exact=False),
    Field("name", _flags("--name", "{V}"), exact=False),
    Field("output-dir", _flags("--output-dir", "{V}"), exact=False),
    Field("time", _flags("--time", "{V}"), exact=False),
    Field("mem", _flags("--mem", "{V}"), exact=False),
    Field("nodes-variable", lambda v: ([], list(PROGRAM), {"TORCHHPC_NODES": v}), exact=False),
    Field("opt-key", _flags("--opt", "{V}=1"), exact=False),
    Field("partition", _flags("--partition", "{V}"), needs="slurm"),
    Field("account", _flags("--account", "{V}")),
    Field("queue", _flags("--queue", "{V}"), needs="pbs"),
    Field("opt-constraint", _flags("--opt", "constraint={V}"), needs="slurm"),
    Field("opt-cpu-bind", _flags("--opt", "cpu_bind={V}"), needs="slurm"),
    Field("opt-max-restarts", _flags("--opt", "max_restarts={V}"), needs="torchrun", exact=False),
    Field("opt-namespace", _flags("--opt", "namespace={V}"), needs="kubernetes"),
    Field("opt-workdir", _flags("--opt", "workdir={V}"), needs="image"),
    Field("opt-log-dir", _flags("--opt", "log_dir={V}"), needs="runai"),
    Field("opt-pvc", _flags("--opt", "pvc=claim:/{V}"), needs="image"),
    Field("image", _flags("--image", "{V}"), needs="image", exact=False),
    Field("container", _flags("--container", "{V}"), needs="container", exact=False, varies=True),
    Field("bind", _flags("--bind", "/data/{V}:/mnt"), needs="container"),
    Field("container-env", _flags("--container-env", "CV={V}"), needs="container",
          stub_env="CV APPTAINERENV_CV SINGULARITYENV_CV"),
    # Job arrays (issue 15): {index} replaced in the task (task 1 here), a --grid value reaching the program.
    Field("array-arg", lambda v: (["--array", "0-2"], ["train.py", "--seed", "{index}", v + "{index}"], {})),
    Field("grid", lambda v: (["--grid", "p=" + json.dumps(["a", v])], ["train.py", "--lr", "{p}"], {}),
          command="sweep"),
]


def applicable(setup: Setup, fld: Field) -> bool:
    return not fld.needs or fld.needs in setup.tags


def pairs(setups: Sequence[Setup] = SETUPS, fields: Sequence[Field] = FIELDS) -> list[tuple[Setup, Field]]:
    return [(s, f) for s in setups for f in fields if applicable(s, f)]


# Through every (setup, field) in CI: a trailing newline (F1), #PBS/#SBATCH line starts (F2),
# a command on its own line and in $(...), quotes, '%' and '../'; and an option-looking word (F4).
CORE = (
    "a'b %x ../$(touch CANARY)\n#PBS -q evilpart\n#SBATCH -p evil\ntouch CANARY\n",
    "--privileged",
)


def reduced_pick(values: Sequence[str], setups: Sequence[Setup] = SETUPS, fields: Sequence[Field] = FIELDS,
                 per_value: int = 2, share: tuple[int, int] = (0, 1)) -> Callable[[int, Setup, Field], bool]:
    """CI's thinning: CORE through every pair; of the other values, those with ``i % share[1] == share[0]``
    each through ``per_value`` pairs, spread out."""
    index = {(s.name, f.name): k for k, (s, f) in enumerate(pairs(setups, fields))}
    n = max(1, len(index))

    def pick(i: int, setup: Setup, fld: Field) -> bool:
        if values[i] in CORE:
            return True
        if i % share[1] != share[0]:
            return False
        k = index.get((setup.name, fld.name), -1)
        return any((i * 37 + j * (n // per_value + 1)) % n == k for j in range(per_value))

    return pick


def corpus(name: str = "corpus.json") -> list[str]:
    data: list[str] = json.loads((DATA / name).read_text(encoding="utf-8"))
    return data


# --------------------------------------------------------------------------- one case


@dataclass
class Rendered:
    code: int
    out: str
    err: str
    traceback: str = ""
    files: dict[str, str] = field(default_factory=dict)
    submit: str = ""
    boot_dir: str = ""  # the boot copy the dry run names in one line, written at submit


def render(args: Sequence[str], env: dict[str, str], command: str = "run") -> Rendered:
    """``torchhpc COMMAND --dry-run ARGS`` in this process; an escaping exception is a traceback."""
    from torchhpc.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    tb = ""
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([command, "--dry-run", *args])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 2
    except Exception:
        code, tb = -1, traceback.format_exc(limit=6)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    r = Rendered(code, out.getvalue(), err.getvalue(), tb)
    if code == 0 and not tb:
        try:  # what a real (UTF-8) stdout must be able to print
            r.out.encode("utf-8")
        except UnicodeEncodeError as e:
            r.code, r.traceback = -1, f"UnicodeEncodeError printing the dry run: {e}"
            return r
        _split(r)
    return r


def _split(r: Rendered) -> None:
    current: str | None = None
    buf: list[str] = []
    for line in r.out.split("\n"):
        if line.startswith("# --- ") and " --- torchhpc's boot copy" in line:
            r.boot_dir = line[6:].split(" --- ", 1)[0].rstrip("/")
            continue
        if line.startswith("# --- ") and line.endswith(" ---"):
            if current is not None:
                r.files[current] = "\n".join(buf) + "\n"
            # a script's header may say what becomes of its name ("(its name only: ...)"): the path is before it
            current, buf = re.sub(r" \(its name only: [^)]*\)$", "", line[6:-4]), []
        else:
            buf.append(line)
    if current == "submit with":
        r.submit = "\n".join(b for b in buf if not b.startswith("# note:")).strip("\n")
    elif current is not None:
        r.files[current] = "\n".join(buf) + "\n"


def script_of(setup: Setup, r: Rendered) -> str:
    """The shell text to run: the batch script, the local script, or RunAI's command line."""
    if setup.kind == "runai":
        return "#!/bin/bash\n" + r.submit + "\n"
    for path, text in r.files.items():
        if path.endswith((".sbatch", ".pbs")) or path == "script":
            return text
    return ""


def execute(setup: Setup, r: Rendered, workdir: Path, stub_env: str) -> tuple[list[list[bytes]], str]:
    """Run the case in ``workdir`` (emptied first: every case sees the same paths); return the stub
    records and a note (canary, timeout) if any."""
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    log = workdir / "stub.log"
    env = {
        "PATH": f"{stub_dir()}:/usr/bin:/bin", "STUB_LOG": str(log), "STUB_ENV": stub_env, "HOME": str(workdir),
        "LANG": "C.UTF-8", "USER": "hostile", "SIF": "/site/image.sif",  # a site's $SIF (LUMI)
    }
    if setup.kind == "kubernetes":
        argv, pod_env = _pod(r)
        env.update(pod_env)
        env.update({"RANK": "0", "PET_NODE_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "23456",
                    "PET_NNODES": "1", "PET_MASTER_ADDR": "10.0.0.1", "PET_MASTER_PORT": "23456"})
    else:
        if r.boot_dir:  # the boot copy torchhpc writes at submit (the job's python is not this one)
            from torchhpc.launchers.boot import boot_files

            Path(r.boot_dir).mkdir(parents=True, exist_ok=True)
            for name, text in boot_files():
                (Path(r.boot_dir) / name).write_text(text)
        script = script_of(setup, r)
        path = workdir / "job.sh"
        path.write_bytes(script.encode("utf-8", "surrogateescape"))
        argv = ["bash", str(path)]
        if setup.kind == "slurm":
            env.update({"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1",
                        "SLURM_NTASKS": "1", "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_JOB_ID": "41"})
        elif setup.kind == "pbs":
            nodefile = workdir / "nodefile"
            nodefile.write_text("node1\n")
            env.update({"PBS_NODEFILE": str(nodefile), "PBS_JOBID": "42.server", "PBS_O_WORKDIR": str(workdir),
                        "PBS_ARRAY_INDEX": "1"})
    note = ""
    try:
        subprocess.run(argv, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=30)
    except subprocess.TimeoutExpired:
        note = "TIMEOUT"
    for p in workdir.rglob("*"):
        if p.name in CANARIES:
            note = f"INJECTION: {p.name} created"
    records = parse_records(log.read_bytes()) if log.exists() else []
    return [_torchrun_view(_runai_view(rec)) for rec in records], note


# What a rank's command looks like in the records: the program, torchrun, a container runtime, or mpirun/pbsdsh
# (which start the ranks themselves and are only recorded here).
_RANK_COMMANDS = {
    b"python", b"python3", b"<torchrun>", b"<torchrun rejects>", b"apptainer", b"singularity", b"enroot",
    b"docker", b"podman", b"ch-run", b"mpirun", b"pbsdsh",
}


def _runai_view(rec: list[bytes]) -> list[bytes]:
    """RunAI's own argv minus the encoded pod command (that is checked by replaying it)."""
    if rec[:1] == [b"runai"] and b"-c" in rec:
        i = rec.index(b"-c")
        rec = [*rec[: i + 1], b"<pod command, replayed>", *rec[i + 2 :]]
        if b"--name" in rec:  # a Kubernetes name derived from --name or the program
            j = rec.index(b"--name")
            rec = [*rec[: j + 1], b"<name>", *rec[j + 2 :]]
        elif rec[2:5] == [b"training", b"pytorch", b"submit"]:  # the current CLI: the name is positional
            rec = [*rec[:5], b"<name>", *rec[6:]]
    return rec


def _pod(r: Rendered) -> tuple[list[str], dict[str, str]]:
    import yaml

    text = next(t for p, t in r.files.items() if p.endswith(".yaml"))
    obj = yaml.safe_load(text)
    if obj["kind"] == "TrainJob":  # the node container's command and env are trainer fields
        container = obj["spec"]["trainer"]
    else:
        container = obj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container.get("env", [])}
    return list(container["command"]), env


_TORCHRUN: Any = None


def _torchrun_view(rec: list[bytes]) -> list[bytes]:
    """``python -m torch.distributed.run ...`` as torchrun's own parser reads it: options, then the worker argv."""
    global _TORCHRUN
    if len(rec) < 4 or rec[0] not in (b"python", b"python3") or rec[2:4] != [b"-m", b"torch.distributed.run"]:
        return rec
    n = int(rec[1])
    args = [a.decode("utf-8", "surrogateescape") for a in rec[4 : 2 + n]]
    if _TORCHRUN is None:
        from torch.distributed.run import get_args_parser

        _TORCHRUN = get_args_parser()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            ns = _TORCHRUN.parse_args(args)
    except SystemExit:
        return [b"<torchrun rejects>", *rec[4:]]
    opts = sorted(f"{k}={v}" for k, v in vars(ns).items() if k not in ("training_script", "training_script_args"))
    if ns.no_python:
        worker = [ns.training_script, *ns.training_script_args]
    elif ns.module:
        worker = ["python", "-m", ns.training_script, *ns.training_script_args]
    else:
        worker = ["python", ns.training_script, *ns.training_script_args]
    enc = [w.encode("utf-8", "surrogateescape") for w in worker]
    return [b"<torchrun>", *(o.encode("utf-8", "surrogateescape") for o in opts), b"--", *enc, *rec[2 + n :]]


def expected(records: list[list[bytes]], value: str) -> list[list[bytes]]:
    ph, v = PLACEHOLDER.encode(), value.encode("utf-8", "surrogateescape")
    return [[a.replace(ph, v) for a in rec] for rec in records]


def loose_equal(base: list[list[bytes]], got: list[list[bytes]], last_only: bool = False) -> bool:
    """Same calls, same argv lengths, every word not derived from the value unchanged
    (``last_only``: only the last call, the rank's command, is compared)."""
    if last_only and base and got:
        base, got = base[-1:], got[-1:]
    if len(base) != len(got):
        return False
    ph = PLACEHOLDER.encode()
    for b, g in zip(base, got):
        if len(b) != len(g):
            return False
        if any(x != y for x, y in zip(b, g) if ph not in x):
            return False
    return True


def error_ok(r: Rendered) -> bool:
    """A refusal: exit 2 and one ``Error:`` line (plus an optional HINT), no traceback; or a usage error:
    ``torchhpc run: error: ...`` first, then one usage line (cli/parser.py)."""
    lines = [x for x in r.err.strip().splitlines() if x.strip()]
    usage = len(lines) <= 3 and lines[-1].startswith("HINT: usage: ") if lines else False
    return r.code == 2 and not r.traceback and bool(lines) and (lines[0].startswith("Error: ") or usage)


def shellcheck(paths: Iterable[Path]) -> list[str]:
    """Findings of the codes issue 20 forbids, over many scripts per shellcheck call."""
    found: list[str] = []
    batch = [str(p) for p in paths]
    for i in range(0, len(batch), 64):
        r = subprocess.run(["shellcheck", "-s", "bash", "-f", "gcc", "-i", SHELLCHECK_CODES, *batch[i : i + 64]],
                           capture_output=True, text=True, errors="replace")
        found += [line for line in r.stdout.splitlines() if line.strip()]
    return found


# --------------------------------------------------------------------------- the run


@dataclass
class Counts:
    cases: int = 0
    refused: int = 0
    rendered: int = 0
    executed: int = 0
    exact: int = 0
    injections: int = 0
    argv_mismatches: int = 0
    tracebacks: int = 0
    bad_errors: int = 0
    sbatch_checked: int = 0
    sbatch_mismatches: int = 0
    shellcheck_scripts: int = 0
    shellcheck_findings: int = 0
    failures: list[str] = field(default_factory=list)

    def fail(self, what: str) -> None:
        if len(self.failures) < 200:
            self.failures.append(what)

    def line(self) -> str:
        return (f"cases={self.cases} refused={self.refused} rendered={self.rendered} executed={self.executed} "
                f"exact={self.exact} injections={self.injections} argv_mismatches={self.argv_mismatches} "
                f"tracebacks={self.tracebacks} bad_errors={self.bad_errors} sbatch_checked={self.sbatch_checked} "
                f"sbatch_mismatches={self.sbatch_mismatches} shellcheck_scripts={self.shellcheck_scripts} "
                f"shellcheck_findings={self.shellcheck_findings}")


def run_matrix(
    values: Sequence[str],
    root: Path,
    *,
    setups: Sequence[Setup] = SETUPS,
    fields: Sequence[Field] = FIELDS,
    pick: Callable[[int, Setup, Field], bool] = lambda i, s, f: True,
    sbatch_every: int = 1,
    shellcheck_every: int = 1,
) -> Counts:
    """Every value through every applicable (setup, field); ``pick(i, setup, field)`` thins it out."""
    counts = Counts()
    lint: list[Path] = []
    common_out = str(root / "out")
    for s_i, setup in enumerate(setups):
        for f_i, fld in enumerate(fields):
            if not applicable(setup, fld):
                continue
            base_args = _case_args(setup, fld, PLACEHOLDER, common_out)
            base = render(*base_args, command=fld.command)
            base_records: list[list[bytes]] | None = None
            base_opts: dict[str, str] | None = None
            if base.code == 0:
                base_records, _ = execute(setup, base, root / "run", fld.stub_env)
                # (--python/command: the placeholder program is no stub; the launcher's record carries the value)
                if fld.name not in ("python", "command") and not any(
                    rec[:1] and rec[0] in _RANK_COMMANDS for rec in base_records
                ):
                    counts.argv_mismatches += 1  # the placeholder job never reached a rank: the check would be empty
                    counts.fail(f"BASE {setup.name}/{fld.name}: no rank command ran: {base_records!r}"[:800])
                if setup.kind == "slurm" and shutil.which("sbatch"):
                    base_opts = sbatch_options(script_of(setup, base), root)
            n_case = 0
            for v_i, value in enumerate(values):
                if not pick(v_i, setup, fld):
                    continue
                counts.cases += 1
                n_case += 1
                where = f"{setup.name}/{fld.name}/{value[:40]!r}"
                r = render(*_case_args(setup, fld, value, common_out), command=fld.command)
                if r.traceback or r.code not in (0, 2):
                    counts.tracebacks += 1
                    counts.fail(f"TRACEBACK {where}: code {r.code} {r.traceback.strip().splitlines()[-1:] or r.err[-200:]}")
                    continue
                if r.code == 2:
                    counts.refused += 1
                    if not error_ok(r):
                        counts.bad_errors += 1
                        counts.fail(f"BAD ERROR {where}: {r.err[-300:]!r}")
                    continue
                counts.rendered += 1
                workdir = root / "run"
                records, note = execute(setup, r, workdir, fld.stub_env)
                counts.executed += 1
                if note.startswith("INJECTION"):
                    counts.injections += 1
                    counts.fail(f"{note} {where}")
                elif note:
                    counts.fail(f"{note} {where}")
                if base_records is not None:
                    want = expected(base_records, value)
                    if records == want:
                        counts.exact += 1
                    elif fld.exact or not loose_equal(base_records, records, last_only=fld.varies):
                        counts.argv_mismatches += 1
                        counts.fail(f"ARGV {where}: got {records[-2:]!r} want {want[-2:]!r}"[:1500])
                if setup.kind == "slurm" and base_opts is not None and n_case % sbatch_every == 0:
                    counts.sbatch_checked += 1
                    opts = sbatch_options(script_of(setup, r), workdir)
                    if not _opts_ok(base_opts, opts, value, fld):
                        counts.sbatch_mismatches += 1
                        counts.fail(f"SBATCH {where}: {opts} vs {base_opts}")
                if setup.kind in ("slurm", "pbs", "local", "runai") and n_case % shellcheck_every == 0:
                    lint_path = root / "lint" / f"{s_i}-{f_i}-{v_i}.sh"
                    lint_path.parent.mkdir(parents=True, exist_ok=True)
                    lint_path.write_bytes(script_of(setup, r).encode("utf-8", "surrogateescape"))
                    lint.append(lint_path)
    counts.shellcheck_scripts = len(lint)
    findings = shellcheck(lint) if lint and shutil.which("shellcheck") else []
    counts.shellcheck_findings = len(findings)
    for f in findings[:20]:
        counts.fail(f"SHELLCHECK {f[:300]}")
    return counts


def _case_args(setup: Setup, fld: Field, value: str, out_dir: str) -> tuple[list[str], dict[str, str]]:
    flags, program, env = fld.build(value)
    args = [*setup.args, "--output-dir", out_dir]
    if fld.name != "python":
        args += ["--python", "python"]
    if fld.name in ("image", "container"):  # the field replaces the setup's own
        args = _drop(args, "--image" if fld.name == "image" else "--container")
    if "--" in flags:
        return [*args, *flags[:-1], "--", *program], env
    return [*args, *flags, *program], env


def _drop(args: list[str], flag: str) -> list[str]:
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == flag:
            skip = True
        else:
            out.append(a)
    return out


# Which sbatch option a field writes (its value must be the user's, unchanged).
_SBATCH_FIELD = {"name": "job-name", "partition": "partition", "account": "account", "opt-constraint": "constraint"}


def _opts_ok(base: dict[str, str], got: dict[str, str], value: str, fld: Field) -> bool:
    if "<error>" in got or set(base) != set(got):
        return False
    for k, v in base.items():
        if k == _SBATCH_FIELD.get(fld.name):
            if got[k] != value:
                return False
        elif PLACEHOLDER in v:
            continue  # derived from the value (output path under --output-dir, ...)
        elif k == "output":  # the file name follows the job name; the directory never does
            if got[k].rsplit("/", 1)[0] != v.rsplit("/", 1)[0] or not got[k].endswith(("-%j.out", "-%A_%a.out")):
                return False
        elif got[k] != v:
            return False
    return True
