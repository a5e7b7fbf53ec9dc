"""How fast does the CLI start? `xtrain --help` must not pay for torch.

Measures the wall time of `xtrain --help` (median of N runs, each a fresh process) next to a
bare interpreter and a bare `import torch`, and checks with `python -X importtime` that
importing `xtrain.cli` loads none of torch, transformers, peft, datasets or accelerate.

    python benchmarks/cli_startup.py [--runs 15]

Exit code 1 if a heavy library is imported (the timing itself is reported, not judged).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

HEAVY = ("torch", "transformers", "peft", "datasets", "accelerate")


def wall_times(cmd: list[str], runs: int) -> list[float]:
    subprocess.run(cmd, capture_output=True, check=True)  # warm the file cache once
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        times.append(time.perf_counter() - t0)
    return times


def heavy_imports() -> tuple[list[str], int]:
    """(heavy top-level packages imported by `import xtrain.cli`, modules imported in all)."""
    r = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", "import xtrain.cli"],
        capture_output=True,
        text=True,
        check=True,
    )
    names = [line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time:")]
    names = [n for n in names if n and n != "package"]
    heavy = sorted({n.split(".")[0] for n in names if n.split(".")[0] in HEAVY})
    return heavy, len(names)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    exe = shutil.which("xtrain", path=os.path.dirname(sys.executable)) or shutil.which("xtrain")
    xtrain_help = [exe, "--help"] if exe else [sys.executable, "-m", "xtrain", "--help"]
    cases = [
        ("python -c pass", [sys.executable, "-c", "pass"]),
        ("xtrain --help", xtrain_help),
        ("python -m xtrain --help", [sys.executable, "-m", "xtrain", "--help"]),
        ("python -c 'import torch'", [sys.executable, "-c", "import torch"]),
    ]
    print(
        f"CLI startup on {platform.system()} {platform.machine()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; {args.runs} runs each (wall time of a fresh process)"
    )
    print(f"{'command':<28} {'median':>9} {'min':>9} {'max':>9}")
    for name, cmd in cases:
        t = wall_times(cmd, args.runs)
        print(
            f"{name:<28} {statistics.median(t) * 1e3:>7.0f}ms {min(t) * 1e3:>7.0f}ms {max(t) * 1e3:>7.0f}ms"
        )

    heavy, count = heavy_imports()
    verdict = "none (ok)" if not heavy else ", ".join(heavy) + "  <-- should be lazy"
    print(f"`import xtrain.cli` loads {count} modules; heavy libraries among them: {verdict}")
    return 1 if heavy else 0


if __name__ == "__main__":
    sys.exit(main())
