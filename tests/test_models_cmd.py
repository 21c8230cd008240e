"""`mlxbun models`: list, show, rm, add/forget, and pull against a stand-in Hub.

Fake models are real on disk: a hub cache laid out as huggingface_hub lays it out
(`models--org--name/{blobs,refs,snapshots}`, snapshot files symlinked to blobs),
with safetensors files whose headers are written by hand, so parameter counts
are known exactly. `pull` runs the real huggingface_hub client against a small
HTTP server on 127.0.0.1 speaking the part of the Hub API `snapshot_download`
uses.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import struct
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import REPO, run_cli
from hubstub import FakeHub

from mlxbun_cli import catalog, model_info, paths
from mlxbun_cli.errors import InputError, InvalidModelError, MlxbunError, OptionError

BYTES = {"F32": 4, "BF16": 2, "F16": 2, "U32": 4, "U8": 1}
TEMPLATE = (
    "{%- if tools %}{{ tools | tojson }}{%- endif %}\n"
    "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endfor %}\n"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n{%- endif %}\n"
)


def safetensors_bytes(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        size = math.prod(shape) * BYTES[dtype]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps({"__metadata__": {"format": "mlx"}, **header}).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def config(**extra) -> dict:
    return {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 100,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
        **extra,
    }


def model_files(cfg: dict, tensors: dict, template: str | None = TEMPLATE) -> dict[str, bytes]:
    files = {
        "config.json": json.dumps(cfg).encode(),
        "model.safetensors": safetensors_bytes(tensors),
        "generation_config.json": json.dumps({"temperature": 0.7, "top_p": 0.8}).encode(),
    }
    if template is not None:
        files["tokenizer_config.json"] = json.dumps({"chat_template": template}).encode()
    return files


DENSE = {  # 100*64 + 64 + 64*64 = 10560 parameters, bf16
    "model.embed_tokens.weight": ("BF16", [100, 64]),
    "model.norm.weight": ("BF16", [64]),
    "model.layers.0.self_attn.q_proj.weight": ("BF16", [64, 64]),
}
QUANT = {
    # 4-bit, group 64: 256 inputs pack into 32 words; 4 groups of scales and biases
    "model.layers.0.mlp.up_proj.weight": ("U32", [128, 32]),
    "model.layers.0.mlp.up_proj.scales": ("BF16", [128, 4]),
    "model.layers.0.mlp.up_proj.biases": ("BF16", [128, 4]),
    # this layer is 8-bit by a per-layer override, as mlx-lm writes them
    "model.layers.0.self_attn.q_proj.weight": ("U32", [64, 64]),
    "model.layers.0.self_attn.q_proj.scales": ("BF16", [64, 4]),
    "model.layers.0.self_attn.q_proj.biases": ("BF16", [64, 4]),
    "model.norm.weight": ("BF16", [64]),
}
QUANT_PARAMS = 128 * 256 + 64 * 256 + 64
QUANT_CONFIG = {
    "group_size": 64,
    "bits": 4,
    "model.layers.0.self_attn.q_proj": {"group_size": 64, "bits": 8},
}
REV = "a" * 40


def hf_repo(cache: Path, repo_id: str, files: dict[str, bytes], rev: str = REV) -> Path:
    """A repo in the hub cache exactly as huggingface_hub writes one."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / rev
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        link = snapshot / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(rev)
    return snapshot


@pytest.fixture
def hf_cache() -> Path:
    return catalog.hf_cache_dir()


@pytest.fixture
def fake_cache(hf_cache) -> Path:
    """Good, quantized, vision, and four kinds of broken entry."""
    hf_repo(hf_cache, "acme/dense", model_files(config(), DENSE))
    quant = config(quantization=QUANT_CONFIG, quantization_config=QUANT_CONFIG)
    hf_repo(hf_cache, "acme/quant-4bit", model_files(quant, QUANT, template="{{ messages }}"))
    vision = config(vision_config={"hidden_size": 32}, torch_dtype="float32")
    hf_repo(hf_cache, "acme/vision", model_files(vision, DENSE, template=None))
    bad_header = model_files(config(), DENSE)
    bad_header["model.safetensors"] = struct.pack("<Q", 20) + b"{not json at all!!!}" + bytes(8)
    hf_repo(hf_cache, "acme/bad-header", bad_header)
    broken = hf_repo(hf_cache, "acme/broken-link", model_files(config(), DENSE))
    os.unlink(
        broken.resolve().parent.parent / "blobs" / (broken / "model.safetensors").resolve().name
    )
    no_config = hf_repo(hf_cache, "acme/no-config", model_files(config(), DENSE))
    os.unlink((no_config / "config.json").resolve())
    hf_repo(hf_cache, "acme/corrupt-config", {**model_files(config(), DENSE), "config.json": b"{"})
    return hf_cache


# --- reading headers ---------------------------------------------------------------


def test_counts_quantized_parameters_from_headers(tmp_path):
    path = tmp_path / "q.safetensors"
    path.write_bytes(safetensors_bytes(QUANT))
    tensors = model_info.read_safetensors_header(path)
    weights = model_info.count_weights(tensors, QUANT_CONFIG)
    assert weights.parameters == QUANT_PARAMS
    assert weights.packed == 2
    assert weights.bytes == path.stat().st_size - 8 - struct.unpack("<Q", path.read_bytes()[:8])[0]
    # Without a config, bits come from the shapes (group size 64 assumed).
    assert model_info.count_weights(tensors, None).parameters == QUANT_PARAMS


def test_tiny_model_parameter_count_matches_mlx(tiny_loaded, tiny_model_dir):
    from mlx.utils import tree_flatten

    expected = sum(v.size for _, v in tree_flatten(tiny_loaded.model.parameters()))
    summary = model_info.summarize(catalog.ModelRef("tiny", tiny_model_dir, "path"))
    assert summary.parameters == expected
    assert summary.capabilities == ["chat", "tools", "thinking"]
    assert (summary.architecture, summary.dtype, summary.quantization) == ("qwen3", "float32", None)


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\x01\x02", "too short"),
        (struct.pack("<Q", 1 << 40) + b"{}", "does not fit"),
        (struct.pack("<Q", 4) + b"\xff\xfe{}", "not valid JSON"),
        (struct.pack("<Q", 2) + b"[]", "not a JSON object"),
        (safetensors_bytes({"w": ("F32", [4])})[:-4], "outside the file"),
        (struct.pack("<Q", 24) + b'{"w": {"dtype": "F32"}} ', "malformed entry"),
    ],
)
def test_malformed_safetensors_headers_are_named(tmp_path, data, message):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(InvalidModelError, match=message):
        model_info.read_safetensors_header(path)


# --- list ----------------------------------------------------------------------------


def test_list_reads_the_hub_cache_and_skips_what_it_cannot_read(fake_cache, tiny_model_dir):
    catalog.register(tiny_model_dir, "tiny")
    registry = json.loads(catalog.registry_file().read_text())
    registry["gone"] = str(tiny_model_dir.parent / "gone")  # registered, then deleted
    catalog.registry_file().write_text(json.dumps(registry))
    listing = model_info.list_models()
    by_id = {m.id: m for m in listing.models}
    assert list(by_id) == ["demo", "tiny", "acme/dense", "acme/quant-4bit", "acme/vision"]

    dense = by_id["acme/dense"]
    assert (dense.parameters, dense.architecture, dense.dtype) == (10560, "qwen3", "bfloat16")
    assert dense.weights_bytes == 10560 * 2 and dense.size_bytes > dense.weights_bytes
    assert dense.capabilities == ["chat", "tools", "thinking"] and not dense.quantized
    quant = by_id["acme/quant-4bit"]
    assert quant.parameters == QUANT_PARAMS and quant.capabilities == ["chat"]
    assert quant.quantization == {"bits": 4, "group_size": 64}
    assert by_id["acme/vision"].capabilities == ["vision"]
    assert by_id["demo"].note == "built on first use" and by_id["demo"].size_bytes is None
    assert by_id["tiny"].source == "registered" and not any(m.resident for m in listing.models)

    skipped = {s.id: s.reason for s in listing.skipped}
    assert set(skipped) == {
        "gone",
        "acme/bad-header",
        "acme/broken-link",
        "acme/no-config",
        "acme/corrupt-config",
    }
    assert "registered path has no config.json" in skipped["gone"]
    assert "header" in skipped["acme/bad-header"]
    assert "broken link" in skipped["acme/broken-link"]
    assert "config.json" in skipped["acme/no-config"]
    assert "JSON" in skipped["acme/corrupt-config"]


def test_list_index_is_reused_and_invalidated(fake_cache):
    model_info.list_models()
    index = json.loads(model_info.index_file().read_text())
    assert len(index["entries"]) == 6  # 3 good + 3 unreadable that got as far as a summary
    dense = fake_cache / "models--acme--dense" / "snapshots" / REV
    # A cached entry is served without reading the files again...
    entry = index["entries"][str(dense)]
    entry["summary"]["parameters"] = 42
    model_info.index_file().write_text(json.dumps(index))
    assert _by_id(model_info.list_models())["acme/dense"].parameters == 42
    # ...until a file changes.
    (dense / "generation_config.json").unlink()
    assert _by_id(model_info.list_models())["acme/dense"].parameters == 10560


def _by_id(listing):
    return {m.id: m for m in listing.models}


def test_list_filters(fake_cache):
    assert [m.id for m in model_info.list_models(quantized=True).models] == ["acme/quant-4bit"]
    small = model_info.list_models(max_size=30 << 10).models
    assert [m.id for m in small] == ["demo", "acme/dense", "acme/vision"]  # demo: not built


def test_list_cli_table_json_and_bad_size(fake_cache):
    proc = run_cli("models", "list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].split() == [
        "model",
        "arch",
        "params",
        "quant",
        "size",
        "capabilities",
        "resident",
    ]
    row = next(line for line in lines if line.startswith("acme/quant-4bit")).split()
    assert row[1:4] == ["qwen3", "49.2K", "4-bit"]
    assert "skipped 4 unreadable" in proc.stderr and "acme/broken-link" in proc.stderr
    assert "Traceback" not in proc.stderr

    proc = run_cli("models", "list", "--json", "--quantized", "--max-size", "1.5G")
    data = json.loads(proc.stdout)
    assert [m["id"] for m in data["models"]] == ["acme/quant-4bit"]
    assert data["models"][0]["quantized"] is True and len(data["skipped"]) == 4

    proc = run_cli("models", "list", "--max-size", "4XB")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --max-size: expected a size like 500MB or 4GB, got '4XB'"
    ]


# --- show ----------------------------------------------------------------------------


def test_show_details_and_memory_estimate(fake_cache):
    d = model_info.show_model("acme/dense", ctx=8192)
    assert d.summary.id == "acme/dense" and d.chat_template_source == "tokenizer_config.json"
    assert d.chat_template_head[0].startswith("{%- if tools %}") and d.chat_template_lines == 7
    assert d.generation == {"temperature": 0.7, "top_p": 0.8}
    assert {f.name for f in d.files} == {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer_config.json",
    }
    # 2 (K,V) x 4 layers x 2 kv heads x 16 head dim x 2 bytes (bf16)
    assert d.memory.kv_bytes_per_token == 2 * 4 * 2 * 16 * 2
    assert d.memory.total_bytes == 10560 * 2 + 512 * 8192
    assert model_info.show_model("vision", ctx=10).memory.kv_bytes_per_token == 1024  # float32
    json.dumps(d.as_dict())  # serialisable as is


def test_show_names_what_is_wrong(fake_cache):
    with pytest.raises(InvalidModelError, match="broken link"):
        model_info.show_model("acme/broken-link")
    with pytest.raises(OptionError, match="--ctx"):
        model_info.show_model("acme/dense", ctx=0)


def test_show_cli(fake_cache):
    proc = run_cli("models", "show", "quant-4bit", "--ctx", "100000")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "acme/quant-4bit" in out and "49.2K" in out and "4-bit g64" in out
    assert "KV per token" in out and "2 x 4 layers x 2 kv heads x 16 head dim x 2 B" in out
    assert "past the model's max_position_embeddings (32768)" in proc.stderr

    proc = run_cli("models", "show", "acme")
    assert proc.returncode == 2 and "ambiguous" in proc.stderr


# --- rm, add, forget ---------------------------------------------------------------


def test_rm_needs_yes_without_a_terminal(fake_cache):
    proc = run_cli("models", "rm", "acme/dense")
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: not removing acme/dense without confirmation: use --yes"
    assert (fake_cache / "models--acme--dense").is_dir()

    proc = run_cli("models", "rm", "acme/dense", "--yes")
    assert proc.returncode == 0, proc.stderr
    assert "deleted acme/dense" in proc.stderr
    assert not (fake_cache / "models--acme--dense").exists()
    with pytest.raises(MlxbunError, match="no local model matches"):
        catalog.resolve("acme/dense")


def test_rm_kinds(fake_cache, tiny_model_dir, tmp_path):
    # a registered directory is only unregistered
    catalog.register(tiny_model_dir, "tiny")
    plan = model_info.plan_removal("tiny")
    assert plan.action == "unregister"
    catalog.remove(plan.ref)
    assert (tiny_model_dir / "config.json").is_file()
    assert "tiny" not in [r.id for r in catalog.known_models()]
    # a data-dir model is deleted
    made = paths.models_dir() / "made-here"
    shutil.copytree(tiny_model_dir, made)
    plan = model_info.plan_removal("made-here")
    assert plan.action == "delete" and plan.bytes > 0
    catalog.remove(plan.ref)
    assert not made.exists()
    # an arbitrary directory is never deleted
    with pytest.raises(InputError, match="left alone"):
        model_info.plan_removal(str(tiny_model_dir))
    # the demo model's cache can be removed; unbuilt, there is nothing to do
    assert not model_info.plan_removal("demo").anything


def test_rm_asks_on_a_terminal(fake_cache):
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "mlxbun_cli", "models", "rm", "acme/vision"],
        cwd=str(REPO),
        env=dict(os.environ),
        encoding="utf-8",
        timeout=60,
    )
    child.expect(r"delete acme/vision: .*models--acme--vision \(\d+\.\d KB\)\? \[y/N\]")
    child.sendline("n")
    child.expect("nothing removed")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 1
    assert (fake_cache / "models--acme--vision").is_dir()


def test_add_and_forget(tiny_model_dir, tmp_path):
    ref = catalog.register(tiny_model_dir, "mine")
    assert catalog.resolve("mine") == ref
    assert catalog.register(tiny_model_dir, "mine") == ref  # again, same path: fine
    other = shutil.copytree(tiny_model_dir, tmp_path / "other")
    with pytest.raises(InputError, match="'mine' is already registered"):
        catalog.register(other, "mine")
    with pytest.raises(InputError, match="'demo' cannot name a model"):
        catalog.register(other, "demo")
    with pytest.raises(InvalidModelError, match="no config.json"):
        catalog.register(tmp_path)
    assert catalog.register(other).id == "other"
    assert catalog.unregister("mine") == ref
    with pytest.raises(InputError, match="no registered model named 'mine'"):
        catalog.unregister("mine")
    assert (tiny_model_dir / "config.json").is_file()


def test_resident_model_is_listed_and_not_removed(tiny_model_dir, hf_cache, isolated_home):
    """A real daemon in this test's home, serving a model from the hub cache."""
    from serverutil import start_server

    files = {p.name: p.read_bytes() for p in tiny_model_dir.iterdir()}
    hf_repo(hf_cache, "acme/served", files)
    srv = start_server("acme/served", isolated_home)
    try:
        deadline = time.time() + 60
        while not model_info.daemon_residency().has("acme/served") and time.time() < deadline:
            time.sleep(0.1)
        listing = model_info.list_models()
        assert _by_id(listing)["acme/served"].resident
        assert listing.daemon_url == srv.url
        with pytest.raises(InputError, match="has acme/served in memory"):
            model_info.plan_removal("acme/served")
    finally:
        assert srv.stop() == 0, srv.output()
    assert model_info.plan_removal("acme/served").action == "delete"


# --- pull, against a stand-in Hub ------------------------------------------------------


@pytest.fixture
def hub(tiny_model_dir, monkeypatch):
    files = {p.name: p.read_bytes() for p in tiny_model_dir.iterdir()}
    files |= {"pytorch_model.bin": b"torch", "onnx/model.onnx": b"onnx", "README.md": b"# tiny"}
    server = FakeHub({"acme/tiny": files, "acme/gated": files}, gated={"acme/gated"})
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    yield server
    server.shutdown()
    server.server_close()


def test_pull_downloads_what_a_model_needs(hub, tiny_model_dir):
    proc = run_cli("models", "pull", "acme/tiny", env={"HF_HUB_OFFLINE": "0"})
    assert proc.returncode == 0, proc.stderr
    snapshot = Path(proc.stdout.strip())
    assert snapshot.parent.name == "snapshots" and snapshot.name == hub.shas["acme/tiny"]
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(
        p.name for p in tiny_model_dir.iterdir()
    )
    fetched = {path.rsplit("/", 1)[-1] for method, path in hub.requests if method == "GET"}
    assert not fetched & {"pytorch_model.bin", "model.onnx", "README.md"}
    assert "pulled acme/tiny@main: 5 files" in proc.stderr and "Traceback" not in proc.stderr

    assert catalog.resolve("acme/tiny").path == snapshot
    assert catalog.resolve("tiny").id == "acme/tiny"
    assert _by_id(model_info.list_models())["acme/tiny"].capabilities == [
        "chat",
        "tools",
        "thinking",
    ]

    # Again: everything is cached, nothing is downloaded twice; offline, the cache answers.
    hub.requests.clear()
    proc = run_cli("models", "pull", "acme/tiny", env={"HF_HUB_OFFLINE": "0"})
    assert proc.returncode == 0, proc.stderr
    assert not [p for m, p in hub.requests if "/resolve/" in p and m == "GET"]
    hub.requests.clear()
    proc = run_cli("models", "pull", "acme/tiny")
    assert (proc.returncode, proc.stdout.strip(), hub.requests) == (0, str(snapshot), [])


@pytest.fixture
def online(monkeypatch):
    """huggingface_hub reads HF_HUB_OFFLINE once, at import: switch it for this test."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)


@pytest.mark.parametrize(
    "repo, revision, error, message",
    [
        ("acme/nope", None, InputError, "no repo acme/nope on http://127.0.0.1"),
        ("acme/gated", None, MlxbunError, "acme/gated is gated"),
        ("acme/tiny", "v9", InputError, "acme/tiny has no revision 'v9'"),
        ("not a repo", None, InputError, "is not a Hub repo id"),
    ],
)
def test_pull_errors_are_one_line(hub, online, repo, revision, error, message):
    from mlxbun_cli import hub as hub_mod

    with pytest.raises(error, match=message) as caught:
        hub_mod.pull(repo, revision)
    assert "\n" not in caught.value.message


def test_pull_offline_and_unreachable(hub, monkeypatch):
    from huggingface_hub import constants

    from mlxbun_cli import hub as hub_mod

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(MlxbunError, match="offline mode is on"):
        hub_mod.pull("acme/tiny")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    url = hub.url
    hub.shutdown()
    hub.server_close()
    monkeypatch.setenv("HF_ENDPOINT", url)
    with pytest.raises(MlxbunError, match=f"cannot reach the Hugging Face Hub at {url}"):
        hub_mod.pull("acme/tiny")
