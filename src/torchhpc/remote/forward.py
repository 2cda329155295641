"""``--remote [USER@]HOST``: run a torchhpc command on a login node, over ssh.

The remote ``torchhpc`` does the work; this side only ships the code and
forwards the command line (no second implementation of any scheduler). Any
subcommand given ``--remote`` is forwarded; ``TORCHHPC_REMOTE`` and the
``remote`` key of the config file or profile apply to :data:`REMOTE_COMMANDS`.

``run`` (and ``sweep``) first ship the code (:mod:`.ship`) into
``~/.torchhpc/code/<digest>/`` there, then run the command in that copy, at the
same place relative to the checkout as here, so ``examples/pi.py`` means the
shipped file. A submission is forwarded with ``--json`` and its handle printed
here, with the follow-up commands that carry ``--remote``; ``--wait`` then
forwards ``wait HANDLE --logs``. Everything else streams through unchanged.

Every remote command first checks the torchhpc there (``--version``) in the
same ssh call and answers a missing or different one with one line and a HINT.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import torchhpc.remote.ship as shipping
from torchhpc import __version__
from torchhpc.core.shell import Raw, join, quote
from torchhpc.core.units import counted
from torchhpc.errors import RemoteError, UsageError
from torchhpc.remote.route import ENV_SIDE, REMOTE_COMMANDS, SHIPPING_COMMANDS, extract, target
from torchhpc.remote.ssh import Ssh, command_words

__all__ = ["ENV_COMMAND", "ENV_SIDE", "REMOTE_COMMANDS", "Request", "extract", "forward", "target"]

# REMOTE_COMMANDS, ENV_SIDE, extract and target live in .route (the CLI reads them for every command line).
INTERACTIVE = ("top", "shell")
ENV_COMMAND = "TORCHHPC_REMOTE_COMMAND"
CODE_DIR = ".torchhpc/code"
JOBS_DIR = ".torchhpc/jobs"


@dataclass
class Request:
    """One forwarded command: what to run there and how to ship."""

    argv: list[str]  # the torchhpc command line without the --remote/--ship flags
    host: str
    ship: str = "worktree"
    limit: int = shipping.DEFAULT_LIMIT
    program: list[str] | None = None  # run/sweep: the program and its arguments
    flags: list[str] | None = None  # run/sweep: torchhpc's own flags
    sep: bool = False  # run/sweep: the program came after `--` (a command, not a file)
    options: dict[str, Any] | None = None  # run: its flags parsed (scheduler, wait, json, dry_run...)


def _cmd_prefix() -> str:
    """The remote torchhpc as bash words: $TORCHHPC_REMOTE_COMMAND (default ``torchhpc``), quoted."""
    words = list(command_words(os.environ.get(ENV_COMMAND, "") or "torchhpc"))
    first = words[0]
    head = Raw('"$HOME"/' + quote(first[2:])) if first.startswith("~/") else first
    return join([head, *words[1:]])


def prelude() -> str:
    """bash that checks the remote torchhpc (missing, other version) and exports the no-forward marker."""
    want = f"torchhpc {__version__}"
    hint_install = (f"install torchhpc {__version__} there (pip install torchhpc=={__version__}), or set "
                    f"{ENV_COMMAND} to its path there")
    return "\n".join([
        f"export {ENV_SIDE}=1",
        f"cmd=({_cmd_prefix()})",
        'if ! v=$("${cmd[@]}" --version 2>&1); then',
        "  printf '%s\\n' \"Error: no torchhpc on $(hostname) (${cmd[*]} --version: ${v##*$'\\n'})\" "
        f"{quote('HINT: ' + hint_install)} >&2",
        "  exit 127",
        "fi",
        f'if [ "$v" != {quote(want)} ]; then',
        f"  printf '%s\\n' \"Error: $(hostname) runs ${{v##*$'\\n'}}, this is {want}\" "
        f"{quote('HINT: ' + hint_install)} >&2",
        "  exit 2",
        "fi",
    ])


def code_dir(digest: str) -> Raw:
    return Raw(f'"$HOME"/{CODE_DIR}/{digest}')


def probe_script(digest: str) -> str:
    return prelude() + f"\nif [ -d {code_dir(digest)} ]; then echo present; else echo absent; fi\n"


def upload_script(digest: str) -> str:
    """Unpack the payload on stdin into the code directory, atomically (a rename), once."""
    base = Raw(f'"$HOME"/{CODE_DIR}')
    return "\n".join([
        "set -e",
        f"mkdir -p {base}",
        f"d={code_dir(digest)}",
        '[ -d "$d" ] && exit 0',
        f't=$(mktemp -d {base}/.incoming.XXXXXX)',
        "trap 'rm -rf \"$t\"' EXIT",
        'tar -xf - -C "$t"',
        'mkdir "$t/code"',
        'tar -xf "$t/tree.tar" -C "$t/code"',
        'if [ -f "$t/changes.patch" ]; then',
        # The ceiling keeps git from finding a repository above (a dotfiles repo in $HOME).
        '  if ! (cd "$t/code" && GIT_CEILING_DIRECTORIES="$t" git apply --whitespace=nowarn "$t/changes.patch"); then',
        "    printf '%s\\n' \"Error: the uncommitted changes did not apply on $(hostname) (git apply)\" "
        "'HINT: commit them and ship again, or use --ship committed' >&2",
        "    exit 3",
        "  fi",
        "fi",
        'mv -T "$t/code" "$d" 2>/dev/null || [ -d "$d" ]',
        "",
    ])


def command_script(argv: Sequence[str], cwd: str | Raw | None, extra_dirs: Sequence[Raw] = ()) -> str:
    """prelude + ``cd`` + exec the remote torchhpc with ``argv`` (every word quoted)."""
    lines = [prelude(), *(f"mkdir -p {d}" for d in extra_dirs)]
    if cwd is not None:
        lines.append(f"cd {quote(cwd)}")
    lines.append('exec "${cmd[@]}" ' + join(argv))
    return "\n".join(lines) + "\n"


def _relative_cwd(root: str) -> str:
    rel = os.path.relpath(os.getcwd(), root)
    return "" if rel == "." else rel


def _program_args(req: Request, root: str) -> list[str]:
    """The program path as seen from the shipped copy: inside the checkout, or refused."""
    prog = list(req.program or [])
    flags = req.flags or []
    if not prog or "-m" in flags or "--module" in flags or any(f.startswith("--module=") for f in flags):
        return prog
    if req.sep:
        return prog  # `-- COMMAND`: a command, not a file of the checkout
    path = os.path.abspath(prog[0])
    if os.path.commonpath([path, root]) != root:
        raise UsageError(f"{prog[0]} is outside {root}, the code --remote ships",
                         "run torchhpc from inside the program's checkout or directory")
    if os.path.isabs(prog[0]):
        prog[0] = os.path.relpath(path, os.getcwd())
    return prog


def forward(req: Request, dry_run: bool = False) -> int:
    ssh = Ssh(req.host)
    command = req.argv[0]
    if command not in SHIPPING_COMMANDS:
        script = command_script(req.argv, Raw('"$HOME"'))
        if dry_run:
            print("\n".join(ssh.shown(script)))
            return 0
        return ssh.stream(script, tty=command in INTERACTIVE and sys.stdin.isatty() and sys.stdout.isatty())
    return _forward_shipping(ssh, req, dry_run)


def _forward_shipping(ssh: Ssh, req: Request, dry_run: bool) -> int:
    from torchhpc.remote.report import dry_run_lines, shipped_line

    bundle = shipping.collect(os.getcwd(), req.ship, req.limit)
    program = _program_args(req, bundle.root)
    flags = list(req.flags or [])
    args = dict(req.options or {})
    here = _relative_cwd(bundle.root)
    cwd = Raw(f"{code_dir(bundle.digest)}/{quote(here)}") if here else code_dir(bundle.digest)
    submit = req.argv[0] == "run" and _submits(args)
    # A dry run shows the command that would run (without --dry-run); a submission is sent with --json.
    drop = {"--dry-run", *(("--wait", "--json") if submit else ())}
    own = [f for f in flags if f not in drop]
    extra_dirs: list[Raw] = []
    if req.argv[0] == "run" and not args.get("output_dir"):
        own += ["--output-dir", Raw(f'"$HOME"/{JOBS_DIR}')]  # outputs never land in the shared code copy
        extra_dirs.append(Raw(f'"$HOME"/{JOBS_DIR}'))
    sep = ["--"] if req.sep else []
    remote_argv = [req.argv[0], *own, *(["--json"] if submit else []), *sep, *program]
    script = command_script(remote_argv, cwd, extra_dirs)
    if dry_run:
        for line in dry_run_lines(bundle, req.host, ssh, probe_script(bundle.digest), upload_script(bundle.digest),
                                  script):
            print(line)
        return 0
    t0 = time.monotonic()
    done = ssh.run(probe_script(bundle.digest))
    if done.returncode != 0:
        return done.returncode  # the prelude said why, on stderr
    shipped = 0
    if done.stdout.decode().strip() != "present":
        payload = bundle.payload()
        up = ssh.run(upload_script(bundle.digest), input=payload)
        if up.returncode != 0:
            raise RemoteError(f"shipping the code to {req.host} failed (exit code {up.returncode})",
                              "the message above says why")
        shipped = len(payload)
    print(shipped_line(bundle, req.host, shipped, time.monotonic() - t0), file=sys.stderr)
    if not submit:
        return ssh.stream(script)
    return _submit(ssh, req, script, args, bundle.digest, shipped)


def _submits(args: dict[str, Any]) -> bool:
    """A submission (a handle to print), not a foreground local run: --background, or a batch scheduler."""
    if args.get("background"):
        return True
    from torchhpc.resolve import resolve_values
    from torchhpc.schedulers import scheduler_class

    values = {k: args.get(k) for k in ("scheduler", "profile")}
    return not scheduler_class(str(resolve_values(values)[1]["scheduler"].value)).runs_here


def _submit(ssh: Ssh, req: Request, script: str, args: dict[str, Any], digest: str, shipped: int) -> int:
    from torchhpc.remote.report import follow_hint

    done = ssh.run(script)
    text = done.stdout.decode(errors="replace").strip()
    try:
        answer = json.loads(text.splitlines()[-1]) if text else {}
    except ValueError:
        answer = {}
    if "error" in answer:
        err = RemoteError(f"{req.host}: {answer['error']}", answer.get("hint"))
        err.exit_code = int(answer.get("exit_code") or 1)  # a usage error there is one here (2)
        raise err
    if done.returncode != 0 or "handle" not in answer:
        if text:
            print(text)
        return done.returncode or 1
    handle = answer["handle"]
    extra = {"remote": req.host, "code_dir": f"~/{CODE_DIR}/{digest}", "shipped_bytes": shipped}
    if args.get("json") and not args.get("wait"):
        print(json.dumps({**answer, **extra}))
        return 0
    out = sys.stderr if args.get("json") else sys.stdout
    shape = f"{counted(int(answer.get('nodes') or 1), 'node')} x {counted(int(answer.get('nproc_per_node') or 1), 'rank')}"
    print(f"Submitted {handle} on {req.host} ({answer.get('name')}: {shape}, {answer.get('launcher')})", file=out)
    if not args.get("wait"):
        print(follow_hint(handle, req.host), file=out)
        return 0
    hang = ["--hang-timeout", str(args["hang_timeout"]), "--on-hang", str(args["on_hang"])] \
        if args.get("hang_timeout") else []
    code = ssh.stream(command_script(["wait", handle, *([] if args.get("json") else ["--logs"]), *hang],
                                     Raw('"$HOME"')), stdout=2 if args.get("json") else None)
    if args.get("json"):
        st = ssh.run(command_script(["status", handle, "--json"], Raw('"$HOME"')))
        with suppress(ValueError):
            print(json.dumps({**json.loads(st.stdout.decode()), **extra}))
    return code
