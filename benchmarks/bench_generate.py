#!/usr/bin/env python3
"""mlxbun vs mlx-lm decode speed, and `mlxbun --help` start-up time, in one run.

Run it with the project's venv:

    .venv/bin/python benchmarks/bench_generate.py            # full run (~3-5 min, 2 cores)
    .venv/bin/python benchmarks/bench_generate.py --quick    # tiny model only (< 1 min)
    .venv/bin/python benchmarks/bench_generate.py --json     # one JSON object on stdout

Targets (reported as ratios and PASS/FAIL, never asserted):

1. decode tok/s of `mlxbun generate` >= 0.98 x `mlx_lm generate`, greedy, same
   model and prompt, for random-weight demo models ("tiny", "30m") built with
   `mlxbun_cli.demo_model.build_demo_model`. Two ways:
   * cli:        fresh processes, as a user runs them, alternating, several pairs;
   * in-process: the engine APIs (`LocalBackend.stream` vs `mlx_lm.stream_generate`)
                 in one worker process per model, warmed up, alternating.
2. `mlxbun --help` wall time <= 0.25 s (median of fresh processes), with the
   `python -c pass` floor, `-X importtime` offenders, and a check that no heavy
   module (mlx, mlx_lm, transformers, fastapi, uvicorn) is imported.

Fairness notes (see benchmarks/README.md for more):

* Both engines decode the same prompt tokens; a prompt is picked on which both
  decode the full N tokens greedily without EOS, and the token counts of every
  run are reported and checked.
* mlx-lm reports N / t and mlxbun (N - 1) / t over the same window (first token
  to last token, which holds N - 1 decode steps). mlx-lm's figure is rescaled
  by (N - 1) / N so both use the same formula; the raw figure is kept in JSON.
* Runs alternate (A B, B A, ...) and the ratio is the median of per-pair ratios,
  with a bootstrap 90% interval: small VMs are noisy, and a verdict whose
  interval straddles the target is marked "noisy".

Only the standard library is needed to orchestrate; `rich` (an mlxbun
dependency) is used for the tables when importable. The models, an isolated
MLXBUN_HOME and the bytecode cache of the "cached" start-up runs live in a temp
dir (models in --models-dir if given); nothing in the repository is touched
beyond the __pycache__ Python itself may write.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SIZES = ("tiny", "30m")
DEFAULT_TOKENS = {"tiny": 256, "30m": 96}
# (quick, default) pairs per model and mode; 30m runs ~30 ms/token on 2 cores
CLI_PAIRS = {"tiny": (3, 6), "30m": (2, 4)}
INPROC_PAIRS = {"tiny": (6, 12), "30m": (3, 4)}
DECODE_TARGET = 0.98
HELP_TARGET_S = 0.25
HEAVY_MODULES = ("mlx", "mlx_lm", "transformers", "fastapi", "uvicorn")
WATCH_MODULES = (
    "numpy",
    "torch",
    "huggingface_hub",
    "tokenizers",
    "safetensors",
    "jinja2",
    "httpx",
    "starlette",
    "pydantic",
    "prompt_toolkit",
    "markdown_it",
    "pygments",
)
# Tried in order; the first on which both engines decode N tokens without EOS
# is used. No backslashes: mlx_lm's CLI rewrites "\\n" in prompts.
CANDIDATE_PROMPTS = (
    "Tell me a story about the sea",
    "Write a haiku about the morning river",
    "Explain how to make a good cup of tea",
    "What is the capital of France?",
    "Hello there",
)
RESULT_MARK = "BENCH_RESULT "

# ---------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def printer(width: int) -> tuple[Any, Any]:
    """`table(title, columns, rows)` and `say(text)`: rich when installed, plain text else.

    Off a terminal (a pipe, a file) the output is `width` columns wide, so rows do not wrap.
    """
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        console = None
    else:
        console = Console(highlight=False, width=None if sys.stdout.isatty() else width)

    def table(title: str, columns: list[str], rows: list[list[str]]) -> None:
        if console is not None:
            t = Table(title=title, title_justify="left")
            for i, c in enumerate(columns):
                t.add_column(c, justify="left" if i < 2 else "right")
            for r in rows:
                t.add_row(*r)
            console.print(t)
        else:
            widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
            print(title)
            print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
            for r in rows:
                print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
            print()

    def say(text: str = "") -> None:
        if console is not None:
            console.print(text, markup=False)
        else:
            print(text)

    return table, say


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def quartiles(xs: list[float]) -> tuple[float, float] | None:
    xs = [x for x in xs if x is not None]
    if len(xs) < 2:
        return None
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


def bootstrap_median_ci(xs: list[float], level: float = 0.90, n: int = 2000):
    """Percentile bootstrap interval of the median (deterministic seed)."""
    xs = [x for x in xs if x is not None]
    if len(xs) < 3:
        return None
    rng = random.Random(12345)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    lo = meds[int((1 - level) / 2 * n)]
    hi = meds[min(n - 1, int((1 + level) / 2 * n))]
    return lo, hi


def rnd(x: Any, nd: int = 4) -> Any:
    return round(x, nd) if isinstance(x, float) else x


def venv_script(name: str) -> str:
    """A console script beside this interpreter (the venv's), else on PATH."""
    candidate = Path(sys.executable).parent / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if not found:
        raise SystemExit(f"cannot find the `{name}` console script next to {sys.executable}")
    return found


def bench_env(home: Path) -> dict[str, str]:
    """The environment every child runs in: the user's, minus mlxbun settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLXBUN_")}
    env.update(
        MLXBUN_HOME=str(home),  # no user config (default model, max tokens, ...) leaks in
        HF_HUB_OFFLINE="1",
        HF_HUB_CACHE=str(home / "hf-cache"),
        NO_COLOR="1",
        TERM="dumb",
    )
    return env


def run_proc(
    cmd: list[str], env: dict[str, str], timeout: float = 600
) -> tuple[int, str, str, float]:
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=REPO)
    return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0


def tail(text: str, n: int = 600) -> str:
    return text[-n:].strip()


def versions() -> dict[str, Any]:
    from importlib import metadata

    out: dict[str, Any] = {"python": platform.python_version()}
    for dist in ("mlxbun", "mlx", "mlx-lm", "typer", "rich", "transformers"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        out["git"] = head + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        out["git"] = None
    return out


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "env_PYTHONDONTWRITEBYTECODE": os.environ.get("PYTHONDONTWRITEBYTECODE"),
    }
    with contextlib.suppress(OSError):
        info["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
    return info


# ---------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------

BUILD_CODE = """
import json, sys
from pathlib import Path
from mlxbun_cli.demo_model import build_demo_model
dest, size = Path(sys.argv[1]), sys.argv[2]
cfg = dest / "config.json"
ok = False
if (dest / "model.safetensors").is_file() and cfg.is_file():
    c = json.loads(cfg.read_text())
    ok = c.get("mlxbun_demo_size") == size and c.get("mlxbun_demo_seed") == 0
if not ok:
    build_demo_model(dest, size)
print("built" if not ok else "cached")
"""


def ensure_models(models_dir: Path, sizes: list[str], env: dict[str, str]) -> dict[str, Path]:
    out = {}
    for size in sizes:
        dest = models_dir / f"demo-{size}"
        rc, so, se, wall = run_proc([sys.executable, "-c", BUILD_CODE, str(dest), size], env)
        if rc != 0:
            raise SystemExit(f"building the {size} demo model failed:\n{tail(se, 2000)}")
        log(f"model {size}: {so.strip()} at {dest} ({wall:.1f}s)")
        out[size] = dest
    return out


# ---------------------------------------------------------------------------
# decode: fresh CLI processes
# ---------------------------------------------------------------------------

_MLXLM_GEN = re.compile(r"^Generation:\s*(\d+) tokens,\s*([\d.]+) tokens-per-sec", re.M)
_MLXLM_PROMPT = re.compile(r"^Prompt:\s*(\d+) tokens,\s*([\d.]+) tokens-per-sec", re.M)


def cli_mlxbun(exe: str, model: Path, prompt: str, n: int, env: dict[str, str]) -> dict[str, Any]:
    cmd = [exe, "generate", str(model), prompt, "-n", str(n), "--temp", "0", "--json", "-q"]
    rc, so, se, wall = run_proc(cmd, env)
    if rc != 0:
        return {"error": f"exit {rc}: {tail(se)}", "wall_s": wall}
    try:
        data = json.loads(so)
        usage = data["usage"]
        return {
            "decode_tps": float(usage["generation_tps"]),
            "tokens": int(usage["completion_tokens"]),
            "prompt_tokens": int(usage["prompt_tokens"]),
            "finish": data.get("finish_reason"),
            "ttft_s": usage.get("time_to_first_token_s"),
            "wall_s": wall,
            "text": (data.get("reasoning") or "") + (data.get("text") or ""),
        }
    except (ValueError, KeyError, TypeError) as exc:
        return {"error": f"unparseable --json output ({exc}): {tail(so)}", "wall_s": wall}


def cli_mlx_lm(model: Path, prompt: str, n: int, env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "mlx_lm", "generate", "--model", str(model),
           "--prompt", prompt, "-m", str(n), "--temp", "0"]  # fmt: skip
    rc, so, se, wall = run_proc(cmd, env)
    if rc != 0:
        return {"error": f"exit {rc}: {tail(se)}", "wall_s": wall}
    gen, pr = _MLXLM_GEN.search(so), _MLXLM_PROMPT.search(so)
    if not gen:
        return {"error": f"no 'Generation:' line: {tail(so)}", "wall_s": wall}
    tokens, reported = int(gen.group(1)), float(gen.group(2))
    parts = so.split("=" * 10)
    text = parts[1].strip("\n") if len(parts) >= 3 else None
    return {
        # mlx-lm divides N tokens by the time of N - 1 decode steps; rescale to
        # mlxbun's (N - 1) / t so both columns use the same formula.
        "decode_tps": reported * (tokens - 1) / tokens if tokens > 1 else 0.0,
        "reported_tps": reported,
        "tokens": tokens,
        "prompt_tokens": int(pr.group(1)) if pr else None,
        "finish": None,  # mlx_lm's CLI does not say; tokens == N means "length"
        "wall_s": wall,
        "text": text,
    }


def bench_cli(
    exe: str, size: str, model: Path, n: int, prompt: str, pairs: int, env: dict[str, str]
) -> dict[str, Any]:
    log(f"cli {size}: warm-up (1 run each), then {pairs} alternating pairs, N={n}")
    engines = {
        "mlxbun": lambda: cli_mlxbun(exe, model, prompt, n, env),
        "mlx_lm": lambda: cli_mlx_lm(model, prompt, n, env),
    }
    warm = {name: fn() for name, fn in engines.items()}
    runs: dict[str, list[dict[str, Any]]] = {"mlxbun": [], "mlx_lm": []}
    for i in range(pairs):
        order = ["mlxbun", "mlx_lm"] if i % 2 == 0 else ["mlx_lm", "mlxbun"]
        for name in order:
            runs[name].append(engines[name]())
        a, b = runs["mlxbun"][-1], runs["mlx_lm"][-1]
        log(
            f"  pair {i + 1}/{pairs}: mlxbun {a.get('decode_tps', float('nan')):.1f} "
            f"vs mlx_lm {b.get('decode_tps', float('nan')):.1f} tok/s"
        )
    return summarize("cli", size, n, prompt, runs, warm)


# ---------------------------------------------------------------------------
# decode: in-process worker (one fresh process per model)
# ---------------------------------------------------------------------------


def worker_inproc(argv: list[str]) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--max-tokens", type=int, required=True)
    ap.add_argument("--pairs", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--prompts", required=True, help="JSON list of candidate prompts")
    ap.add_argument("--breakdown", action="store_true")
    a = ap.parse_args(argv)

    import gc
    import uuid

    from mlx_lm import load as lm_load
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    from mlxbun_cli.client.backend import LocalBackend
    from mlxbun_cli.prep.events import Done, ReasoningDelta, TextDelta
    from mlxbun_cli.prep.request import GenerationRequest

    n = a.max_tokens
    backend = LocalBackend(a.model)
    try:
        loaded = backend.loaded
        model, tokenizer = lm_load(a.model)
        sampler = make_sampler(0.0)

        def request(prompt: str) -> GenerationRequest:
            req = GenerationRequest(
                messages=[{"role": "user", "content": prompt}], max_tokens=n, temperature=0
            )
            if hasattr(req, "session_id"):
                # A fresh prompt-cache namespace per run: mlxbun's prompt cache
                # would otherwise skip the prefill on every repeat, which
                # mlx_lm.stream_generate has no equivalent of (TTFT/wall only).
                req.session_id = uuid.uuid4().hex
            return req

        def prompt_ids(prompt: str) -> tuple[list[int], bool | None]:
            """The tokens mlxbun decodes from, and whether mlx_lm's CLI renders the same."""
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            lm_ids = list(tokenizer.encode(text, add_special_tokens=False))
            try:
                from mlxbun_cli.prep.pipeline import prepare

                bun_ids = list(prepare(loaded, request(prompt)).engine_request.prompt_tokens)
            except Exception:  # the prep API moved: fall back to mlx_lm's rendering
                return lm_ids, None
            return bun_ids, bun_ids == lm_ids

        def run_mlx_lm(ids: list[int]) -> dict[str, Any]:
            gc.collect()
            c0, t0 = time.process_time(), time.perf_counter()
            first = last = None
            parts, final = [], None
            for resp in stream_generate(model, tokenizer, ids, max_tokens=n, sampler=sampler):
                now = time.perf_counter()
                if first is None:
                    first = now
                last, final = now, resp
                parts.append(resp.text)
            cpu = time.process_time() - c0
            tokens = final.generation_tokens
            window = last - first
            return {
                "decode_tps": (tokens - 1) / window if tokens > 1 and window > 0 else 0.0,
                "reported_tps": final.generation_tps,
                "tokens": tokens,
                "prompt_tokens": len(ids),
                "finish": final.finish_reason,
                "ttft_s": first - t0,
                "wall_s": last - t0,
                "cpu_ms_per_token": 1000 * cpu / max(tokens, 1),
                "text": "".join(parts),
            }

        def run_mlxbun(prompt: str) -> dict[str, Any]:
            gc.collect()
            c0, t0 = time.process_time(), time.perf_counter()
            first = None
            parts, done = [], None
            for event in backend.stream(request(prompt)):
                now = time.perf_counter()
                if first is None:
                    first = now
                if isinstance(event, Done):
                    done = event
                elif isinstance(event, (TextDelta, ReasoningDelta)):
                    parts.append(event.text)
            cpu = time.process_time() - c0
            u = done.usage
            window = now - first
            return {
                "decode_tps": u.generation_tps,  # scheduler-side: (N - 1) / first..last token
                "consumer_tps": (u.completion_tokens - 1) / window if window > 0 else None,
                "tokens": u.completion_tokens,
                "prompt_tokens": u.prompt_tokens,
                "finish": done.finish_reason,
                "ttft_s": u.queued_seconds + u.prompt_seconds,
                "wall_s": now - t0,
                "cpu_ms_per_token": 1000 * cpu / max(u.completion_tokens, 1),
                "text": "".join(parts),
                "error": done.error,
            }

        # Pick the prompt: both engines decode N tokens; these runs are warm-ups too.
        chosen, probes, best = None, [], None
        for prompt in json.loads(a.prompts):
            ids, same_ids = prompt_ids(prompt)
            lm = run_mlx_lm(ids)
            bun = run_mlxbun(prompt) if lm["tokens"] == n else None
            probes.append(
                {
                    "prompt": prompt,
                    "mlx_lm_tokens": lm["tokens"],
                    "mlxbun_tokens": bun["tokens"] if bun else None,
                }  # fmt: skip
            )
            score = min(lm["tokens"], bun["tokens"]) if bun else lm["tokens"]
            if best is None or score > best[0]:
                best = (score, prompt, ids, same_ids)
            if bun is not None and bun["tokens"] == n:
                chosen = (prompt, ids, same_ids)
                break
        full_length = chosen is not None
        prompt, ids, same_ids = chosen or best[1:]
        for _ in range(max(0, a.warmup - 1)):
            run_mlx_lm(ids)
            run_mlxbun(prompt)

        runs: dict[str, list[dict[str, Any]]] = {"mlxbun": [], "mlx_lm": []}
        for i in range(a.pairs):
            order = ["mlxbun", "mlx_lm"] if i % 2 == 0 else ["mlx_lm", "mlxbun"]
            for name in order:
                runs[name].append(run_mlxbun(prompt) if name == "mlxbun" else run_mlx_lm(ids))

        result = {
            "prompt": prompt,
            "prompt_ids_match_mlx_lm_cli": same_ids,
            "full_length": full_length,
            "probes": probes,
            "runs": runs,
        }
        if a.breakdown:
            result["breakdown"] = phase_breakdown(
                loaded, backend, model, tokenizer, prompt, ids, n, max(3, a.pairs // 2)
            )
        print(RESULT_MARK + json.dumps(result), flush=True)
    finally:
        backend.close()  # an unclosed scheduler thread aborts the interpreter at exit


def phase_breakdown(loaded, backend, model, tokenizer, prompt, ids, n, reps) -> dict[str, Any]:
    """Microseconds per token in each phase, by wrapping functions (diagnostic only).

    Wraps mx.eval / mx.async_eval, the model's __call__, mlx-lm's batch
    generator and mlxbun's scheduler / output processor. Wrapping adds ~1 us
    per call; compare phases, not totals, with the un-instrumented numbers.
    """
    import collections
    import importlib
    import threading

    import mlx.core as mx

    from mlxbun_cli.prep.request import GenerationRequest

    gen_mod = importlib.import_module("mlx_lm.generate")
    acc: dict[tuple[str, str], float] = collections.defaultdict(float)
    cnt: collections.Counter = collections.Counter()
    undo = []

    def wrap(owner: Any, name: str, label: str) -> None:
        fn = getattr(owner, name, None)
        if fn is None:
            return

        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                key = (threading.current_thread().name, label)
                acc[key] += time.perf_counter() - t
                cnt[key] += 1

        setattr(owner, name, wrapper)
        undo.append((owner, name, fn))

    try:
        sched_mod = importlib.import_module("mlxbun_cli.engine.scheduler")
        pipe_mod = importlib.import_module("mlxbun_cli.prep.pipeline")
    except ImportError:
        sched_mod = pipe_mod = None
    wrap(mx, "eval", "mx.eval (wait for compute)")
    wrap(mx, "async_eval", "mx.async_eval (compute on CPU)")
    wrap(type(model), "__call__", "model.__call__ (build graph)")
    wrap(getattr(gen_mod, "GenerationBatch", None), "next", "mlx_lm GenerationBatch.next")
    wrap(getattr(gen_mod, "BatchGenerator", None), "next", "mlx_lm BatchGenerator.next")
    if sched_mod is not None:
        cls = getattr(sched_mod, "Scheduler", None)
        for meth in ("_admit", "_reap_cancelled", "_dispatch"):
            wrap(cls, meth, f"mlxbun Scheduler.{meth}")
    if pipe_mod is not None:
        wrap(
            getattr(pipe_mod, "OutputProcessor", None), "on_step", "mlxbun OutputProcessor.on_step"
        )

    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_sampler

    sampler = make_sampler(0.0)

    def lm() -> None:
        for _ in stream_generate(model, tokenizer, ids, max_tokens=n, sampler=sampler):
            pass

    def bun() -> None:
        req = GenerationRequest(
            messages=[{"role": "user", "content": prompt}], max_tokens=n, temperature=0
        )
        for _ in backend.stream(req):
            pass

    out: dict[str, Any] = {}
    try:
        for label, fn in (("mlx_lm", lm), ("mlxbun", bun)):
            fn()
            acc.clear()
            cnt.clear()
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(reps):
                fn()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            total = reps * n
            out[label] = {
                "wall_us_per_token": 1e6 * wall / total,
                "cpu_us_per_token": 1e6 * cpu / total,
                "phases": [
                    {
                        "thread": th,
                        "phase": ph,
                        "us_per_token": 1e6 * v / total,
                        "calls_per_token": cnt[(th, ph)] / total,
                    }  # fmt: skip
                    for (th, ph), v in sorted(acc.items(), key=lambda kv: -kv[1])
                ],
            }
    finally:
        for owner, name, fn in reversed(undo):
            setattr(owner, name, fn)
    return out


def bench_inproc(
    size: str, model: Path, n: int, pairs: int, warmup: int, prompts: list[str],
    env: dict[str, str], breakdown: bool,
) -> dict[str, Any]:  # fmt: skip
    log(f"in-process {size}: load both engines, warm up, then {pairs} alternating pairs, N={n}")
    cmd = [
        sys.executable, str(Path(__file__).resolve()), "_worker", "inproc",
        "--model", str(model), "--max-tokens", str(n), "--pairs", str(pairs),
        "--warmup", str(warmup), "--prompts", json.dumps(prompts),
    ]  # fmt: skip
    if breakdown:
        cmd.append("--breakdown")
    rc, so, se, wall = run_proc(cmd, env, timeout=1800)
    line = next((ln for ln in so.splitlines() if ln.startswith(RESULT_MARK)), None)
    if rc != 0 or line is None:
        log(f"in-process {size} worker failed (exit {rc})")
        return {
            "mode": "in-process", "model": size, "max_tokens": n,
            "error": f"worker exit {rc}: {tail(se, 1500)}",
        }  # fmt: skip
    data = json.loads(line[len(RESULT_MARK) :])
    summary = summarize("in-process", size, n, data["prompt"], data["runs"], None)
    summary["prompt_ids_match_mlx_lm_cli"] = data["prompt_ids_match_mlx_lm_cli"]
    summary["prompt_probes"] = data["probes"]
    summary["worker_wall_s"] = rnd(wall, 2)
    if "breakdown" in data:
        summary["breakdown"] = data["breakdown"]
    for name in ("mlxbun", "mlx_lm"):
        summary[name]["cpu_ms_per_token"] = rnd(
            median([r.get("cpu_ms_per_token") for r in data["runs"][name]]), 3
        )
    summary["mlxbun"]["consumer_tps_median"] = rnd(
        median([r.get("consumer_tps") for r in data["runs"]["mlxbun"]]), 2
    )
    return summary


# ---------------------------------------------------------------------------
# summaries and verdicts
# ---------------------------------------------------------------------------


def summarize(mode, size, n, prompt, runs, warm) -> dict[str, Any]:
    bun, lm = runs["mlxbun"], runs["mlx_lm"]
    errors = [r["error"] for r in bun + lm if r.get("error")]
    ok_pairs = [
        (b, m) for b, m in zip(bun, lm, strict=False) if not b.get("error") and not m.get("error")
    ]
    ratios = [b["decode_tps"] / m["decode_tps"] for b, m in ok_pairs if m.get("decode_tps")]
    counts_b = sorted({b["tokens"] for b, _ in ok_pairs})
    counts_m = sorted({m["tokens"] for _, m in ok_pairs})
    full = bool(ok_pairs) and counts_b == [n] and counts_m == [n]
    texts_same = None
    with contextlib.suppress(KeyError, TypeError):
        pairs_with_text = [(b["text"], m["text"]) for b, m in ok_pairs if m.get("text") is not None]
        if pairs_with_text:
            texts_same = all(x.strip() == y.strip() for x, y in pairs_with_text)
    ratio = median(ratios)
    ci = bootstrap_median_ci(ratios)
    if errors and not ratios:
        verdict = "ERROR"
    elif not full:
        verdict = "INVALID"  # not a like-for-like decode: different or short lengths
    elif ratio >= DECODE_TARGET:
        verdict = "PASS"
    else:
        verdict = "FAIL"
    noisy = bool(ci and ci[0] < DECODE_TARGET < ci[1])  # the interval straddles the target

    def side(rs: list[dict[str, Any]]) -> dict[str, Any]:
        good = [r for r in rs if not r.get("error")]
        tps = [r["decode_tps"] for r in good]
        q = quartiles(tps)
        return {
            "decode_tps_median": rnd(median(tps), 2),
            "decode_tps_q1_q3": [rnd(q[0], 2), rnd(q[1], 2)] if q else None,
            "decode_tps_runs": [rnd(x, 2) for x in tps],
            "reported_tps_median": rnd(median([r.get("reported_tps") for r in good]), 2),
            "tokens": sorted({r["tokens"] for r in good}),
            "prompt_tokens": sorted({r.get("prompt_tokens") for r in good} - {None}),
            "finish": sorted({str(r.get("finish")) for r in good}),
            "wall_s_median": rnd(median([r.get("wall_s") for r in good]), 4),
            "ttft_s_median": rnd(median([r.get("ttft_s") for r in good]), 4),
        }

    out = {
        "mode": mode,
        "model": size,
        "max_tokens": n,
        "prompt": prompt,
        "pairs": len(ok_pairs),
        "mlxbun": side(bun),
        "mlx_lm": side(lm),
        "ratio_paired_median": rnd(ratio, 4),
        "ratio_of_medians": rnd(
            (median([b["decode_tps"] for b, _ in ok_pairs]) or 0)
            / (median([m["decode_tps"] for _, m in ok_pairs]) or 1),
            4,
        )
        if ok_pairs
        else None,
        "ratio_ci90": [rnd(ci[0], 4), rnd(ci[1], 4)] if ci else None,
        # best run vs best run: the least-disturbed runs, steadier on a busy machine
        "ratio_of_best": rnd(
            max(b["decode_tps"] for b, _ in ok_pairs) / max(m["decode_tps"] for _, m in ok_pairs), 4
        )
        if ok_pairs and max(m["decode_tps"] for _, m in ok_pairs) > 0
        else None,
        "ratio_runs": [rnd(r, 4) for r in ratios],
        "full_length": full,
        "same_text": texts_same,
        "prompt_tokens_match": (
            {b.get("prompt_tokens") for b, _ in ok_pairs}
            == {m.get("prompt_tokens") for _, m in ok_pairs}
        )
        if ok_pairs
        else None,
        "target": DECODE_TARGET,
        "verdict": verdict,
        "noisy": noisy,
        "errors": errors[:4],
    }
    if warm is not None:
        out["warmup_errors"] = [w["error"] for w in warm.values() if w.get("error")]
    return out


# ---------------------------------------------------------------------------
# --help start-up
# ---------------------------------------------------------------------------

MODULES_CODE = r"""
import contextlib, io, json, sys
sys.argv = ["mlxbun"] + json.loads(sys.argv[1])
buf, code = io.StringIO(), 0
try:
    with contextlib.redirect_stdout(buf):
        from mlxbun_cli.app import main
        main()
except SystemExit as exc:
    code = exc.code
print("BENCH_RESULT " + json.dumps({
    "exit": code, "help_chars": len(buf.getvalue()), "n_modules": len(sys.modules),
    "top_level": sorted({m.split(".")[0] for m in sys.modules}),
}))
"""

HELP_MAIN_CODE = (
    "import sys; sys.argv=['mlxbun','--help']\n"
    "from mlxbun_cli.app import main\n"
    "try:\n    main()\nexcept SystemExit:\n    pass\n"
)

_IMPORTTIME = re.compile(r"^import time:\s*(\d+)\s*\|\s*(\d+)\s*\|(\s*)(\S+)\s*$")


def importtime_offenders(env: dict[str, str], runs: int) -> dict[str, Any]:
    """`-X importtime` of `mlxbun --help`: min over runs, per module and per package."""
    best_cum: dict[str, int] = {}
    best_self: dict[str, int] = {}
    depth: dict[str, int] = {}
    for _ in range(runs):
        rc, _, se, _ = run_proc([sys.executable, "-X", "importtime", "-c", HELP_MAIN_CODE], env)
        for line in se.splitlines():
            m = _IMPORTTIME.match(line)
            if not m:
                continue
            self_us, cum_us, indent, name = int(m[1]), int(m[2]), len(m[3]), m[4]
            best_self[name] = min(best_self.get(name, self_us), self_us)
            best_cum[name] = min(best_cum.get(name, cum_us), cum_us)
            depth[name] = (indent - 1) // 2
    by_pkg: dict[str, int] = {}
    for name, us in best_self.items():
        pkg = name.split(".")[0]
        by_pkg[pkg] = by_pkg.get(pkg, 0) + us
    top_roots = sorted(
        ((n, us) for n, us in best_cum.items() if depth.get(n) == 0), key=lambda kv: -kv[1]
    )
    return {
        "total_import_ms": round(sum(best_self.values()) / 1000, 1),
        "top_level_imports_ms": [[n, round(us / 1000, 1)] for n, us in top_roots[:8]],
        "by_package_self_ms": [
            [p, round(us / 1000, 1)] for p, us in sorted(by_pkg.items(), key=lambda kv: -kv[1])[:10]
        ],
        "by_module_cumulative_ms": [
            [n, round(us / 1000, 1)]
            for n, us in sorted(best_cum.items(), key=lambda kv: -kv[1])[:12]
        ],
        "by_module_self_ms": [
            [n, round(us / 1000, 1)]
            for n, us in sorted(best_self.items(), key=lambda kv: -kv[1])[:10]
        ],
    }


def bench_help(exe: str, env: dict[str, str], tmp: Path, runs: int, importtime_runs: int) -> dict:
    cached_env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}
    cached_env["PYTHONPYCACHEPREFIX"] = str(tmp / "pycache")  # bytecode outside the tree
    envs = {"as_is": env, "bytecode_cached": cached_env}
    cmds = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import mlxbun_cli.app": [sys.executable, "-c", "import mlxbun_cli.app"],
        "mlxbun --help": [exe, "--help"],
    }
    plain_env = {**env, "TYPER_USE_RICH": "0"}  # what-if: click's plain help, no rich
    log(
        f"--help: {runs} fresh runs per command x {len(envs)} environments "
        f"(PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE')!r} as is)"
    )
    timings: dict[str, dict[str, list[float]]] = {e: {c: [] for c in cmds} for e in envs}
    errors = []
    plain: list[float] = []
    for e in envs.values():
        for cmd in cmds.values():  # warm-up: page cache, and the bytecode cache
            run_proc(cmd, e)
    for _ in range(runs):
        for ename, e in envs.items():
            for cname, cmd in cmds.items():
                rc, so, se, wall = run_proc(cmd, e)
                if rc != 0:
                    errors.append(f"{cname} ({ename}) exit {rc}: {tail(se, 300)}")
                timings[ename][cname].append(wall)
        plain.append(run_proc(cmds["mlxbun --help"], plain_env)[3])

    def stats(xs: list[float]) -> dict[str, Any]:
        return {
            "median_s": rnd(median(xs), 4),
            "min_s": rnd(min(xs), 4),
            "max_s": rnd(max(xs), 4),
            "runs_s": [rnd(x, 4) for x in xs],
        }

    out: dict[str, Any] = {
        "target_s": HELP_TARGET_S,
        "runs": runs,
        "timings": {e: {c: stats(v) for c, v in t.items()} for e, t in timings.items()},
        "errors": errors[:4],
        "what_if_TYPER_USE_RICH_0": stats(plain),
    }
    for ename in envs:
        med = out["timings"][ename]["mlxbun --help"]["median_s"]
        out[f"verdict_{ename}"] = "PASS" if med <= HELP_TARGET_S else "FAIL"
    out["verdict"] = out["verdict_as_is"]

    imports = {}
    for args in (["--help"], ["generate", "--help"]):
        rc, so, se, _ = run_proc([sys.executable, "-c", MODULES_CODE, json.dumps(args)], env)
        line = next((ln for ln in so.splitlines() if ln.startswith(RESULT_MARK)), None)
        key = "mlxbun " + " ".join(args)
        if line is None:
            imports[key] = {"error": f"exit {rc}: {tail(se, 400)}"}
            continue
        data = json.loads(line[len(RESULT_MARK) :])
        top = set(data["top_level"])
        imports[key] = {
            "exit": data["exit"],
            "help_chars": data["help_chars"],
            "n_modules": data["n_modules"],
            "heavy_imported": [m for m in HEAVY_MODULES if m in top],
            "watch_imported": [m for m in WATCH_MODULES if m in top],
        }
    out["imports"] = imports
    out["no_heavy_imports"] = all(
        not v.get("heavy_imported") and "error" not in v for v in imports.values()
    )
    log(f"--help: -X importtime x {importtime_runs}")
    out["importtime"] = importtime_offenders(env, importtime_runs)
    return out


# ---------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------


def fmt(x: Any, nd: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def render(report: dict[str, Any]) -> None:
    table, say = printer(160)

    m, v = report["machine"], report["versions"]
    say(
        f"mlxbun {v.get('mlxbun')} ({v.get('git')}) · mlx {v.get('mlx')} · mlx-lm {v.get('mlx-lm')} · "
        f"Python {v.get('python')} · {m.get('cpus')} CPUs · load {m.get('loadavg_start')} → "
        f"{m.get('loadavg_end')}"
    )
    load = m.get("loadavg_start") or [0.0]
    load_end = m.get("loadavg_end") or [0.0]
    if max(load[0], load_end[0]) > 0.5 * (m.get("cpus") or 1):
        say(
            "WARNING: the machine was busy (1-min load average above half the CPUs): "
            "other processes share the cores, so timings are noisy; trust the ratios' "
            "intervals, or rerun on an idle machine."
        )
    decode = report.get("decode", [])
    if decode:
        rows = []
        for d in decode:
            if "error" in d and "mlxbun" not in d:
                rows.append(
                    [
                        d["model"],
                        d["mode"],
                        str(d["max_tokens"]),
                        "-",
                        "-",
                        "-",
                        "-",
                        "-",
                        "-",
                        "ERROR",
                    ]
                )
                continue
            b, lm = d["mlxbun"], d["mlx_lm"]
            ci = d.get("ratio_ci90")
            verdict = d["verdict"] + (" (noisy)" if d.get("noisy") else "")
            rows.append([
                d["model"],
                d["mode"],
                str(d["max_tokens"]),
                fmt(b["decode_tps_median"]),
                fmt(lm["decode_tps_median"]),
                fmt(d["ratio_paired_median"], 3),
                f"{ci[0]:.3f}–{ci[1]:.3f}" if ci else "-",
                fmt(d.get("ratio_of_best"), 3),
                f"{'/'.join(map(str, b['tokens']))} / {'/'.join(map(str, lm['tokens']))}",
                verdict,
            ])  # fmt: skip
        table(
            f"Decode tok/s, greedy, median of alternating runs (target: mlxbun >= {DECODE_TARGET} x mlx_lm)",
            ["model", "mode", "N", "mlxbun tok/s", "mlx_lm tok/s", "ratio", "90% CI", "best/best",
             "tokens bun / lm", "verdict"],
            rows,
        )  # fmt: skip
        rows = []
        for d in decode:
            if "mlxbun" not in d:
                continue
            b, lm = d["mlxbun"], d["mlx_lm"]
            rows.append([
                d["model"], d["mode"],
                fmt(b["wall_s_median"], 3), fmt(lm["wall_s_median"], 3),
                fmt(b["ttft_s_median"], 3), fmt(lm["ttft_s_median"], 3),
                fmt(b.get("cpu_ms_per_token"), 3), fmt(lm.get("cpu_ms_per_token"), 3),
                "yes" if d.get("same_text") else ("no" if d.get("same_text") is False else "-"),
            ])  # fmt: skip
        table(
            "Around the decode (medians): wall = whole process (cli) or request (in-process)",
            ["model", "mode", "bun wall s", "lm wall s", "bun TTFT s", "lm TTFT s",
             "bun CPU ms/tok", "lm CPU ms/tok", "same text"],
            rows,
        )  # fmt: skip
        for d in decode:
            bun_consumer = (d.get("mlxbun") or {}).get("consumer_tps_median")
            if bun_consumer:
                say(
                    f"  {d['model']} in-process: mlxbun tok/s timed by the engine {d['mlxbun']['decode_tps_median']}, "
                    f"timed by the consuming thread {bun_consumer} (mlx_lm is timed by its consumer)"
                )
            if d.get("errors"):
                say(f"  errors ({d['model']} {d['mode']}): {d['errors'][0]}")
            if d.get("prompt_ids_match_mlx_lm_cli") is False:
                say(
                    f"  note ({d['model']}): mlxbun's prompt tokens differ from mlx_lm's CLI rendering"
                )
            if "breakdown" in d:
                for eng, bd in d["breakdown"].items():
                    rows = [
                        [
                            p["thread"],
                            p["phase"],
                            fmt(p["us_per_token"], 1),
                            fmt(p["calls_per_token"], 2),
                        ]
                        for p in bd["phases"]
                    ]
                    table(
                        f"Breakdown {d['model']} / {eng}: wall {bd['wall_us_per_token']:.0f} us/token, "
                        f"process CPU {bd['cpu_us_per_token']:.0f} us/token (instrumented)",
                        ["thread", "phase", "us/token", "calls/token"],
                        rows,
                    )
    h = report.get("help")
    if h:
        t = h["timings"]
        rows = [
            [name, "", fmt(t["as_is"][name]["median_s"], 3), fmt(t["as_is"][name]["min_s"], 3),
             fmt(t["bytecode_cached"][name]["median_s"], 3), fmt(t["bytecode_cached"][name]["min_s"], 3)]
            for name in t["as_is"]
        ]  # fmt: skip
        rows[-1][1] = f"{h['verdict_as_is']} / {h['verdict_bytecode_cached']}"
        plain = h.get("what_if_TYPER_USE_RICH_0")
        if plain:
            rows.append(["what if: TYPER_USE_RICH=0 mlxbun --help", "(info)",
                         fmt(plain["median_s"], 3), fmt(plain["min_s"], 3), "-", "-"])  # fmt: skip
        table(
            f"Start-up: median of {h['runs']} fresh processes (target: mlxbun --help <= {HELP_TARGET_S} s)",
            ["command", "verdict (as is / cached)", "as-is median s", "as-is min s",
             "bytecode-cached median s", "cached min s"],
            rows,
        )  # fmt: skip
        for key, imp in h["imports"].items():
            if "error" in imp:
                say(f"  {key}: could not check imports: {imp['error']}")
            else:
                heavy = ", ".join(imp["heavy_imported"]) or "none"
                watch = ", ".join(imp["watch_imported"]) or "none"
                say(
                    f"  {key}: {imp['n_modules']} modules; heavy ({'/'.join(HEAVY_MODULES)}): "
                    f"{heavy} -> {'OK' if not imp['heavy_imported'] else 'FAIL'}; also loaded: {watch}"
                )
        it = h["importtime"]
        say(
            f"  -X importtime (min of runs): total {it['total_import_ms']} ms; by package (self): "
            + ", ".join(f"{p} {ms}" for p, ms in it["by_package_self_ms"][:8])
        )
        say(
            "  slowest imports (cumulative ms): "
            + ", ".join(f"{n} {ms}" for n, ms in it["by_module_cumulative_ms"][:10])
        )
        if h.get("errors"):
            say(f"  errors: {h['errors'][0]}")
    say(f"total bench time {report['elapsed_s']:.0f}s")


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Verdicts are reported, never asserted (exit 0) unless --fail-on-miss.",
    )
    ap.add_argument("--quick", action="store_true", help="tiny model only, fewer repeats (< 1 min)")
    ap.add_argument("--json", action="store_true", help="print one JSON report on stdout")
    ap.add_argument("--models", default=None, help="comma list of demo sizes (default: tiny,30m)")
    ap.add_argument("--models-dir", type=Path, default=None,
                    help="build/reuse demo models here (default: a temp dir, removed after)")  # fmt: skip
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="N for every model (default: tiny 256, 30m 96)")  # fmt: skip
    ap.add_argument("--cli-pairs", type=int, default=None, help="alternating CLI pairs per model")
    ap.add_argument("--inproc-pairs", type=int, default=None,
                    help="alternating in-process pairs per model")  # fmt: skip
    ap.add_argument("--help-runs", type=int, default=None, help="fresh `mlxbun --help` runs")
    ap.add_argument("--prompt", default=None, help="use this prompt (skip the candidate list)")
    ap.add_argument("--skip-cli", action="store_true")
    ap.add_argument("--skip-inproc", action="store_true")
    ap.add_argument("--skip-help", action="store_true")
    ap.add_argument("--breakdown", action="store_true",
                    help="also time engine phases per token in-process (instrumented)")  # fmt: skip
    ap.add_argument("--fail-on-miss", action="store_true",
                    help="exit 1 when a verdict is FAIL/INVALID/ERROR")  # fmt: skip
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:2] == ["_worker", "inproc"]:
        worker_inproc(argv[2:])
        return 0
    args = parse_args(argv)
    started = time.perf_counter()
    sizes = args.models.split(",") if args.models else (["tiny"] if args.quick else list(SIZES))
    for s in sizes:
        if s not in SIZES:
            raise SystemExit(f"unknown model size {s!r}; choose from {', '.join(SIZES)}")
    help_runs = args.help_runs or (5 if args.quick else 10)
    prompts = [args.prompt] if args.prompt else list(CANDIDATE_PROMPTS)
    exe = venv_script("mlxbun")

    report: dict[str, Any] = {
        "versions": versions(),
        "machine": machine(),
        "settings": {
            "quick": args.quick,
            "models": sizes,
            "cli_pairs": args.cli_pairs,
            "inproc_pairs": args.inproc_pairs,
            "help_runs": help_runs,
            "decode_target": DECODE_TARGET,
            "help_target_s": HELP_TARGET_S,
        },  # fmt: skip
        "decode": [],
    }
    tmp = Path(tempfile.mkdtemp(prefix="mlxbun-bench-"))
    try:
        env = bench_env(tmp / "home")
        if sizes and not (args.skip_cli and args.skip_inproc):
            models_dir = args.models_dir or (tmp / "models")
            models = ensure_models(Path(models_dir).expanduser(), sizes, env)
            for size in sizes:
                n = args.max_tokens or DEFAULT_TOKENS[size]
                prompt = prompts[0]
                inproc = None
                if not args.skip_inproc:
                    pairs = args.inproc_pairs or INPROC_PAIRS[size][0 if args.quick else 1]
                    inproc = bench_inproc(
                        size, models[size], n, pairs, 2, prompts, env, args.breakdown
                    )
                    prompt = inproc.get("prompt") or prompt  # the one both decode fully
                if not args.skip_cli:
                    report["decode"].append(
                        bench_cli(
                            exe,
                            size,
                            models[size],
                            n,
                            prompt,
                            args.cli_pairs or CLI_PAIRS[size][0 if args.quick else 1],
                            env,
                        )  # fmt: skip
                    )
                if inproc is not None:
                    report["decode"].append(inproc)
        if not args.skip_help:
            report["help"] = bench_help(exe, env, tmp, help_runs, 1 if args.quick else 3)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.suppress(OSError):
        report["machine"]["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    verdicts = [d.get("verdict", "ERROR") for d in report["decode"]]
    if "help" in report:
        verdicts.append(report["help"]["verdict"])
        verdicts.append("PASS" if report["help"]["no_heavy_imports"] else "FAIL")
    report["all_pass"] = all(v == "PASS" for v in verdicts)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        render(report)
    return 1 if args.fail_on_miss and not report["all_pass"] else 0


if __name__ == "__main__":
    sys.exit(main())
