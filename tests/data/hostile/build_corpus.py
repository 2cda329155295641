"""Writes corpus.json: the hostile strings of issue 20 (run: python tests/data/hostile/build_corpus.py).

Kept as data so every test and benchmarks/hostile_audit.py read the same values;
JSON keeps control characters, NUL and lone surrogates (undecodable bytes) exact.
"""

from __future__ import annotations

import json
from pathlib import Path

CANARY = "touch CANARY"

BASE = [
    # trailing and embedded line breaks (F1, F2)
    "x\n", "x\r", "x\r\n", "\n", "\r", "x\n\n", "\nx", "a\nb", "a\rb",
    "x\n#PBS -q evilpart", "x\n#SBATCH --partition=evil", "x\n#PBS -v LD_PRELOAD=/tmp/evil.so",
    "\n#SBATCH -o /tmp/pwn.out", "x\r#PBS -q evil", "x\r\n#PBS -q evil", "#PBS -q evil", "#SBATCH -p evil",
    "x\n#PBS -q evilpart\n#PBS -o /tmp/pwned.out\n", "x\n#SLURM -p evil", "x\n  #PBS -q evil",
    # the CI matrix's CORE strings (tests/hostile.py): every hazard at once, and an option
    "a'b %x ../$(touch CANARY)\n#PBS -q evilpart\n#SBATCH -p evil\ntouch CANARY\n",
    # command injection
    f"$({CANARY})", f"`{CANARY}`", f"x; {CANARY}", f"x && {CANARY}", f"x | {CANARY}", f"x\n{CANARY}",
    f"x\n{CANARY} #", f"'; {CANARY}; '", f'"; {CANARY}; "', f"$'\\n'{CANARY}", "${IFS}touch${IFS}CANARY",
    f"x\\\n{CANARY}", ">CANARY", "<CANARY", "x >CANARY", "x 2>CANARY", f"$(\n{CANARY}\n)", f"\n{CANARY}\n",
    f"x\r{CANARY}", f"x\n{CANARY} x\n", f'"$({CANARY})"', f"'$({CANARY})'", f"\\$({CANARY})",
    f"${{x:-$({CANARY})}}", f"$(({CANARY}))", f"<({CANARY})", f">({CANARY})", f"x & {CANARY} &",
    f"x || {CANARY}", f"{{ {CANARY}; }}", f"( {CANARY} )", f"x\n#\n{CANARY}", f"x\t{CANARY}",
    f"\\\n{CANARY}", f"x'\n{CANARY}\n'", f'x"\n{CANARY}\n"',
    # expansions and globs that must stay literal
    "$HOME", "${HOME}", "$((1+1))", "$1", "$@", "$*", "$$", "$?", "$!", "$-", "$_", "~", "~root", "~/x",
    "*", "?", "[a]", "{a,b}", "!!", "!$", "^x^y", "#", "# comment", "a # b", "a#b", "$'x'", '$"x"',
    # options and assignments
    "-", "--", "-x", "--privileged", "--output=/tmp/x", "-e", "-c touch CANARY", "--help", "-m", "-v/:/host",
    "--env=LD_PRELOAD=/tmp/x.so", "-oProxyCommand=touch CANARY", "=", "a=b", "A=1", "--=", "x=y=z",
    "LD_PRELOAD=/tmp/x.so", "-1", "0", "1e9", "NaN", "-0",
    # quotes and backslashes
    "'", '"', "O'Brien", "a'b\"c", "\\", "\\'", "a\\", "\\\\", "\\n", "\\x41", "''", '""', "'\"'\"'",
    "it's", 'say "hi"', "a\\ b", "\\\"", "\\#", "a\\#b",
    # separators that other syntaxes treat specially
    ",", ":", "a,b", "a:b", "a:b:c:d", "@", "+", ";", "&", "|", "&&", "()", "{}", "!", "^", "%", "%j",
    "%x-%j", "%%", "%s%n", "100%", "%A_%a", "%u", "a%b", "x/../y", "../", "../../etc/passwd", "a/../b",
    "/", "./x", "x/", "..", ".", "//", "/tmp", "/tmp/../etc", "x/./y",
    # YAML/JSON words and shapes
    "null", "true", "false", "yes", "no", "on", "off", "y", "n", "~", "- x", ": x", "x: y", "[x]", "{x: y}",
    "&anchor", "*alias", "!tag", "|", ">", "%YAML", "---", "...", "? x", "@x", "`x`",
    # whitespace
    " ", "  ", " x", "x ", "a b", "\t", "a\tb", "\x0b", "\x0c", "a\x0bb", "\xa0", "\u3000",
    # control characters, NUL, escapes
    "\x00", "a\x00b", "\x01", "\x1b[31mred\x1b[0m", "\x7f", "\x08", "\x07", "a\x1fb", "\x1c\x1d\x1e",
    # unicode: non-BMP, separators, BOM, bidi
    "é", "日本語", "😀", "a😀b", "𝔘𝔫𝔦", "\u2028", "\u2029", "\u0085", "\ufeff", "\u202e", "\u200b",
    "\ufffd", "\U0010ffff", "Ω≈ç√",
    # undecodable bytes (surrogateescape) and lone surrogates
    "\udcff", "\udc80abc", "caf\udce9", "x\udcc3\udca9", "\ud800", "\udfff", "a\ud83d",
    # sizes
    "", "x" * 200, "x" * 201, "y" * 5000, "A" * 100_000, ("a b\n" * 1000),
    # names a script uses itself
    "_torchhpc_x", "_TORCHHPC_Y", "_i", "_r", "_n", "_g", "_try", "_hosts", "MASTER_ADDR", "PATH", "IFS",
    "BASH_ENV", "SLURM_JOB_ID", "TORCHHPC_TASK_SHIM", "1X", "A-B", "a b", "A.B",
    # DNS names, URLs, Kubernetes paths
    "x/../../../api/v1/namespaces/kube-system/secrets?", "default", "Default", "a" * 63, "a" * 64, "-x-",
    "xn--", "x..y", "http://x/", "a?b", "a#frag", "%2e%2e", "a%0ab",
    # images and references
    "docker://x", "img:1", "nvcr.io/nvidia/pytorch:24.03-py3", "$SIF", "${SIF}", "\"$SIF\"", "x.sif",
    "x#y", "x@sha256:" + "0" * 64, "localhost:5000/x", "dockerd://x", "/img.sqsh",
    # numbers and times
    "00:00:00", "1-00:00:00", "99999999999", "1:2:3:4", "-5", "+5", "0x10", "1_000", "١٢", "∞",
    "1G", "0G", "-1G", "1.5G", "1X",
]


def main() -> None:
    seen: list[str] = []
    for v in BASE:
        if v not in seen:
            seen.append(v)
    here = Path(__file__).parent
    (here / "corpus.json").write_text(json.dumps(seen, ensure_ascii=True, indent=0) + "\n", encoding="utf-8")
    print(f"{len(seen)} strings")


if __name__ == "__main__":
    main()
