"""Run every ``bench/bench_*.py`` in turn (``make bench``), each in its own process.

Benchmarks are not part of the test run: they print medians and ratios against a
baseline measured in the same run, and machines here are shared and noisy. Extra
arguments are passed to every benchmark (``make bench ARGS=--quick``); ``--only NAME``
runs the benchmarks whose file name contains NAME.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    only = None
    if "--only" in argv:
        i = argv.index("--only")
        only = argv[i + 1] if i + 1 < len(argv) else ""
        argv = argv[:i] + argv[i + 2:]
    failed = []
    for bench in sorted(HERE.glob("bench_*.py")):
        if only and only not in bench.name:
            continue
        print(f"\n=== {bench.name} ===", flush=True)
        started = time.monotonic()
        proc = subprocess.run([sys.executable, str(bench), *argv], cwd=HERE.parent)
        print(f"--- {bench.name}: exit {proc.returncode} after "
              f"{time.monotonic() - started:.0f} s", flush=True)
        if proc.returncode:
            failed.append(bench.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
