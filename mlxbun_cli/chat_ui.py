"""The terminal side of `mlxbun chat`: prompt, live markdown, Ctrl-C handling."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from mlxbun_cli import paths, ui
from mlxbun_cli.chat_session import ChatSession
from mlxbun_cli.client.backend import Backend
from mlxbun_cli.client.results import Collected
from mlxbun_cli.errors import GenerationError, MlxbunError
from mlxbun_cli.prep.events import ReasoningDelta, TextDelta, ToolCallEvent


def run_piped(backend: Backend, session: ChatSession, stdin: TextIO) -> None:
    """Non-tty: one reply per input line, plain text, no decoration."""
    for line in stdin:
        text = line.rstrip("\n")
        if not text.strip():
            continue
        if text.startswith("/"):
            try:
                result = session.handle(text)
            except MlxbunError as exc:  # a bad command costs its line, not the chat
                ui.print_error(exc.message, exc.hint)
                continue
            if result.message:
                ui.note(result.message)
            if result.exit:
                return
            continue
        collected = Collected()
        stream = backend.stream(session.request_for(text))
        for event in stream:
            collected.add(event)
            if isinstance(event, TextDelta):
                sys.stdout.write(event.text)
                sys.stdout.flush()
        sys.stdout.write("\n")
        sys.stdout.flush()
        for warning in session.new_warnings(stream.warnings):
            ui.warn(warning)
        _raise_if_failed(collected)
        session.record(text, collected)


def _raise_if_failed(collected: Collected) -> None:
    if collected.done is not None and collected.done.finish_reason == "error":
        raise GenerationError(collected.done.error or "generation failed")


def _prompt_session() -> Any:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory

    history = paths.history_file()
    paths.ensure(history.parent)
    return PromptSession(history=FileHistory(str(history)))


def _read_input(prompt: Any) -> str:
    """One user turn: `\\` continues a line; triple quotes open a block."""
    line = prompt.prompt(">>> ")
    if line.strip().startswith('"""'):
        lines = [line.strip()[3:]]
        while not lines[-1].rstrip().endswith('"""'):
            lines.append(prompt.prompt("... "))
        lines[-1] = lines[-1].rstrip()[:-3]
        return "\n".join(lines).strip()
    lines = [line]
    while lines[-1].endswith("\\"):
        lines[-1] = lines[-1][:-1]
        lines.append(prompt.prompt("... "))
    return "\n".join(lines)


def _render(reasoning: str, answer: str, show_thinking: bool, done: bool) -> Any:
    from rich.console import Group
    from rich.markdown import Markdown
    from rich.text import Text

    parts: list[Any] = []
    if reasoning.strip():
        if show_thinking:
            parts.append(Text(reasoning.strip(), style="thinking"))
        else:
            words = len(reasoning.split())
            state = "thought" if done or answer else "thinking"
            parts.append(Text(f"({state}: {words} words — /thoughts on to show)", style="muted"))
    if answer:
        parts.append(Markdown(answer))
    return Group(*parts)


def reply_interactive(backend: Backend, session: ChatSession, text: str) -> None:
    from rich.live import Live

    console = ui.console()
    collected = Collected()
    stream = backend.stream(session.request_for(text))
    interrupted = False
    with Live(console=console, refresh_per_second=15, transient=False) as live:
        try:
            for event in stream:
                collected.add(event)
                if isinstance(event, (TextDelta, ReasoningDelta)):
                    live.update(
                        _render(collected.reasoning, collected.text, session.show_thinking, False)
                    )
                elif isinstance(event, ToolCallEvent):
                    live.update(
                        _render(collected.reasoning, collected.text, session.show_thinking, False)
                    )
        except KeyboardInterrupt:
            interrupted = True
            stream.cancel()
            for event in stream:  # drain to the final event so usage is known
                collected.add(event)
        live.update(_render(collected.reasoning, collected.text, session.show_thinking, True))
    for warning in session.new_warnings(stream.warnings):
        ui.warn(warning)
    for call in collected.tool_calls:
        from rich.panel import Panel

        fn = call["function"]
        console.print(
            Panel(fn["arguments"], title=f"tool call: {fn['name']}", border_style="accent")
        )
    _raise_if_failed(collected)
    session.record(text, collected)
    done = collected.done
    if done is not None:
        u = done.usage
        note = "stopped · " if interrupted else ""
        console.print(
            f"[muted]{note}{u.completion_tokens} tokens · {u.generation_tps:.1f} tok/s · "
            f"prompt {u.prompt_tokens} tokens[/muted]"
        )


def run_interactive(backend: Backend, session: ChatSession) -> None:
    console = ui.console()
    console.print("[muted]/help for commands, Ctrl-D or /exit to leave[/muted]")
    prompt = _prompt_session()
    while True:
        try:
            text = _read_input(prompt)
        except KeyboardInterrupt:
            continue  # Ctrl-C at the prompt clears the line
        except EOFError:
            console.print()
            return
        if not text.strip():
            continue
        try:
            if text.startswith("/"):
                result = session.handle(text)
                if result.message:
                    console.print(f"[muted]{ui.escape(result.message)}[/muted]")
                if result.exit:
                    return
                continue
            reply_interactive(backend, session, text)
        except MlxbunError as exc:  # one bad turn does not end the chat
            ui.print_error(exc.message, exc.hint)
