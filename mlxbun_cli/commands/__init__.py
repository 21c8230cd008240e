"""Thin Typer commands: parse options, call one service, render through ui."""
