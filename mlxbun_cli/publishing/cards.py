"""The README.md card a push generates when the folder has none.

It records provenance: the base model, the quantization or training settings
(from the job's parameters, else the folder's own config), dataset rows, the
mlxbun version and the date the content was made. The date is the job's finish
or the newest file's modification, never "today", so pushing unchanged content
again yields the same card and no commit. YAML front matter as the Hub reads
it: library_name mlx, tags, base_model (only when it names a Hub repo).
The card goes into the commit, never into the user's folder.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

from mlxbun_cli.publishing.content import Content

_PLAIN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/<> -]*$")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Provenance:
    made: float  # unix time the content was made
    job_id: str | None = None
    job_kind: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    base_model: str | None = None  # a base model known from elsewhere (the hub cache path)


def render(content: Content, repo_id: str, prov: Provenance) -> str:
    return {"model": model_card, "adapter": adapter_card, "dataset": dataset_card}[content.kind](
        content, repo_id, prov
    )


# -- shared pieces ---------------------------------------------------------------------


def _scalar(value: Any) -> str:
    text = str(value)
    return text if _PLAIN.match(text) and text.strip() == text else json.dumps(text)


def front_matter(fields: dict[str, Any]) -> str:
    lines = ["---"]
    for key, value in fields.items():
        if value is None or value == []:
            continue
        if isinstance(value, list):
            lines.append(f"{key}:")
            lines += [f"- {_scalar(item)}" for item in value]
        else:
            lines.append(f"{key}: {_scalar(value)}")
    return "\n".join([*lines, "---", ""])


def _table(rows: list[tuple[str, Any]]) -> str:
    kept = [(k, v) for k, v in rows if v not in (None, "")]
    body = "\n".join(f"| {key} | {str(value).replace('|', '/')} |" for key, value in kept)
    return "| | |\n|---|---|\n" + body


def _date(when: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(when))


def _hub_id(name: Any) -> str | None:
    """`name` when it is an ORG/NAME repo id (the Hub refuses other base_model values)."""
    if isinstance(name, str) and _REPO_ID.match(name) and ".." not in name and "--" not in name:
        return name
    return None


def _basename(path: Any) -> str:
    """A file's name only: a card never shows where things lived on this machine."""
    return PurePath(str(path)).name


def _human(n: int) -> str:
    from mlxbun_cli.render import human_bytes

    return human_bytes(n)


def _footer(prov: Provenance) -> list[str]:
    from mlxbun_cli import __version__

    made = f"made {_date(prov.made)}"
    job = f" by job `{prov.job_id}`" if prov.job_id else ""
    return ["", f"<sub>Pushed with mlxbun {__version__}; {made}{job}.</sub>", ""]


# -- models -------------------------------------------------------------------------------


def _quantization(content: Content, params: dict[str, Any]) -> dict[str, Any]:
    q = content.config.get("quantization") or content.config.get("quantization_config") or {}
    q = q if isinstance(q, dict) else {}
    return {
        "bits": params.get("bits") if params.get("bits") is not None else q.get("bits"),
        "group_size": params.get("group_size") or q.get("group_size"),
        "mode": q.get("mode"),
        "recipe": params.get("recipe"),
        "dtype": params.get("dtype"),
    }


def model_card(content: Content, repo_id: str, prov: Provenance) -> str:
    from mlxbun_cli import __version__

    params = prov.params if prov.job_kind == "quantize" else {}
    base = params.get("model") or prov.base_model
    quant = _quantization(content, params)
    quantized = bool(quant["bits"] or quant["recipe"])
    label = (
        f"{quant['recipe']} (mixed precision)"
        if quant["recipe"]
        else (f"{quant['bits']}-bit" if quant["bits"] else None)
    )
    tags = ["mlx", "mlxbun"] + (["quantized"] if quantized else [])
    if quant["bits"] and not quant["recipe"]:
        tags.append(f"{quant['bits']}-bit")
    hub_base = _hub_id(base)
    meta = front_matter(
        {
            "library_name": "mlx",
            "pipeline_tag": "text-generation",
            "base_model": hub_base,
            "base_model_relation": "quantized" if hub_base and quantized else None,
            "tags": tags,
        }
    )
    name = repo_id.rsplit("/", 1)[-1]
    what = f"A {label} MLX quantization" if label else "An MLX model"
    source = f" of `{base}`" if base else ""
    config = content.config
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    rows = [
        ("base model", f"`{base}`" if base else None),
        ("architecture", config.get("model_type") or text_config.get("model_type")),
        ("quantization", label),
        ("group size", quant["group_size"] if quantized else None),
        ("mode", quant["mode"] if quantized else None),
        ("dtype", quant["dtype"] or config.get("torch_dtype")),
        ("files", f"{len(content.files)} ({_human(content.total_bytes)})"),
        ("made", _date(prov.made)),
        ("mlxbun", __version__),
    ]
    body = [
        f"# {name}",
        "",
        f"{what}{source}, for [MLX](https://github.com/ml-explore/mlx) on Apple silicon.",
        "",
        _table(rows),
        "",
        "## Use it",
        "",
        "```sh",
        f"mlxbun models pull {repo_id}",
        f"mlxbun chat {repo_id}",
        "```",
        "",
        "or with mlx-lm:",
        "",
        "```python",
        "from mlx_lm import generate, load",
        "",
        f'model, tokenizer = load("{repo_id}")',
        'print(generate(model, tokenizer, prompt="Hello", max_tokens=64))',
        "```",
    ]
    return meta + "\n".join(body) + "\n" + "\n".join(_footer(prov))


# -- adapters -----------------------------------------------------------------------------


def adapter_card(content: Content, repo_id: str, prov: Provenance) -> str:
    from mlxbun_cli import __version__

    config = content.config
    params = prov.params if prov.job_kind == "finetune" else {}
    lora = config.get("lora_parameters") if isinstance(config.get("lora_parameters"), dict) else {}

    def setting(key: str, default: Any = None) -> Any:
        value = params.get(key)
        return value if value is not None else config.get(key, default)

    base = setting("model") or prov.base_model
    kind = str(setting("fine_tune_type", "lora"))
    hub_base = _hub_id(base)
    meta = front_matter(
        {
            "library_name": "mlx",
            "pipeline_tag": "text-generation",
            "base_model": hub_base,
            "base_model_relation": "adapter" if hub_base else None,
            "tags": ["mlx", "mlxbun", kind],
        }
    )
    data = params.get("data") or config.get("data")
    rows = [
        ("base model", f"`{base}`" if base else None),
        ("type", kind.upper()),
        ("rank", params.get("rank") or lora.get("rank")),
        ("scale", params.get("scale") or lora.get("scale")),
        ("dropout", params.get("dropout") if "dropout" in params else lora.get("dropout")),
        ("layers", setting("num_layers")),
        ("steps", setting("iters")),
        ("batch size", setting("batch_size")),
        ("learning rate", setting("learning_rate")),
        ("max sequence length", setting("max_seq_length")),
        ("optimizer", params.get("optimizer")),
        ("training data", f"`{_basename(data)}`" if data else None),
        ("data format", params.get("format")),
        ("files", f"{len(content.files)} ({_human(content.total_bytes)})"),
        ("made", _date(prov.made)),
        ("mlxbun", __version__),
    ]
    on = f" for `{base}`" if base else ""
    use_base = base or "BASE_MODEL"
    body = [
        f"# {repo_id.rsplit('/', 1)[-1]}",
        "",
        f"A {kind.upper()} adapter{on}, trained with mlx-lm's trainer.",
        "",
        _table(rows),
        "",
        "## Use it",
        "",
        "```sh",
        f"hf download {repo_id} --local-dir adapter",
        f"mlxbun generate {use_base} 'Hello' --adapter adapter",
        f"mlx_lm.generate --model {use_base} --adapter-path adapter --prompt 'Hello'",
        "```",
    ]
    return meta + "\n".join(body) + "\n" + "\n".join(_footer(prov))


# -- datasets -----------------------------------------------------------------------------

_SIZES = ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"))


def size_category(rows: int) -> str:
    for limit, label in _SIZES:
        if rows < limit:
            return label
    return "1M<n<10M" if rows < 10_000_000 else "n>10M"


def dataset_card(content: Content, repo_id: str, prov: Provenance) -> str:
    from mlxbun_cli import __version__

    rows = content.rows or 0
    params = prov.params if prov.job_kind == "dataset" else {}
    generated = prov.job_kind == "dataset"
    meta = front_matter(
        {
            "tags": ["mlxbun"] + (["synthetic"] if generated else []),
            "size_categories": [size_category(rows)],
        }
    )
    by_file = "\n".join(
        f"| `{path}` | {count} | {_human(next(f.size for f in content.files if f.path_in_repo == path))} |"
        for path, count in content.row_counts.items()
    )
    defaults = params.get("defaults") or {}
    settings = [
        ("rows", rows),
        ("generated by", f"`{params['model']}`" if params.get("model") else None),
        ("requests from", f"`{_basename(params['input'])}`" if params.get("input") else None),
        ("request defaults", json.dumps(defaults, sort_keys=True) if defaults else None),
        ("made", _date(prov.made)),
        ("mlxbun", __version__),
    ]
    how = (
        "Generated with `mlxbun jobs submit dataset`: one OpenAI batch-output line per request."
        if generated
        else "JSON Lines, one record per line."
    )
    files = "file" if len(content.row_counts) == 1 else "files"
    body = [
        f"# {repo_id.rsplit('/', 1)[-1]}",
        "",
        f"{rows} rows in {len(content.row_counts)} JSON Lines {files}. {how}",
        "",
        _table(settings),
        "",
        "| file | rows | size |",
        "|---|---|---|",
        by_file,
        "",
        "## Use it",
        "",
        "```python",
        "from datasets import load_dataset",
        "",
        f'ds = load_dataset("{repo_id}")',
        "```",
    ]
    return meta + "\n".join(body) + "\n" + "\n".join(_footer(prov))
