"""Chat-template rendering with BOS de-duplication and the open-think probe."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxbun_cli.errors import InputError, OptionError


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    tokens: list[int]
    start_in_thinking: bool  # the template ended the prompt inside <think>


def normalize_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Text-only content parts joined; tool-call arguments as objects for templates."""
    import json

    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise OptionError(f"messages[{index}]", "each message needs a string role")
        msg = dict(message)
        content = msg.get("content")
        if isinstance(content, list):
            parts = []
            for part in content:
                if isinstance(part, dict) and part.get("type") in (
                    "text",
                    "input_text",
                    "output_text",
                ):
                    parts.append(str(part.get("text", "")))
                elif isinstance(part, dict) and part.get("type") in (
                    "image_url",
                    "input_image",
                    "image",
                ):
                    raise OptionError(
                        f"messages[{index}].content",
                        "this model is text-only: images are not supported",
                    )
                else:
                    raise OptionError(
                        f"messages[{index}].content", f"unsupported content part {part!r:.60}"
                    )
            msg["content"] = "".join(parts)
        elif content is None:
            msg["content"] = ""
        elif not isinstance(content, str):
            raise OptionError(f"messages[{index}].content", "must be a string or a list of parts")
        calls = []
        for call in msg.get("tool_calls") or []:
            fn = dict(call.get("function", call))
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"] or "{}")
                except ValueError:
                    pass  # leave unparseable arguments as text
            calls.append({**call, "function": fn})
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def _templated(tokenizer: Any) -> Any:
    """The HF tokenizer under mlx-lm's wrapper, if it has a chat template; else None.

    Not the wrapper itself: it forces an enable_thinking value, and "no value"
    must mean the template's own default.
    """
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    return hf if getattr(hf, "chat_template", None) else None


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    enable_thinking: bool | None = None,
    extra_kwargs: dict[str, Any] | None = None,
    think_start: str | None = "<think>",
    think_end: str | None = "</think>",
) -> RenderedPrompt:
    hf = _templated(tokenizer)
    if hf is None:
        raise InputError("this model has no chat template", hint="use a raw prompt (--raw)")
    kwargs = {k: v for k, v in (extra_kwargs or {}).items() if k != "enable_thinking"}
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    try:
        text = hf.apply_chat_template(
            normalize_messages(messages),
            tools=tools or None,
            add_generation_prompt=_needs_generation_prompt(messages),
            continue_final_message=not _needs_generation_prompt(messages),
            tokenize=False,
            **kwargs,
        )
    except OptionError:
        raise
    except Exception as exc:  # a template that raises is the request's fault
        raise OptionError("messages", f"the chat template rejected them: {exc}") from exc
    tokens = encode_prompt(tokenizer, text)
    return RenderedPrompt(text, tokens, _ends_in_open_think(text, think_start, think_end))


def warm_up(tokenizer: Any) -> None:
    """Compile the chat template now (tens of ms), not in the first request.

    transformers caches the compiled template, but many threads rendering at
    once (a batch starting) would each compile it before the cache fills.
    """
    hf = _templated(tokenizer)
    if hf is None:
        return
    try:
        hf.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
        )
    except Exception:  # a template that needs more than this: the first request compiles it
        pass


def _needs_generation_prompt(messages: list[dict[str, Any]]) -> bool:
    # A final assistant message is a prefill to continue, not a finished turn.
    return not (messages and messages[-1].get("role") == "assistant")


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Encode, dropping the duplicate BOS a template plus a tokenizer can make."""
    # Lone surrogates (valid JSON escapes, invalid text) become U+FFFD.
    text = text.encode("utf-8", "replace").decode("utf-8")
    try:
        ids = list(tokenizer.encode(text))
    except Exception as exc:  # a tokenizer that rejects the text: the input's fault
        raise OptionError("prompt", f"could not be tokenized: {exc}") from exc
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and len(ids) > 1 and ids[0] == ids[1] == bos:
        ids = ids[1:]
    return ids


def _ends_in_open_think(text: str, start: str | None, end: str | None) -> bool:
    if not start or not end:
        return False
    last_open = text.rfind(start)
    return last_open != -1 and text.rfind(end) < last_open
