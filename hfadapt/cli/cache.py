"""``hfadapt cache info`` and ``hfadapt cache clear``: the persistent compile cache of the
simulated device (hfadapt.spyre.compile.cache): where it is, how many entries and bytes it
holds, and emptying it. Thin: the library does the work."""

from __future__ import annotations

import json

import typer
from rich.markup import escape

from hfadapt.cli._app import JsonOption, app, console

cache_app = typer.Typer(
    help="The compile cache: what it holds, and emptying it.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(cache_app, name="cache")


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


@cache_app.command("info")
def info(as_json: JsonOption = False) -> None:
    """Where the compile cache is, its entries and size, and its bound."""
    from hfadapt.spyre.compile.cache import cache_info

    data = cache_info()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    state = "on" if data["enabled"] else "off (HFADAPT_COMPILE_CACHE=0)"
    console.print(
        f"compile cache {escape(data['path'])}: {data['entries']} entries, "
        f"{_size(data['bytes'])} of {_size(data['max_bytes'])}; {state}",
        highlight=False,
        soft_wrap=True,
    )


@cache_app.command("clear")
def clear() -> None:
    """Remove every entry of the compile cache (the next compiles fill it again)."""
    from hfadapt.spyre.compile.cache import cache_info
    from hfadapt.spyre.compile.cache import clear as clear_cache

    removed = clear_cache()
    console.print(f"removed {removed} entries from {escape(cache_info()['path'])}", highlight=False)
