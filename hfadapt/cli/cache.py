"""``hfadapt cache info`` and ``hfadapt cache clear``: hfadapt's two persistent caches, the
simulated device's compile cache (hfadapt.spyre.compile.cache) and the CPU reference cache
(hfadapt.judge.reference_cache): where each is, how many entries and bytes it holds (and the
temporary files killed writers left, hfadapt.disk_cache), and emptying them. Thin: the library
does the work."""

from __future__ import annotations

import json
from typing import Any

import typer
from rich.markup import escape

from hfadapt.cli._app import JsonOption, app, console

cache_app = typer.Typer(
    help="The compile and reference caches: what they hold, and emptying them.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(cache_app, name="cache")

# (name, the variable that turns it off, its module)
_CACHES = (
    ("compile", "HFADAPT_COMPILE_CACHE", "hfadapt.spyre.compile.cache"),
    ("reference", "HFADAPT_REFERENCE_CACHE", "hfadapt.judge.reference_cache"),
)


def _module(path: str) -> Any:
    import importlib

    return importlib.import_module(path)


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


@cache_app.command("info")
def info(as_json: JsonOption = False) -> None:
    """Where each cache is, its entries and size, and its bound."""
    data = {name: _module(module).cache_info() for name, _, module in _CACHES}
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    for name, variable, _ in _CACHES:
        item = data[name]
        state = "on" if item["enabled"] else f"off ({variable}=0)"
        left = ""
        if item["leftovers"]:
            left = (
                f"; {item['leftovers']} unfinished writes ({_size(item['leftover_bytes'])}, "
                "removed once an hour old)"
            )
        console.print(
            f"{name} cache {escape(item['path'])}: {item['entries']} entries, "
            f"{_size(item['bytes'])} of {_size(item['max_bytes'])}; {state}{left}",
            highlight=False,
            soft_wrap=True,
        )


@cache_app.command("clear")
def clear() -> None:
    """Remove every entry of both caches (the next runs fill them again), and the temporary
    files of unfinished writes."""
    for name, _, module in _CACHES:
        found = _module(module)
        removed, leftovers = found.clear()
        where = escape(str(found.directory()))
        also = f" and {leftovers} unfinished writes" if leftovers else ""
        console.print(
            f"removed {removed} entries from the {name} cache {where}{also}",
            highlight=False,
            soft_wrap=True,
        )
