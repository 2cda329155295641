"""``torchhpc net``: detect NCCL/gloo settings, list presets, check the transport really used."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from torchhpc.cli.common import add_subparser, env_default, eprint, help_when_bare
from torchhpc.errors import JobFailed, UsageError


def register(sub: Any) -> None:
    p = add_subparser(
        sub,
        "net",
        "NCCL/RCCL/gloo network: detect settings, presets, check the transport",
        description=(
            "Network settings that prove themselves.\n\n"
            "  torchhpc net detect --master node1      propose NCCL_IB_HCA, NCCL_IB_GID_INDEX, NCCL_SOCKET_IFNAME...\n"
            '  eval "$(torchhpc net detect --export --master "$MASTER_ADDR")"   apply them (your values win)\n'
            "  torchhpc net presets [NAME]              the documented presets for --network\n"
            "  torchhpc net check                       2-rank collective; which transport/interface was used\n"
            "  torchhpc net check --log slurm-42.out    judge an existing NCCL_DEBUG=INFO log"
        ),
    )
    nsub = p.add_subparsers(dest="net_command", metavar="ACTION")

    d = add_subparser(nsub, "detect", "read sysfs and propose NCCL/gloo variables, with the reason for each")
    d.add_argument(
        "--master",
        default=env_default("--master", os.environ.get("MASTER_ADDR")),
        help="host the ranks rendezvous at (default: $TORCHHPC_MASTER, then $MASTER_ADDR); picks the interface routing to it",
    )
    d.add_argument("--nodes", type=int, default=_env_nodes(),
                   help="nodes in the job (default: $SLURM_JOB_NUM_NODES); with 1, a loopback master may use lo")
    d.add_argument("--sysfs", default=env_default("--sysfs", "/"), metavar="ROOT",
                   help="root holding sys/ and proc/ (a fake tree in tests; default /)")
    out = d.add_mutually_exclusive_group()
    out.add_argument("--export", action="store_true",
                     help="print shell lines that export each variable unless already set (for eval)")
    out.add_argument("--json", action="store_true", help="machine-readable output")
    d.set_defaults(func=cmd_detect)

    s = add_subparser(nsub, "presets", "list the --network presets, or show one with the reason for each variable")
    s.add_argument("name", nargs="?", help="preset to show (e.g. roce, lumi-slingshot, debug)")
    s.add_argument("--export", action="store_true", help="print the preset as setdefault shell lines")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_presets)

    c = add_subparser(nsub, "check", "run a 2-rank collective and report the transport/interface it used")
    c.add_argument("--backend", choices=("auto", "gloo", "nccl"), default=env_default("--backend", "auto"),
                   help="auto: nccl when a GPU is visible, else gloo")
    c.add_argument("--nproc", type=int, default=2, help="ranks to start on this machine (default 2)")
    c.add_argument("--master-addr", default="127.0.0.1",
                   help="rendezvous address for the local ranks (default 127.0.0.1)")
    c.add_argument("--expect", choices=("auto", "fabric", "socket", "any"), default="auto",
                   help="auto: the fabric when this node has an ACTIVE RDMA port, else anything")
    c.add_argument("--log", action="append", default=[], metavar="FILE",
                   help="only parse this NCCL_DEBUG=INFO log (repeatable; '-' for stdin)")
    c.add_argument("--in-job", action="store_true",
                   help="be one rank of a job started by torchrun/srun/mpirun (uses RANK/SLURM_PROCID...)")
    c.add_argument("--timeout", type=float, default=180.0)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_check)
    help_when_bare(p)


# ---------------------------------------------------------------- detect


def _env_nodes() -> int | None:
    return next((int(value) for name in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES")
                 if (value := os.environ.get(name, "")).isdigit()), None)


def cmd_detect(args: argparse.Namespace) -> int:
    from torchhpc.core.shell import quote
    from torchhpc.core.validate import check_value
    from torchhpc.network.presets import setdefault_lines
    from torchhpc.network.select import detect
    from torchhpc.network.sysfs import probe

    root = args.sysfs
    if not os.path.isdir(root):
        raise UsageError(f"--sysfs {root!r} is not a directory", "give a root that holds sys/ and proc/")
    if args.master is not None:
        # --export output is eval'ed by job scripts: the master must stay one word on one line.
        check_value(args.master, "--master", line=True, empty=False)
    det = detect(probe(root), args.master, nodes=args.nodes)
    master = f" --master {quote(args.master)}" if args.master else ""
    if args.json:
        print(json.dumps(det.to_dict(), indent=2))
        return 0
    if args.export:
        print(_comment(f"torchhpc net detect{master}: set only what you did not set"))
        for c in det.choices:
            print(_comment(f"{c.name}: {c.reason}"))
        for line in setdefault_lines(det.env):
            print(line)
        for w in det.warnings:
            eprint(f"torchhpc net detect: warning: {w}")
        return 0
    rows = [(c.name, c.value if c.value is not None else "(unset)", c.reason) for c in det.choices]
    _table(("VARIABLE", "VALUE", "WHY"), rows)
    for w in det.warnings:
        print(f"warning: {w}")
    if det.env:
        print("\napply (your values win):  eval \"$(torchhpc net detect --export" + master + ')"')
    return 0


def _comment(text: str) -> str:
    """One ``# ...`` line whatever ``text`` holds: output meant for eval never gains a line from a value."""
    return "# " + "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header) - 1)]
    for r in [header, *rows]:
        cells = [str(c).ljust(w) for c, w in zip(r, widths)]
        print("  ".join([*cells, str(r[-1])]).rstrip())


# ---------------------------------------------------------------- presets


def cmd_presets(args: argparse.Namespace) -> int:
    from torchhpc.network.presets import AUTO, PRESETS, preset_env, setdefault_lines

    if not args.name:
        if args.json:
            print(json.dumps({n: {"summary": p.summary, "env": p.as_dict()} for n, p in PRESETS.items()}, indent=2))
            return 0
        rows = [(AUTO, "detect on each node at job start (`torchhpc net detect --export`)")]
        rows += [(n, p.summary) for n, p in PRESETS.items()]
        _table(("PRESET", "WHAT"), rows)
        print("\nCombine with a comma (--network roce,debug); variables you set yourself always win.")
        return 0
    env = preset_env(args.name)
    if args.json:
        print(json.dumps(env, indent=2))
    elif args.export:
        print("\n".join(setdefault_lines(env)))
    else:
        why = {k: w for p in PRESETS.values() for k, _, w in p.env}
        for part in args.name.replace("+", ",").split(","):
            if part.strip() in PRESETS:
                print(f"# {part.strip()}: {PRESETS[part.strip()].summary}")
        _table(("VARIABLE", "VALUE", "WHY"), [(k, v, why.get(k, "")) for k, v in env.items()])
    return 0


# ---------------------------------------------------------------- check


def cmd_check(args: argparse.Namespace) -> int:
    from torchhpc.network.check import parse_nccl_log, run_local, verdict

    expect = args.expect
    if expect == "auto":
        expect = _auto_expect()
    if args.log:
        text = "".join(sys.stdin.read() if f == "-" else _read_log(f) for f in args.log)
        rep = parse_nccl_log(text)
        v = verdict(rep, expect)
        if args.json:
            print(json.dumps({"report": rep.to_dict(), "status": v.status, "message": v.message, "hint": v.hint}, indent=2))
        else:
            print(f"{v.status.upper()}: {v.message}")
            for w in rep.warnings:
                print(f"  NCCL WARN: {w}")
        if v.status == "fail":
            raise JobFailed(v.message, v.hint)
        return 0
    if args.in_job:
        from torchhpc.network import _check_worker

        return _check_worker.main()
    backend = args.backend
    if backend == "auto":
        backend = "nccl" if _gpu_visible() else "gloo"
    results = run_local(args.nproc, backend, args.master_addr, timeout=args.timeout)
    failed = [r for r in results if not r.ok]
    ranks = [{k: v for k, v in r.report.items() if k != "nccl_log"} | {"returncode": r.returncode} for r in results]
    summary: dict[str, Any] = {"backend": backend, "ranks": ranks}
    status, message, hint = "pass", "", None
    if backend == "nccl":
        rep = parse_nccl_log("".join(r.output + str(r.report.get("nccl_log", "")) for r in results))
        v = verdict(rep, expect)
        summary["nccl"] = rep.to_dict()
        status, message, hint = v.status, v.message, v.hint
    else:
        ifaces = sorted({i for r in results for i in r.ifaces})
        message = f"gloo all_reduce over {args.nproc} ranks used {', '.join(ifaces) or 'no TCP connection'}"
        if expect == "fabric":
            status, hint = "warn", "gloo runs on TCP sockets only; run with --backend nccl on GPU nodes to test the fabric"
    if failed:
        status = "fail"
        tail = failed[0].output.strip().splitlines()[-5:]
        message = f"rank {failed[0].rank} failed (exit {failed[0].returncode}): " + " | ".join(tail)
        hint = "run `torchhpc doctor` and `torchhpc net detect` on this node"
    summary.update({"status": status, "message": message, "hint": hint})
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for r in results:
            rep_ = r.report
            print(f"rank {r.rank}: {'ok' if r.ok else 'FAILED'}  backend={rep_.get('backend', backend)}  "
                  f"sum={rep_.get('sum')} (expected {rep_.get('expected')})  ifaces={','.join(r.ifaces) or '-'}")
        print(f"{status.upper()}: {message}")
        if hint and status != "pass":
            print(f"HINT: {hint}")
    if status == "fail":
        raise JobFailed(message, hint)
    return 0


def _read_log(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError as e:
        raise UsageError(f"--log {path!r} cannot be read: {e.strerror}") from None


def _auto_expect() -> str:
    from torchhpc.network.sysfs import probe

    return "fabric" if any(p.active for p in probe("/").ib_ports) else "any"


def _gpu_visible() -> bool:
    """Without importing torch: a driver node for NVIDIA or AMD and not hidden by *_VISIBLE_DEVICES."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    return os.path.exists("/dev/nvidia0") or os.path.exists("/dev/kfd")
