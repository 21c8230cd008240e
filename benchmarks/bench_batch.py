#!/usr/bin/env python3
"""Batch generation: `mlxbun generate --batch` vs mlx-lm, 64 requests on the tiny model.

    .venv/bin/python benchmarks/bench_batch.py [--requests 64] [--tokens 64] [--rounds 3] [--env bytecode_cached|as_is] [--json]

Three whole processes, each loading the model once and producing the same
number of tokens per request (EOS is forbidden for all three, so every request
runs to max_tokens):
  A. `mlxbun generate MODEL --batch IN.jsonl -o OUT.jsonl` (continuous batching);
  B. the same requests one after another with `mlx_lm.generate`;
  C. mlx-lm's own `batch_generate` on the same prompts.
Targets (ratios, never asserted): A >= 2.5 x B, and A >= C (requests per second).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

TARGET_VS_SEQUENTIAL = 2.5

MLX_LM_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from mlx_lm import load, generate
    from mlx_lm.generate import batch_generate
    from mlx_lm.sample_utils import make_logits_processors
    mode, model_dir, prompts_file, tokens = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    model, tok = load(model_dir)
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
               enable_thinking=False) for p in json.load(open(prompts_file))]
    bias = {t: -100.0 for t in tok.eos_token_ids}
    procs = make_logits_processors(logit_bias=bias)
    total = 0
    import time
    start = time.perf_counter()
    if mode == "sequential":
        for p in prompts:
            out = generate(model, tok, p, max_tokens=tokens, logits_processors=procs)
            total += len(tok.encode(out, add_special_tokens=False))
    else:
        r = batch_generate(model, tok, prompts, max_tokens=tokens, logits_processors=procs,
                           return_token_ids=True)
        total = sum(len(t) for t in r.token_ids)
    print(json.dumps({"tokens": total, "generation_s": time.perf_counter() - start}))
    """
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side, alternating")
    parser.add_argument(
        "--env",
        choices=("bytecode_cached", "as_is"),
        default="bytecode_cached",
        help="bytecode_cached (default): both sides use a warmed PYTHONPYCACHEPREFIX, as an "
        "installed user has; as_is: your environment (PYTHONDONTWRITEBYTECODE=1 recompiles "
        "mlxbun, an editable install, on every start but not mlx_lm)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temp dir")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="mlxbun's requests in flight (default: its own)",
    )
    opts = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mlxbun-bench-batch-"))
    try:
        return _bench(opts, root)
    finally:
        if not opts.keep:
            shutil.rmtree(root, ignore_errors=True)


def _bench(opts: argparse.Namespace, root: Path) -> int:
    env = {**os.environ, "MLXBUN_HOME": str(root / "home"), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    if opts.env == "bytecode_cached":
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from mlxbun_cli.demo_model import build_demo_model

    model = build_demo_model(root / "tiny", size="tiny")
    eos = json.loads((model / "generation_config.json").read_text())["eos_token_id"]
    prompts = [
        f"Request number {i}: tell me something about topic {i % 9}." for i in range(opts.requests)
    ]
    (root / "prompts.json").write_text(json.dumps(prompts))
    with open(root / "in.jsonl", "w") as fh:
        for i, p in enumerate(prompts):
            body = {
                "messages": [{"role": "user", "content": p}],
                "max_tokens": opts.tokens,
                "temperature": 0,
                "logit_bias": {str(t): -100 for t in eos},
                "chat_template_kwargs": {"enable_thinking": False},
            }
            fh.write(
                json.dumps(
                    {
                        "custom_id": f"r{i}",
                        "method": "POST",
                        "url": "/v1/chat/completions",
                        "body": body,
                    }
                )
                + "\n"
            )
    (root / "mlx_lm_side.py").write_text(MLX_LM_SCRIPT)
    mlxbun = str(Path(sys.executable).parent / "mlxbun")

    def run(cmd: list[str]) -> tuple[float, str]:
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"{cmd[:3]} failed:\n{proc.stderr[-2000:]}")
        return time.perf_counter() - start, proc.stdout

    out = root / "out.jsonl"
    batch_cmd = [
        mlxbun,
        "-q",
        "generate",
        str(model),
        "--batch",
        str(root / "in.jsonl"),
        "-o",
        str(out),
        *(["--concurrency", str(opts.concurrency)] if opts.concurrency else []),
    ]
    startup_cmd = [mlxbun, "-q", "generate", str(model), "hi", "-n", "1", "--local"]

    def mlx_lm_cmd(mode: str) -> list[str]:
        return [
            sys.executable,
            str(root / "mlx_lm_side.py"),
            mode,
            str(model),
            str(root / "prompts.json"),
            str(opts.tokens),
        ]

    def mlxbun_batch() -> dict:
        out.unlink(missing_ok=True)  # a fresh batch each round, not a resume
        wall, _ = run(batch_cmd)
        tokens = sum(
            json.loads(line)["response"]["body"]["usage"]["completion_tokens"]
            for line in out.read_text().splitlines()
        )
        return {"wall_s": wall, "tokens": tokens}

    def mlx_lm_side(mode: str) -> dict:
        wall, stdout = run(mlx_lm_cmd(mode))
        side = json.loads(stdout.strip().splitlines()[-1])
        return {"wall_s": wall, "tokens": side["tokens"], "generation_s": side["generation_s"]}

    # Warm-up: builds the bytecode caches and the mlx kernel cache for every side.
    run(startup_cmd)
    mlxbun_batch()
    mlx_lm_side("batch")
    sides = {
        "mlxbun_batch": mlxbun_batch,
        "mlx_lm_sequential": lambda: mlx_lm_side("sequential"),
        "mlx_lm_batch_generate": lambda: mlx_lm_side("batch"),
    }
    runs: dict[str, list[dict]] = {name: [] for name in sides}
    startups: list[float] = []
    for _ in range(opts.rounds):
        startups.append(run(startup_cmd)[0])  # mlxbun's start-up + load + one token
        for name, side in sides.items():
            runs[name].append(side())
    startup = statistics.median(startups)
    results = {}
    for name, rs in runs.items():
        wall = statistics.median([r["wall_s"] for r in rs])
        gen = (
            max(1e-3, wall - startup)
            if name == "mlxbun_batch"
            else statistics.median([r["generation_s"] for r in rs])
        )
        results[name] = {
            "wall_s": wall,
            "walls_s": [round(r["wall_s"], 3) for r in rs],
            "tokens": rs[0]["tokens"],
            "generation_s": gen,
        }
    for r in results.values():
        r["requests_per_s"] = opts.requests / r["wall_s"]
        r["tokens_per_s"] = r["tokens"] / r["wall_s"]
        r["generation_tokens_per_s"] = r["tokens"] / r["generation_s"]
    gen = {k: r["generation_tokens_per_s"] for k, r in results.items()}
    a = results["mlxbun_batch"]["requests_per_s"]
    vs_seq = a / results["mlx_lm_sequential"]["requests_per_s"]
    vs_batch = a / results["mlx_lm_batch_generate"]["requests_per_s"]
    gen_vs_seq = gen["mlxbun_batch"] / gen["mlx_lm_sequential"]
    gen_vs_batch = gen["mlxbun_batch"] / gen["mlx_lm_batch_generate"]
    report = {
        "requests": opts.requests,
        "max_tokens": opts.tokens,
        "results": results,
        "ratio_vs_sequential": vs_seq,
        "pass_vs_sequential": vs_seq >= TARGET_VS_SEQUENTIAL,
        "ratio_vs_batch_generate": vs_batch,
        "pass_vs_batch_generate": vs_batch >= 1.0,
        "generation_only": {
            "ratio_vs_sequential": gen_vs_seq,
            "ratio_vs_batch_generate": gen_vs_batch,
            "mlxbun_startup_s": startup,
            "pass_vs_sequential": gen_vs_seq >= TARGET_VS_SEQUENTIAL,
            "pass_vs_batch_generate": gen_vs_batch >= 1.0,
        },
        "load_average": os.getloadavg()[0],
        "rounds": opts.rounds,
        "env": opts.env,
        "note": "whole processes: each side's wall time includes start-up and one model load; "
        "medians of the rounds",
    }
    if opts.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{opts.requests} requests x {opts.tokens} tokens, tiny model, {opts.env}, median of "
        f"{opts.rounds} rounds (load average {report['load_average']:.2f})"
    )
    for name, r in results.items():
        print(
            f"  {name:22s} {r['wall_s']:7.2f} s  {r['requests_per_s']:7.1f} req/s  {r['tokens_per_s']:8.0f} tok/s"
            f"  ({r['tokens']} tokens; runs {', '.join(f'{w:.2f}' for w in r['walls_s'])} s)"
        )
    print(
        f"mlxbun --batch vs sequential mlx_lm.generate: {vs_seq:.2f}x (target >= {TARGET_VS_SEQUENTIAL}) "
        f"{'PASS' if report['pass_vs_sequential'] else 'FAIL'}"
    )
    print(
        f"mlxbun --batch vs mlx_lm batch_generate:      {vs_batch:.2f}x (target >= 1.0) "
        f"{'PASS' if report['pass_vs_batch_generate'] else 'FAIL'}"
    )
    g = report["generation_only"]
    print(
        f"generation only (mlxbun start-up + load {startup:.2f} s subtracted; mlx_lm timed inside):"
    )
    print(
        f"  vs sequential mlx_lm.generate: {g['ratio_vs_sequential']:.2f}x "
        f"{'PASS' if g['pass_vs_sequential'] else 'FAIL'};  vs batch_generate: "
        f"{g['ratio_vs_batch_generate']:.2f}x {'PASS' if g['pass_vs_batch_generate'] else 'FAIL'}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
