"""A rank's progress read from its own output, with no change to its code.

``torchhpc top`` reads the tail of each rank's log and keeps the newest of each of these:

* **tqdm bars** (also Lightning's ``TQDMProgressBar`` and the Hugging Face Trainer's bar): tqdm
  rewrites its line with ``\\r``, so a log file holds many bars on one line; the last one counts.
  ``Epoch 0:  45%|####5     | 45/100 [00:04<00:05, 10.12it/s, v_num=0, loss=0.123]`` gives
  n/total, the rate and its unit, and the postfix's numbers as metrics (Lightning puts the loss
  there); a bar without a total (``45it [00:04, 10.12it/s]``) gives n and the rate.
* **Hugging Face Trainer log lines**: its ``{'loss': ..., 'epoch': ...}`` dicts (the values are
  numbers or, in transformers 5, strings of numbers).
* **the opt-in step marker** of :func:`torchhpc.dist.mark_step`: ``torchhpc-step: {json}``.

Nothing here imports torch or talks to a scheduler: it is text in, a small dict out.
"""

from __future__ import annotations

import ast
import json
import os
import re
from typing import Any, Optional

__all__ = ["STEP_MARK", "parse_progress", "progress_lines", "read_tail"]

STEP_MARK = "torchhpc-step: "  # the line prefix torchhpc.dist.mark_step writes
TAIL_BYTES = 64 * 1024  # enough for hundreds of bar redraws; a rank log can be gigabytes
_NUM = r"\d+(?:\.\d+)?[kMGT]?"
_BAR = re.compile(
    r"(?:(?P<desc>[^|\r\n]*?):\s*)?(?P<pct>\d+)%\|[^|\r\n]*\|\s*(?P<n>" + _NUM + r")/(?P<total>" + _NUM + r")"
    r"\s*\[(?P<times>[^,\]]*)(?:,\s*(?P<rate>[\d.]+|\?)\s*(?P<unit>[A-Za-z]*/s|s/[A-Za-z]*))?(?P<post>,[^\]]*)?\]"
)
_NO_TOTAL = re.compile(
    r"(?:(?P<desc>[^|\r\n]*?):\s*)?(?P<n>" + _NUM + r")(?P<unit0>[A-Za-z]+) \[(?P<times>[\d:]+)"
    r"(?:,\s*(?P<rate>[\d.]+|\?)\s*(?P<unit>[A-Za-z]*/s|s/[A-Za-z]*))?(?P<post>,[^\]]*)?\]"
)
# Lightning's RichProgressBar (its default where rich is installed): "Epoch 1/1  ━━━╸ 32/32 0:00:00 • 0:00:00
# 568.82it/s v_num: 0.000 loss: 2.916" (off a terminal rich prints it when the epoch ends; metrics may wrap)
_RICH = re.compile(
    r"Epoch (?P<epoch>\d+)(?:/\d+)?\s+[━╸╺╾╼─ ]*\s*(?P<n>\d+)/(?P<total>\d+) [\d:]+ • [\d:-]+\s*"
    r"(?:(?P<rate>[\d.]+)(?P<unit>[A-Za-z]+/s))?(?P<post>.*)$"
)
_RICH_ITEM = re.compile(r"([A-Za-z_][\w/.-]*): ([-+]?\d[\d.eE+-]*)")
_TRAINER = re.compile(r"\{'(?:loss|eval_loss|train_loss|train_runtime)': [^{}]*\}")
_POSTFIX_ITEM = re.compile(r"([A-Za-z_][\w/.-]*)=([-+]?\d[\d.eE+-]*)")
_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def _num(text: str) -> float:
    if text and text[-1] in _SCALE:
        return float(text[:-1]) * _SCALE[text[-1]]
    return float(text)


def _metric(value: Any) -> Optional[float]:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _bar(m: re.Match[str], kind: str) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": kind, "n": _num(m.group("n"))}
    if "total" in m.re.groupindex and m.group("total"):
        out["total"] = _num(m.group("total"))
        out["pct"] = round(100.0 * out["n"] / out["total"], 1) if out["total"] else None
    if m.group("rate") and m.group("rate") != "?":
        rate, unit = float(m.group("rate")), m.group("unit")
        if unit.startswith("s/"):  # tqdm prints slow rates inverted: 2.10s/it
            rate, unit = (1.0 / rate if rate else 0.0), unit[2:] + "/s"
        out["rate"], out["unit"] = round(rate, 4), unit
    desc = (m.group("desc") or "").strip()
    if desc:
        out["desc"] = desc[-40:]
        ep = re.match(r"Epoch (\d+)", desc)
        if ep:
            out.setdefault("metrics", {})["epoch"] = float(ep.group(1))
    for key, value in _POSTFIX_ITEM.findall(m.group("post") or ""):
        v = _metric(value)
        if v is not None:
            out.setdefault("metrics", {})[key] = v
    if out.get("metrics") and "v_num" in (m.group("post") or ""):
        out["kind"] = "lightning"  # Lightning's bar carries its logger version in the postfix
    return out


def _trainer(text: str) -> Optional[dict[str, float]]:
    try:
        d = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    if not isinstance(d, dict):
        return None
    metrics = {str(k): v for k, v in ((k, _metric(v)) for k, v in d.items()) if v is not None}
    return metrics or None


def parse_progress(text: str) -> Optional[dict[str, Any]]:
    """The newest progress in a rank's output: ``{"kind", "n", "total", "pct", "rate", "unit", "metrics"}``
    (the keys found), or None when the output shows none.

    The newest bar gives n/total and rate; the newest metrics (a Trainer log line, a step marker,
    or the bar's own postfix) are merged in, so a Trainer run shows its bar and its loss together.
    """
    bar: Optional[dict[str, Any]] = None
    metrics: dict[str, float] = {}
    step: Optional[dict[str, Any]] = None
    trainer = rich_tail = False
    for piece in re.split(r"[\r\n]", text):
        if not piece.strip():
            continue
        at = piece.find(STEP_MARK)
        if at >= 0:
            try:
                d = json.loads(piece[at + len(STEP_MARK):])
            except ValueError:
                d = None
            if isinstance(d, dict) and isinstance(d.get("step"), (int, float)):
                step = d
                metrics.update({k: v for k, v in d.items() if k not in ("step", "total") and _metric(v) is not None})
            continue
        found = list(_BAR.finditer(piece))
        if found:
            bar = _bar(found[-1], "tqdm")
            metrics.update(bar.get("metrics", {}))
            continue
        found = list(_NO_TOTAL.finditer(piece))
        if found and found[-1].group("rate"):
            bar = _bar(found[-1], "tqdm")
            continue
        m = _RICH.search(piece)
        if m:
            bar = {"kind": "lightning", "n": float(m.group("n")), "total": float(m.group("total"))}
            bar["pct"] = round(100.0 * bar["n"] / bar["total"], 1) if bar["total"] else None
            if m.group("rate"):
                bar["rate"], bar["unit"] = float(m.group("rate")), m.group("unit")
            metrics["epoch"] = float(m.group("epoch"))
            rich_tail = True
            metrics.update({k: float(v) for k, v in _RICH_ITEM.findall(m.group("post")) if _metric(v) is not None})
            continue
        if rich_tail and _RICH_ITEM.fullmatch(piece.strip()):  # a metric rich wrapped onto the next line
            k, v = _RICH_ITEM.fullmatch(piece.strip()).groups()  # type: ignore[union-attr]
            metrics[k] = float(v)
            continue
        rich_tail = False
        for m in _TRAINER.finditer(piece):
            got = _trainer(m.group(0))
            if got:
                metrics.update(got)
                trainer = True
    if step is not None:  # the user's own marker is the most precise: it wins over any bar
        out: dict[str, Any] = {"kind": "step", "n": step["step"]}
        if isinstance(step.get("total"), (int, float)) and step["total"]:
            out["total"] = step["total"]
            out["pct"] = round(100.0 * step["step"] / step["total"], 1)
        if bar and "rate" in bar:
            out["rate"], out["unit"] = bar["rate"], bar["unit"]
        bar = out
    if bar is None and not metrics:
        return None
    out = dict(bar or {"kind": "trainer"})
    if trainer and out["kind"] == "tqdm":
        out["kind"] = "trainer"  # the Trainer's own bar, with its log lines' metrics
    if metrics:
        out["metrics"] = metrics
    return out


def read_tail(path: str, size: int = TAIL_BYTES) -> str:
    """The last ``size`` bytes of a file as text ("" when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            f.seek(max(0, end - size))
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def progress_lines(ranks_dir: str, now: float, quiet_after: float = 60.0) -> list[str]:
    """Per node, the seconds since each rank last wrote a line (its log file's last write).

    What a user reads before any hang timeout fires: the rank that went quiet first stands out.
    """
    from torchhpc.jobdir.logs import last_writes

    by_node: dict[str, list[str]] = {}
    for rank, (when, node) in sorted(last_writes(ranks_dir).items()):
        age = max(0.0, now - when)
        mark = " (quiet)" if age >= quiet_after else ""
        by_node.setdefault(node or "?", []).append(f"rank {rank} {age:.0f}s{mark}")
    return [f"  {node}: last output " + ", ".join(items) for node, items in sorted(by_node.items())]
