"""Jobs: long work (dataset generation, quantize, fine-tune) that survives a terminal.

store.py     SQLite (WAL) job store: jobs, their events, append-only migrations
params.py    per-kind parameter checks, run before a job is queued (no mlx)
context.py   what a runner sees: params, events, progress, the stop request
dataset.py   batch generation over a Backend: JSONL in, OpenAI batch JSONL out
quantize.py  mlx-lm convert into the models dir        (runs in a worker process)
finetune.py  LoRA / DoRA SFT with mlx-lm's trainer     (runs in a worker process)
worker.py    `python -m mlxbun_cli.jobs.worker KIND JOB_ID`
manager.py   the daemon's queue: runner thread, worker processes, cancel, resume
client.py    the CLI's side: the daemon's HTTP API, or the store when none runs

Nothing here imports mlx at module level; the runners that need it import it
inside, and only ever run in a worker process or the in-process CLI.
"""

KINDS = ("dataset", "quantize", "finetune")
STATES = ("queued", "running", "succeeded", "failed", "cancelled", "interrupted")
ACTIVE_STATES = ("queued", "running")
RESUMABLE_STATES = ("interrupted", "failed", "cancelled")
TERMINAL_STATES = ("succeeded", "failed", "cancelled", "interrupted")
