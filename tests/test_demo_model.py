"""The random-weight demo model: it loads, generates, and its tokenizer behaves like Qwen3's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxbun_cli.demo_model import SIZES, build_demo_model, is_demo_model

FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_model(tmp_path_factory.mktemp("demo") / "demo-model", size="tiny", seed=0)


@pytest.fixture(scope="module")
def loaded(demo_dir: Path):
    from mlx_lm import load

    return load(str(demo_dir))


def test_files_and_marker(demo_dir: Path, tmp_path: Path) -> None:
    assert sorted(p.name for p in demo_dir.iterdir()) == sorted(FILES)
    assert is_demo_model(demo_dir)
    assert is_demo_model(demo_dir / "config.json")
    assert not is_demo_model(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "qwen3"}')
    assert not is_demo_model(tmp_path)
    (tmp_path / "config.json").write_text("not json")
    assert not is_demo_model(tmp_path)

    config = json.loads((demo_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3"
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["mlxbun_demo"] is True
    assert "random" in config["mlxbun_note"].lower()
    assert config["vocab_size"] == SIZES["tiny"]["vocab_size"]


def test_unknown_size(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown demo model size"):
        build_demo_model(tmp_path / "x", size="huge")
    assert not (tmp_path / "x").exists()


def test_load_and_generate(loaded, demo_dir: Path) -> None:
    from mlx_lm import generate, stream_generate

    model, tokenizer = loaded
    assert len(tokenizer) == SIZES["tiny"]["vocab_size"]
    text = generate(model, tokenizer, "Hello there", max_tokens=10)
    assert isinstance(text, str)
    steps = list(stream_generate(model, tokenizer, "Hello there", max_tokens=10))
    assert 1 <= len(steps) <= 10
    assert all(0 <= s.token < SIZES["tiny"]["vocab_size"] for s in steps)


def test_special_tokens_and_eos(loaded, demo_dir: Path) -> None:
    _, tokenizer = loaded
    vocab = tokenizer.get_vocab()
    for token in (
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
    ):
        assert token in vocab
        assert tokenizer.encode(token, add_special_tokens=False) == [vocab[token]]

    im_end, eot = vocab["<|im_end|>"], vocab["<|endoftext|>"]
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.bos_token is None
    assert tokenizer.eos_token_ids == {im_end, eot}
    gen = json.loads((demo_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [im_end, eot]
    assert (gen["temperature"], gen["top_p"], gen["top_k"]) == (0.6, 0.95, 20)


def test_roundtrip(loaded) -> None:
    _, tokenizer = loaded
    text = 'Hello, wörld!  Tabs\tand\nnewlines, 日本語 🙂 {"a": [1, 2.5]} <think>x</think>'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text

    detok = tokenizer.detokenizer
    for i in ids:
        detok.add_token(i)
    detok.finalize()
    assert detok.text == text


def test_thinking_and_tool_detection(loaded) -> None:
    _, tokenizer = loaded
    assert tokenizer.has_thinking
    assert (tokenizer.think_start, tokenizer.think_end) == ("<think>", "</think>")
    assert tokenizer.think_start_id == tokenizer.get_vocab()["<think>"]
    assert tokenizer.has_tool_calling
    assert (tokenizer.tool_call_start, tokenizer.tool_call_end) == ("<tool_call>", "</tool_call>")
    assert tokenizer.init_kwargs["tool_parser_type"] == "json_tools"
    call = tokenizer.tool_parser('\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n')
    assert call == {"name": "get_weather", "arguments": {"city": "Oslo"}}


def test_chat_template_tools_no_thinking(loaded) -> None:
    _, tokenizer = loaded
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "Weather in Oslo?"},
    ]
    text = tokenizer.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, enable_thinking=False, tokenize=False
    )
    assert text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    assert "<tools>\n" in text and "\n</tools>" in text
    assert '"name": "get_weather"' in text
    assert '<tool_call>\n{"name": <function-name>' in text
    assert "<|im_start|>user\nWeather in Oslo?<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")

    # Thinking is on by default: the wrapper passes enable_thinking=True.
    default = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert default == "<|im_start|>system\nYou are terse.<|im_end|>\n" + (
        "<|im_start|>user\nWeather in Oslo?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    assert tokenizer.decode(ids) == default


def test_chat_template_tool_round_trip(loaded) -> None:
    _, tokenizer = loaded
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Need the tool.",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}],
        },
        {"role": "tool", "content": '{"temp": 3}'},
    ]
    text = tokenizer.apply_chat_template(
        messages, tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    assert (
        "<|im_start|>assistant\n<think>\nNeed the tool.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
        "<|im_end|>\n"
    ) in text
    assert '<|im_start|>user\n<tool_response>\n{"temp": 3}\n</tool_response><|im_end|>\n' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_auto_tokenizer_loads(demo_dir: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_dir))
    assert len(tok) == SIZES["tiny"]["vocab_size"]
    assert tok.decode(tok.encode("a ,b  c")) == "a ,b  c"


def test_deterministic(demo_dir: Path, tmp_path: Path) -> None:
    again = build_demo_model(tmp_path / "again", size="tiny", seed=0)
    for name in FILES:
        assert (again / name).read_bytes() == (demo_dir / name).read_bytes(), name
    other = build_demo_model(tmp_path / "other", size="tiny", seed=1)
    assert (other / "model.safetensors").read_bytes() != (
        demo_dir / "model.safetensors"
    ).read_bytes()
    assert (other / "tokenizer.json").read_bytes() == (demo_dir / "tokenizer.json").read_bytes()
    # Rebuilding over an existing model replaces its files and leaves no temp dirs.
    build_demo_model(other, size="tiny", seed=0)
    assert (other / "model.safetensors").read_bytes() == (
        demo_dir / "model.safetensors"
    ).read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "other"]
