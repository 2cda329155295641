"""Network presets: documented data, applied with setdefault so the user's values win.

Each :class:`Preset` is a small table of environment variables with one line
of "why" per variable (shown by ``torchhpc net presets``, copied into
docs/network.md). Presets combine (``roce,debug``): later presets fill only
what earlier ones left unset, and the user's own environment is never
overwritten, neither in Python (:func:`apply`) nor in generated shell
(:func:`setdefault_lines`, which skips a variable that is set at all, even
to an empty value).

``auto`` is not a table: it means "detect on the node at job start" — a
rendered script runs ``eval "$(python -m torchhpc net detect --export --master
"$MASTER_ADDR")"`` (see :func:`auto_lines`).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

from torchhpc.core.shell import join, quote, validate_env_name
from torchhpc.errors import UsageError

__all__ = [
    "AUTO",
    "PRESETS",
    "Preset",
    "apply",
    "auto_lines",
    "preset_env",
    "preset_names",
    "script_lines",
    "setdefault_lines",
    "wants_auto",
]

AUTO = "auto"


@dataclass(frozen=True)
class Preset:
    """A named set of variables; ``env`` is ``((NAME, VALUE, WHY), ...)``."""

    name: str
    summary: str
    env: tuple[tuple[str, str, str], ...]

    def as_dict(self) -> dict[str, str]:
        return {k: v for k, v, _ in self.env}


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "tcp",
            "Plain TCP sockets: no RDMA fabric, or one you must avoid (e.g. a broken HCA).",
            (
                ("NCCL_IB_DISABLE", "1", "do not even probe InfiniBand/RoCE devices"),
                ("NCCL_NET", "Socket", "use NCCL's socket transport, never a plugin"),
                ("NCCL_SOCKET_NTHREADS", "4", "more CPU threads per connection (the EPFL RCP guide; NCCL allows up to 16)"),
                ("NCCL_NSOCKS_PERTHREAD", "8", "more sockets per thread to fill fast links (the EPFL RCP guide; threads x socks <= 64)"),
            ),
        ),
        Preset(
            "infiniband",
            "InfiniBand verbs, allowed even where a site sets NCCL_IB_DISABLE=1 (`net check` catches a socket fallback).",
            (
                # No NCCL_NET=IB: no seed or site guide sets it, and it would bypass an external net
                # plugin (the SHARP/CollNet plugin registers as IBext) where the site installs one.
                ("NCCL_IB_DISABLE", "0", "allow the IB transport (undo a site-wide NCCL_IB_DISABLE=1)"),
            ),
        ),
        Preset(
            "roce",
            "RoCE v2 over ConnectX (EPFL RCP, the EPFL RCP guide): IB verbs on Ethernet with the right GID.",
            (
                ("NCCL_IB_DISABLE", "0", "allow the IB transport, which is what RoCE uses"),
                ("NCCL_IB_HCA", "mlx5", "ConnectX devices (the EPFL RCP guide); `net detect` narrows it to the active ports"),
                ("NCCL_IB_ROCE_VERSION_NUM", "2", "RoCE v2 (routable UDP); NCCL >= 2.21 then picks the GID itself"),
                ("NCCL_IB_ADDR_FAMILY", "AF_INET", "the IPv4-mapped GID, as the EPFL RCP guide's grep for ::ffff: does"),
                ("NCCL_SOCKET_NTHREADS", "4", "the EPFL RCP guide's socket tuning for the bootstrap/fallback path"),
                ("NCCL_NSOCKS_PERTHREAD", "8", "the EPFL RCP guide's socket tuning"),
            ),
        ),
        Preset(
            "lumi-slingshot",
            "LUMI: AMD MI250X GCDs on HPE Slingshot-11 (LUMI's guide); RCCL reads NCCL_* names.",
            (
                ("NCCL_SOCKET_IFNAME", "hsn0,hsn1,hsn2,hsn3", "the four Slingshot rails, never the management network nmn0 (LUMI's guide)"),
                ("NCCL_NET_GDR_LEVEL", "3", "GPU-direct RDMA up to the host bridge (LUMI's guide; RCCL default from ROCm 6.2)"),
                ("GLOO_SOCKET_IFNAME", "hsn0", "gloo takes exact names; hsn0 reaches every node"),
            ),
        ),
        Preset(
            "debug",
            "Say what happens: NCCL init/network choices, torch.distributed consistency checks.",
            (
                ("NCCL_DEBUG", "INFO", "print NCCL's transport choices (`net check` parses them)"),
                ("NCCL_DEBUG_SUBSYS", "INIT,NET", "only init and network lines, not every collective"),
                ("TORCH_DISTRIBUTED_DEBUG", "DETAIL", "check collective shapes/order across ranks, log DDP details"),
                ("TORCH_CPP_LOG_LEVEL", "INFO", "show c10d's C++ log lines (rendezvous, store)"),
                ("TORCH_SHOW_CPP_STACKTRACES", "1", "C++ stack traces on errors"),
                ("LOGLEVEL", "INFO", "torchrun's own log level"),
                ("PYTHONFAULTHANDLER", "1", "dump Python stacks on a crash or hang signal"),
            ),
        ),
    )
}


def preset_names() -> list[str]:
    return [AUTO, *PRESETS]


def _split(name: str) -> list[str]:
    parts = [p.strip() for p in name.replace("+", ",").split(",") if p.strip()]
    if not parts:
        raise UsageError(f"--network {name!r} names no preset", f"choose from: {', '.join(preset_names())}")
    return parts


def preset_env(name: str) -> dict[str, str]:
    """The variables of preset ``name`` (``"roce,debug"`` combines; the first preset wins a clash).

    ``auto`` contributes nothing here: it is detected on the node at job start.
    An unknown name raises :class:`UsageError` listing the valid ones.
    """
    env: dict[str, str] = {}
    for part in _split(name):
        if part == AUTO:
            continue
        preset = PRESETS.get(part)
        if preset is None:
            raise UsageError(
                f"--network {part!r} is not a network preset",
                f"choose from: {', '.join(preset_names())} (combine with a comma, e.g. roce,debug)",
            )
        for k, v, _ in preset.env:
            env.setdefault(k, v)
    return env


def wants_auto(name: str) -> bool:
    """Whether ``name`` asks for detection at job start (``auto`` or ``auto,debug``)."""
    return AUTO in _split(name)


def apply(env: MutableMapping[str, str], values: Mapping[str, str]) -> list[str]:
    """Set each variable not already in ``env``; return the names set (the user's values win)."""
    added = {k: v for k, v in values.items() if k not in env}
    env.update(added)
    return list(added)


def setdefault_lines(values: Mapping[str, str]) -> list[str]:
    """Shell lines that export each variable only if it is not set at all.

    ``[ -n "${NAME+x}" ] || export NAME=value`` is safe under ``set -eu``
    and treats a variable set to "" as the user's choice.
    """
    return [
        f'[ -n "${{{validate_env_name(k)}+x}}" ] || export {k}={quote(v)}'
        for k, v in values.items()
    ]


def auto_lines(python: str = "python", master_var: str = "MASTER_ADDR") -> list[str]:
    """Lines for a batch script: detect on the node, apply with setdefault semantics."""
    validate_env_name(master_var)
    cmd = join([python, "-m", "torchhpc", "net", "detect", "--export"])
    return [
        "# torchhpc --network auto: choose NCCL/gloo interfaces, HCA and GID on this node",
        f'eval "$({cmd} ${{{master_var}:+--master \"${master_var}\"}})"',
    ]


def script_lines(network: str, python: str = "python", master_var: str = "MASTER_ADDR") -> list[str]:
    """Everything ``--network NAME`` adds to a batch script, with setdefault semantics.

    The presets' variables come first (a variable the user exported at submit
    time wins, sbatch passes the environment on); ``auto`` then detects on the
    node and fills only what is still unset. Put these lines after
    ``MASTER_ADDR`` is known.
    """
    lines = []
    env = preset_env(network)
    if env:
        lines.append(f"# torchhpc --network {network}: set unless already set")
        lines.extend(setdefault_lines(env))
    if wants_auto(network):
        lines.extend(auto_lines(python, master_var))
    return lines
