#!/usr/bin/env python3
"""`mlxbun models list` over 200 fake HF-cache snapshots, and shell completion speed.

    .venv/bin/python benchmarks/bench_cli.py [--json]

Targets (reported as PASS/FAIL, never asserted):
  * `mlxbun models list` over a cache of 200 fake model snapshots <= 0.5 s wall;
  * completion of a model argument (`mlxbun generate <TAB>`) <= 0.25 s wall.
The `python -c pass` floor is printed beside them. The fake cache reuses the
real layout builder of the test suite (tests/test_models_cmd.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LIST_TARGET_S = 0.5
COMPLETION_TARGET_S = 0.25


def build_cache(root: Path) -> None:
    sys.path.insert(0, str(REPO / "tests"))
    from test_models_cmd import DENSE, QUANT, QUANT_CONFIG, config, hf_repo, model_files

    for i in range(200):
        quantized = i % 2 == 1
        files = model_files(
            config(quantization=QUANT_CONFIG) if quantized else config(),
            QUANT if quantized else DENSE,
        )
        hf_repo(root, f"org{i % 7}/model-{i:03d}", files)


def timed(cmd: list[str], env: dict[str, str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, env=env, capture_output=True, check=False)
        out.append(time.perf_counter() - start)
    return out


def main(argv: list[str] | None = None) -> int:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--json", action="store_true")
    args.add_argument("--runs", type=int, default=7)
    opts = args.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mlxbun-bench-cli-"))
    env = {
        **os.environ,
        "MLXBUN_HOME": str(root / "home"),
        "HF_HUB_CACHE": str(root / "hf"),
        "HF_HUB_OFFLINE": "1",
        "NO_COLOR": "1",
    }
    os.environ.update({k: env[k] for k in ("MLXBUN_HOME", "HF_HUB_CACHE")})
    build_cache(root / "hf")
    mlxbun = str(Path(sys.executable).parent / "mlxbun")
    floor = timed([sys.executable, "-c", "pass"], env, opts.runs)
    subprocess.run(
        [mlxbun, "models", "list"], env=env, capture_output=True, check=False
    )  # builds the index
    listing = timed([mlxbun, "models", "list"], env, opts.runs)
    rows = subprocess.run(
        [mlxbun, "models", "list", "--json"], env=env, capture_output=True, text=True
    ).stdout
    count = len(json.loads(rows)["models"]) if rows.strip().startswith("{") else None
    complete_env = {
        **env,
        "_MLXBUN_COMPLETE": "complete_bash",
        "COMP_WORDS": "mlxbun\ngenerate\n",
        "COMP_CWORD": "2",
    }
    completion = timed([mlxbun], complete_env, opts.runs)
    report = {
        "python_floor_s": statistics.median(floor),
        "models_list": {
            "median_s": statistics.median(listing),
            "min_s": min(listing),
            "models": count,
            "target_s": LIST_TARGET_S,
            "pass": statistics.median(listing) <= LIST_TARGET_S,
        },
        "model_completion": {
            "median_s": statistics.median(completion),
            "min_s": min(completion),
            "target_s": COMPLETION_TARGET_S,
            "pass": statistics.median(completion) <= COMPLETION_TARGET_S,
        },
        "load_average": os.getloadavg()[0],
    }
    if opts.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"python -c pass floor: {report['python_floor_s']:.3f} s   (load average {report['load_average']:.2f})"
    )
    for name in ("models_list", "model_completion"):
        r = report[name]
        verdict = "PASS" if r["pass"] else "FAIL"
        print(
            f"{name:17s} median {r['median_s']:.3f} s  min {r['min_s']:.3f} s  target {r['target_s']} s  {verdict}"
        )
    print(f"models listed: {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
