"""Kubernetes I/O without the kubernetes package: a deterministic YAML emitter and a stdlib REST client.

Used by :mod:`torchhpc.schedulers.kubernetes.kubernetes` (TrainJob/PyTorchJob manifests, ``submit``
without kubectl). Both are small on purpose: PyYAML and the ``kubernetes``
client are never runtime dependencies.
"""

from __future__ import annotations

import json
import os
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from torchhpc.errors import QuotingError, SchedulerError

__all__ = ["KubeAPI", "to_yaml"]

_SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


# --- a tiny YAML emitter -------------------------------------------------------------

# fullmatch only: ``$`` would also match before a final newline.
_PLAIN = re.compile(r"[A-Za-z_/][A-Za-z0-9_./=+-]*(?::[A-Za-z0-9_./=+-]+)*")
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    text = str(value)
    if _PLAIN.fullmatch(text) and text.lower() not in _YAML_WORDS:
        return text
    return _double_quoted(text)


def _printable(code: int) -> bool:
    return 0x20 <= code <= 0x7E or (0xA0 <= code <= 0xFFFD and code not in (0x2028, 0x2029, 0xFEFF)) or code > 0xFFFF


def _double_quoted(text: str) -> str:
    """A YAML double-quoted scalar: printable characters as they are (emoji included, never as
    JSON's surrogate pairs, which YAML parsers reject), everything else as an escape."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif 0xD800 <= code <= 0xDFFF:
            raise QuotingError(f"{text[:40]!r} is not valid UTF-8 (a manifest holds only text)", "use UTF-8 text")
        elif _printable(code):
            out.append(ch)
        elif code <= 0xFF:
            out.append(f"\\x{code:02x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out) + '"'


def _literal(value: Any, indent: int) -> str | None:
    """A multi-line string as a literal block (``|``), so a pod's script reads as the script it is; None
    where one cannot hold it as it is (a control character, a first line that starts with a blank)."""
    if not isinstance(value, str) or "\n" not in value or not value.strip("\n"):
        return None
    body = value.rstrip("\n")
    tail = len(value) - len(body)  # trailing newlines: chomping "-" (none) or "" (one); more stay quoted
    if tail > 1 or body.lstrip("\n")[0] in " \t" or not all(ch in "\n\t" or _printable(ord(ch)) for ch in set(body)):
        return None
    lines = [" " * indent + line if line else "" for line in body.split("\n")]
    return ("|-\n" if tail == 0 else "|\n") + "\n".join(lines)


def to_yaml(obj: Any, indent: int = 0) -> str:
    """Block-style YAML for dicts, lists and scalars; multi-line strings as literal blocks, other strings
    that need it double-quoted.

    Deterministic (insertion order), so rendered manifests can be golden files.
    """
    pad = " " * indent
    lines: list[str] = []
    if isinstance(obj, Mapping):
        for k, v in obj.items():
            key = _scalar(str(k))
            if isinstance(v, (Mapping, list)) and v:
                lines.append(f"{pad}{key}:")
                lines.append(to_yaml(v, indent + 2).rstrip("\n"))
            elif isinstance(v, (Mapping, list)):
                lines.append(f"{pad}{key}: {'{}' if isinstance(v, Mapping) else '[]'}")
            else:
                lines.append(f"{pad}{key}: {_literal(v, indent + 2) or _scalar(v)}")
    elif isinstance(obj, list):
        for item in obj:
            if isinstance(item, (Mapping, list)) and item:
                inner = to_yaml(item, indent + 2).rstrip("\n")
                lines.append(f"{pad}- {inner[indent + 2 :]}")
            elif isinstance(item, (Mapping, list)):
                lines.append(f"{pad}- {{}}")
            else:
                lines.append(f"{pad}- {_literal(item, indent + 2) or _scalar(item)}")
    else:
        lines.append(pad + _scalar(obj))
    return "\n".join(lines) + "\n"


# --- the API client (stdlib only) -------------------------------------------------------


class KubeAPI:
    """Just enough of the Kubernetes REST API: JSON requests with a bearer token.

    Configured from options (``api_server``, ``token_file``, ``ca_file``) or, in a
    pod, from the service account Kubernetes mounts (``KUBERNETES_SERVICE_HOST``).
    """

    def __init__(self, server: str, token: str | None = None, ca_file: str | None = None, timeout: float = 30) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.ca_file = ca_file

    def _context(self) -> ssl.SSLContext | None:
        if not self.server.startswith("https"):
            return None
        try:
            return ssl.create_default_context(cafile=self.ca_file)
        except OSError as e:
            raise SchedulerError(
                f"cannot load the CA bundle {self.ca_file!r}: {e.strerror}", "pass --opt ca_file=PATH"
            ) from None

    @classmethod
    def from_options(cls, opts: Mapping[str, str], environ: Mapping[str, str] | None = None) -> KubeAPI:
        env = os.environ if environ is None else environ
        server = opts.get("api_server") or ""
        token_file, ca_file = opts.get("token_file"), opts.get("ca_file")
        if not server and env.get("KUBERNETES_SERVICE_HOST"):
            host, port = env["KUBERNETES_SERVICE_HOST"], env.get("KUBERNETES_SERVICE_PORT", "443")
            server = f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"
            token_file = token_file or f"{_SA_DIR}/token"
            ca_file = ca_file or f"{_SA_DIR}/ca.crt"
        if not server:
            raise SchedulerError(
                "no kubectl and no Kubernetes API server to talk to",
                "install kubectl, or pass --opt api_server=https://HOST:6443 --opt token_file=PATH",
            )
        token = None
        if token_file:
            try:
                with open(token_file) as f:
                    token = f.read().strip()
            except OSError as e:
                raise SchedulerError(f"cannot read token_file {token_file!r}: {e.strerror}") from None
        return cls(server, token, ca_file)

    def request(self, method: str, path: str, body: Any = None) -> tuple[int, str]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json, */*")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout, context=self._context()) as resp:
                return resp.status, resp.read().decode(errors="replace")
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            try:
                message = json.loads(text).get("message", text)
            except ValueError:
                message = text
            raise SchedulerError(
                f"{method} {path} -> HTTP {e.code}: {message.strip()[:300]}",
                "401/403: check the token and its RBAC; 404: check the namespace and that the CRD is installed "
                "(`kubectl get crd trainjobs.trainer.kubeflow.org`; with --opt api=pytorchjob, pytorchjobs.kubeflow.org)",
            ) from None
        except urllib.error.URLError as e:
            raise SchedulerError(f"cannot reach the Kubernetes API at {self.server}: {e.reason}") from None
