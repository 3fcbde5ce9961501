"""What each function-local import of podium saves: the seconds it costs a process that has loaded the
importing module already, and what it loads that the module had not (the reasons in tests/unit/test_layers.py,
section 4, rest on these numbers).

    python benchmarks/import_costs.py [--min-s 0.1]

One interpreter per importing module imports it, then imports each of its function-local targets in a
forked child of its own (the cost of that import alone, on top of the module). Printed: module, target,
seconds, the heavy libraries it newly loads. Nothing is pinned: run it on a quiet machine, and compare
figures of one run only.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "unit"))

HEAVY = ["prefect", "mlflow", "torch", "ray", "matplotlib", "botocore", "s3fs", "aiohttp", "pandas", "lightning",
         "transformers", "numpy", "pyarrow", "fsspec", "pydantic_settings", "sympy", "httpx", "requests"]

CHILD = r"""
import importlib, json, os, sys, time
module, targets = sys.argv[1], json.loads(sys.argv[2])
importlib.import_module(module)
before = {m.split(".")[0] for m in sys.modules}
result = {}
for target in targets:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        began = time.perf_counter()
        importlib.import_module(target)
        out = {"s": time.perf_counter() - began, "new": sorted({m.split(".")[0] for m in sys.modules} - before)}
        os.write(write, json.dumps(out).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        result[target] = json.loads(f.read() or "{}")
    os.waitpid(pid, 0)
print(json.dumps(result))
"""


def main() -> None:
    from test_layers import found  # the same listing the test checks

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--min-s", type=float, default=0.0, help="print only imports that cost at least this")
    args = parser.parse_args()
    for module, imports in sorted(found().items()):
        done = subprocess.run([sys.executable, "-c", CHILD, module, json.dumps(sorted(imports))],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            print(f"{module:36} could not be measured: {done.stderr.strip().splitlines()[-1:]}")
            continue
        for target, cost in sorted(json.loads(done.stdout.strip().splitlines()[-1]).items()):
            if cost.get("s", 0.0) >= args.min_s:
                heavy = ", ".join(h for h in HEAVY if h in cost.get("new", []))
                print(f"{module:36} {target:32} {cost.get('s', float('nan')):6.3f} s  {heavy}")


if __name__ == "__main__":
    main()
