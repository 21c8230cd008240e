"""What a local model is, read from its files without loading a tensor.

Everything here reads small JSON files and the header at the front of each
`*.safetensors` file (8 bytes of little-endian length, then that much JSON:
name -> dtype, shape, data offsets), so it is fast on a 100 GB model and needs
neither mlx nor numpy. `models list` keeps what it read in a small JSON index
in the cache dir, keyed by each model directory's file names, sizes and mtimes,
so a second listing only stats files.

The services `list_models`, `show_model` and `plan_removal` return dataclasses
and never print; `commands/models.py` renders them.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxbun_cli import catalog, paths
from mlxbun_cli.catalog import ModelRef, Skipped
from mlxbun_cli.errors import InputError, InvalidModelError, OptionError

if TYPE_CHECKING:
    from mlxbun_cli.client.daemon import DaemonInfo

INDEX_VERSION = 1
MAX_HEADER_BYTES = 100 * 1024 * 1024  # the safetensors format's own limit
TORCH_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
TEMPLATE_HEAD_LINES = 8


# --- safetensors headers and parameter counts ------------------------------------


def read_safetensors_header(path: Path) -> dict[str, dict[str, Any]]:
    """The tensor table of one safetensors file, checked against the file's size."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise InvalidModelError(f"{path.name}: too short to be a safetensors file")
            (length,) = struct.unpack("<Q", prefix)
            if length < 2 or length > MAX_HEADER_BYTES or 8 + length > size:
                raise InvalidModelError(f"{path.name}: header length {length} does not fit")
            raw = fh.read(length)
    except OSError as exc:
        raise InvalidModelError(f"{path.name}: cannot read ({exc.strerror or exc})") from exc
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidModelError(f"{path.name}: header is not valid JSON") from exc
    if not isinstance(header, dict):
        raise InvalidModelError(f"{path.name}: header is not a JSON object")
    data_bytes = size - 8 - length
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    for name, entry in tensors.items():
        _check_tensor(path, name, entry, data_bytes)
    return tensors


def _check_tensor(path: Path, name: str, entry: Any, data_bytes: int) -> None:
    ok = (
        isinstance(entry, dict)
        and isinstance(entry.get("dtype"), str)
        and isinstance(entry.get("shape"), list)
        and all(isinstance(d, int) and d >= 0 for d in entry["shape"])
        and isinstance(entry.get("data_offsets"), list)
        and len(entry["data_offsets"]) == 2
        and all(isinstance(o, int) for o in entry["data_offsets"])
    )
    if not ok:
        raise InvalidModelError(f"{path.name}: malformed entry for tensor {name!r}")
    start, end = entry["data_offsets"]
    if not 0 <= start <= end <= data_bytes:
        raise InvalidModelError(f"{path.name}: tensor {name!r} lies outside the file")


@dataclass(frozen=True)
class Weights:
    parameters: int  # real parameters: packed quantized weights counted unpacked
    bytes: int  # tensor data as stored (quantization scales and biases included)
    tensors: int
    packed: int  # quantized (uint32-packed) weight matrices


def count_weights(tensors: dict[str, dict[str, Any]], quantization: dict | None) -> Weights:
    """Parameters and bytes from shapes alone.

    An mlx quantized layer stores `NAME.weight` as uint32 words packing 32/bits
    values each, plus `NAME.scales` (and `NAME.biases`) per group: the weight
    counts as `words * 32 / bits` parameters, scales and biases as none.
    """
    params = nbytes = packed = 0
    for name, entry in tensors.items():
        start, end = entry["data_offsets"]
        nbytes += end - start
        base, _, leaf = name.rpartition(".")
        packed_weight = tensors.get(f"{base}.weight", {}).get("dtype") == "U32"
        if leaf in ("scales", "biases") and packed_weight:
            continue
        numel = math.prod(entry["shape"])
        if leaf == "weight" and entry["dtype"] == "U32" and f"{base}.scales" in tensors:
            numel = numel * 32 // _bits(base, entry, tensors[f"{base}.scales"], quantization)
            packed += 1
        params += numel
    return Weights(params, nbytes, len(tensors), packed)


def _bits(base: str, weight: dict, scales: dict, quantization: dict | None) -> int:
    """Bits per value: the layer's own setting (mlx-lm keys those by module path), the
    model's, or what the shapes imply."""
    quantization = quantization or {}
    layer = quantization.get(base)
    settings = layer if isinstance(layer, dict) else quantization
    if isinstance(settings.get("bits"), int) and settings["bits"] > 0:
        return settings["bits"]
    group = settings.get("group_size") or quantization.get("group_size") or 64
    values = (scales["shape"][-1] if scales["shape"] else 0) * group
    words = weight["shape"][-1] if weight["shape"] else 0
    bits = words * 32 // values if values else 0
    return bits if bits in (1, 2, 3, 4, 5, 6, 8) else 4


# --- config, template, capabilities ----------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InvalidModelError(f"{path.name} is not readable JSON: {exc}") from exc


def text_config(config: dict) -> dict:
    """The language model's settings; multimodal configs nest them in text_config."""
    inner = config.get("text_config")
    return {**config, **inner} if isinstance(inner, dict) else config


def _quantization_config(config: dict) -> dict | None:
    """The config's quantization block, per-layer overrides included."""
    for key in ("quantization", "quantization_config"):
        value = config.get(key)
        if isinstance(value, dict) and value:
            return value
    return None


def quantization_of(config: dict) -> dict | None:
    """The model-wide quantization settings, for display."""
    value = _quantization_config(config)
    if value is None:
        return None
    keep = ("bits", "group_size", "mode", "quant_method")
    return {k: value[k] for k in keep if k in value} or {"bits": None}


def dtype_of(config: dict) -> str | None:
    conf = text_config(config)
    value = conf.get("torch_dtype") or conf.get("dtype")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ChatTemplate:
    text: str
    source: str  # the file it came from


def chat_template(path: Path, tokenizer_config: Any) -> ChatTemplate | None:
    """The chat template, wherever this model keeps it (newest convention first)."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return ChatTemplate(jinja.read_text(encoding="utf-8", errors="replace"), jinja.name)
    for name in ("chat_template.json", "tokenizer_config.json"):
        data = tokenizer_config if name == "tokenizer_config.json" else _read_json(path / name)
        value = data.get("chat_template") if isinstance(data, dict) else None
        if isinstance(value, list):  # named templates: [{"name": ..., "template": ...}]
            value = "\n".join(t.get("template", "") for t in value if isinstance(t, dict))
        if isinstance(value, str) and value.strip():
            return ChatTemplate(value, name)
    return None


def _mentions_think(path: Path, template: ChatTemplate | None, tokenizer_config: Any) -> bool:
    if template and "<think>" in template.text:
        return True
    added = (
        tokenizer_config.get("added_tokens_decoder") if isinstance(tokenizer_config, dict) else None
    )
    if "<think>" in json.dumps(added):
        return True
    return _file_contains(path / "tokenizer.json", b'"<think>"')


def _file_contains(path: Path, needle: bytes, chunk: int = 1 << 20) -> bool:
    try:
        with open(path, "rb") as fh:
            tail = b""
            while block := fh.read(chunk):
                if needle in tail + block:
                    return True
                tail = block[-len(needle) :]
    except OSError:
        return False
    return False


VISION_KEYS = ("vision_config", "vision_tower", "mm_vision_tower", "visual")


def capabilities(
    path: Path, config: dict, template: ChatTemplate | None, tokenizer_config: Any
) -> list[str]:
    caps = []
    if template:
        caps.append("chat")
        if "tools" in template.text:
            caps.append("tools")
    if _mentions_think(path, template, tokenizer_config):
        caps.append("thinking")
    if any(key in config for key in VISION_KEYS):
        caps.append("vision")
    return caps


# --- one model's summary ----------------------------------------------------------


@dataclass
class ModelSummary:
    id: str
    source: str
    path: str
    size_bytes: int | None  # on disk, symlinks followed; None: not built yet
    parameters: int | None
    weights_bytes: int | None
    architecture: str | None
    dtype: str | None
    quantization: dict | None
    capabilities: list[str] = field(default_factory=list)
    context_length: int | None = None
    resident: bool = False
    note: str | None = None

    @property
    def quantized(self) -> bool:
        return self.quantization is not None

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "quantized": self.quantized}


def safetensors_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.name.endswith(".safetensors"))


def read_weights(path: Path, config: dict) -> Weights:
    files = safetensors_files(path)
    if not files:
        raise InvalidModelError(f"{path} has no *.safetensors weights")
    _check_shards(path, files)
    tensors: dict[str, dict[str, Any]] = {}
    for file in files:
        tensors.update(read_safetensors_header(file))
    return count_weights(tensors, _quantization_config(config))


def _check_shards(path: Path, files: list[Path]) -> None:
    index = _read_json(path / "model.safetensors.index.json")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if isinstance(weight_map, dict):
        missing = sorted(set(map(str, weight_map.values())) - {f.name for f in files})
        if missing:
            raise InvalidModelError(f"missing weight shard {missing[0]} (incomplete download?)")


def disk_usage(path: Path, follow_symlinks: bool = True) -> int:
    """Bytes in the files under `path`, each file counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.stat(os.path.join(root, name), follow_symlinks=follow_symlinks)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) not in seen:
                seen.add((st.st_dev, st.st_ino))
                total += st.st_size
    return total


def summarize(ref: ModelRef) -> ModelSummary:
    """Everything `models list` shows about one model; raises InvalidModelError."""
    return _read_model(ref)[0]


def _read_model(ref: ModelRef) -> tuple[ModelSummary, dict, ChatTemplate | None]:
    path = ref.path
    config = catalog.read_model_config(path)
    _check_links(path)
    weights = read_weights(path, config)
    tokenizer_config = _read_json(path / "tokenizer_config.json")
    template = chat_template(path, tokenizer_config)
    summary = ModelSummary(
        id=ref.id,
        source=ref.source,
        path=str(path),
        size_bytes=disk_usage(path),
        parameters=weights.parameters,
        weights_bytes=weights.bytes,
        architecture=config.get("model_type"),
        dtype=dtype_of(config),
        quantization=quantization_of(config) or ({"bits": None} if weights.packed else None),
        capabilities=capabilities(path, config, template, tokenizer_config),
        context_length=text_config(config).get("max_position_embeddings"),
        note="random weights, for trying mlxbun offline" if ref.is_demo else None,
    )
    return summary, config, template


def _check_links(path: Path) -> None:
    for entry in path.iterdir():
        if entry.is_symlink() and not entry.exists():
            raise InvalidModelError(f"{entry.name} is a broken link (incomplete download?)")


# --- the listing, with its index --------------------------------------------------


def index_file() -> Path:
    return paths.cache_dir() / "model-index.json"


def _fingerprint(path: Path) -> str:
    """Names, sizes and mtimes of a model directory's files: what its summary depends on."""
    parts = []
    with os.scandir(path) as entries:
        for entry in entries:
            try:
                st = entry.stat()
                parts.append(f"{entry.name}:{st.st_size}:{st.st_mtime_ns}")
            except OSError:
                parts.append(f"{entry.name}:broken")
    return "|".join(sorted(parts))


class _Index:
    """model dir -> (fingerprint, summary or error); rewritten only when it changed."""

    def __init__(self) -> None:
        try:
            data = json.loads(index_file().read_text(encoding="utf-8"))
            ok = data.get("version") == INDEX_VERSION and isinstance(data.get("entries"), dict)
            self.old: dict[str, dict] = data["entries"] if ok else {}
        except (OSError, ValueError, AttributeError):
            self.old = {}
        self.new: dict[str, dict] = {}

    def summary(self, ref: ModelRef) -> ModelSummary:
        key = str(ref.path)
        fingerprint = _fingerprint(ref.path)
        entry = self.old.get(key)
        if not (isinstance(entry, dict) and entry.get("fp") == fingerprint):
            try:
                entry = {"fp": fingerprint, "summary": asdict(summarize(ref))}
            except InvalidModelError as exc:
                entry = {"fp": fingerprint, "error": exc.message}
        self.new[key] = entry
        if "error" in entry:
            raise InvalidModelError(entry["error"])
        return ModelSummary(**{**entry["summary"], "id": ref.id, "source": ref.source})

    def save(self) -> None:
        if self.new == self.old:
            return
        path = index_file()
        try:
            paths.ensure(path.parent)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"version": INDEX_VERSION, "entries": self.new}), "utf-8")
            tmp.replace(path)
        except OSError:
            pass  # only a cache


@dataclass
class Listing:
    models: list[ModelSummary]
    skipped: list[Skipped]
    daemon_url: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "models": [m.as_dict() for m in self.models],
            "skipped": [
                {"id": s.id, "path": str(s.path), "reason": s.reason} for s in self.skipped
            ],
            "daemon": self.daemon_url,
        }


def list_models(
    *, quantized: bool = False, max_size: int | None = None, residency: bool = True
) -> Listing:
    """Every local model with what its files say; unreadable ones go to `skipped`."""
    scan = catalog.scan()
    index = _Index()
    models: list[ModelSummary] = []
    skipped = list(scan.skipped)
    for ref in scan.refs:
        if ref.is_demo and not (ref.path / "model.safetensors").is_file():
            models.append(_unbuilt_demo(ref))
            continue
        try:
            models.append(index.summary(ref))
        except (InvalidModelError, OSError) as exc:
            reason = exc.message if isinstance(exc, InvalidModelError) else str(exc)
            skipped.append(Skipped(ref.id, ref.path, reason))
    index.save()
    resident = daemon_residency() if residency else Residency()
    for model in models:
        model.resident = resident.has(model.id, Path(model.path))
    if quantized:
        models = [m for m in models if m.quantized]
    if max_size is not None:
        models = [m for m in models if m.size_bytes is None or m.size_bytes <= max_size]
    return Listing(models, skipped, resident.daemon.url if resident.daemon else None)


def _unbuilt_demo(ref: ModelRef) -> ModelSummary:
    return ModelSummary(
        id=ref.id,
        source=ref.source,
        path=str(ref.path),
        size_bytes=None,
        parameters=None,
        weights_bytes=None,
        architecture=None,
        dtype=None,
        quantization=None,
        note="built on first use",
    )


# --- the daemon's resident models ------------------------------------------------


@dataclass(frozen=True)
class Residency:
    daemon: DaemonInfo | None = None
    resident: frozenset[str] = frozenset()
    reachable: bool = False

    def has(self, model_id: str, path: Path | None = None) -> bool:
        names = {model_id} | ({str(path), str(path.resolve())} if path else set())
        return bool(names & self.resident)


def daemon_residency(timeout: float = 1.0) -> Residency:
    """Which models the running daemon holds in memory (`GET /v1/models`)."""
    from mlxbun_cli.client.daemon import read_state

    info = read_state()
    if info is None:
        return Residency()
    import httpx

    headers = {}
    if info.api_key_set:
        from mlxbun_cli.config import Settings

        key = Settings().api_key
        headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        response = httpx.get(f"{info.url}/v1/models", headers=headers, timeout=timeout)
        data = response.json()["data"]
        ids = frozenset(str(m["id"]) for m in data if m.get("resident"))
    except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
        return Residency(info)
    return Residency(info, ids, reachable=True)


# --- show -------------------------------------------------------------------------

CONFIG_KEYS = (
    "model_type",
    "architectures",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "max_position_embeddings",
    "rope_theta",
    "sliding_window",
    "tie_word_embeddings",
    "torch_dtype",
)


@dataclass(frozen=True)
class MemoryEstimate:
    ctx: int
    weights_bytes: int
    kv_bytes_per_token: int | None  # None: the config does not say enough
    kv_bytes: int | None
    total_bytes: int
    formula: str


def kv_bytes_per_token(config: dict) -> tuple[int, str] | None:
    """2 (K and V) x layers x kv heads x head dim x bytes per element."""
    conf = text_config(config)
    layers = conf.get("num_hidden_layers")
    heads = conf.get("num_attention_heads")
    kv_heads = conf.get("num_key_value_heads") or heads
    head_dim = conf.get("head_dim")
    if not head_dim and conf.get("hidden_size") and heads:
        head_dim = conf["hidden_size"] // heads
    if not all(isinstance(v, int) and v > 0 for v in (layers, kv_heads, head_dim)):
        return None
    element = TORCH_DTYPE_BYTES.get(dtype_of(config) or "", 2)
    formula = f"2 x {layers} layers x {kv_heads} kv heads x {head_dim} head dim x {element} B"
    return 2 * layers * kv_heads * head_dim * element, formula


def memory_estimate(config: dict, weights_bytes: int, ctx: int) -> MemoryEstimate:
    if ctx <= 0:
        raise OptionError("--ctx", f"must be a positive number of tokens, got {ctx}")
    kv = kv_bytes_per_token(config)
    if kv is None:
        return MemoryEstimate(ctx, weights_bytes, None, None, weights_bytes, "unknown KV shape")
    per_token, formula = kv
    return MemoryEstimate(
        ctx, weights_bytes, per_token, per_token * ctx, weights_bytes + per_token * ctx, formula
    )


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int | None  # None: a broken link


@dataclass
class ModelDetails:
    summary: ModelSummary
    config: dict[str, Any]
    chat_template_source: str | None
    chat_template_lines: int
    chat_template_head: list[str]
    generation: dict[str, Any]
    files: list[FileEntry]
    memory: MemoryEstimate

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["summary"] = self.summary.as_dict()
        return data


def list_files(path: Path) -> list[FileEntry]:
    out = []
    for file in sorted(p for p in path.rglob("*") if p.is_file() or p.is_symlink()):
        try:
            size: int | None = file.stat().st_size
        except OSError:
            size = None
        out.append(FileEntry(file.relative_to(path).as_posix(), size))
    return out


def show_model(name: str, ctx: int = 8192) -> ModelDetails:
    """All `models show` says about one model; unreadable pieces raise, naming the file."""
    ref = catalog.resolve(name)
    summary, config, template = _read_model(ref)
    summary.resident = daemon_residency().has(ref.id, ref.path)
    conf = text_config(config)
    lines = template.text.splitlines() if template else []
    generation = _read_json(ref.path / "generation_config.json")
    return ModelDetails(
        summary=summary,
        config={k: conf[k] for k in CONFIG_KEYS if k in conf}
        | ({"quantization": summary.quantization} if summary.quantization else {}),
        chat_template_source=template.source if template else None,
        chat_template_lines=len(lines),
        chat_template_head=lines[:TEMPLATE_HEAD_LINES],
        generation={k: v for k, v in (generation or {}).items() if k != "transformers_version"},
        files=list_files(ref.path),
        memory=memory_estimate(config, summary.weights_bytes or 0, ctx),
    )


# --- rm -----------------------------------------------------------------------------


@dataclass(frozen=True)
class RemovalPlan:
    ref: ModelRef
    action: str  # "delete" or "unregister"
    targets: tuple[Path, ...]
    bytes: int  # freed on disk

    @property
    def anything(self) -> bool:
        return self.action == "unregister" or any(t.exists() for t in self.targets)


def plan_removal(name: str) -> RemovalPlan:
    """What `models rm NAME` would do; refuses a model the daemon holds."""
    ref = catalog.find(name)
    residency = daemon_residency()
    started_with = residency.daemon.model if residency.daemon else None
    holds = residency.has(ref.id, ref.path) or (
        not residency.reachable and started_with in (ref.id, str(ref.path))
    )
    if holds and residency.daemon:
        raise InputError(
            f"the running daemon (pid {residency.daemon.pid}, {residency.daemon.url}) has "
            f"{ref.id} in memory; not removing it",
            hint="stop it first with `mlxbun daemon stop`, or serve another model",
        )
    if ref.source == "registered":
        return RemovalPlan(ref, "unregister", (ref.path,), 0)
    targets = catalog.removal_targets(ref)
    freed = sum(disk_usage(t, follow_symlinks=False) for t in targets if t.is_dir())
    return RemovalPlan(ref, "delete", targets, freed)
