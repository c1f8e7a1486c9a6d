"""``hfadapt cache info`` and ``hfadapt cache clear``: hfadapt's two persistent caches, the
simulated device's compile cache (hfadapt.spyre.compile.cache) and the CPU reference cache
(hfadapt.judge.reference_cache): where each is, how many entries and bytes it holds (and the
temporary files killed writers left, hfadapt.disk_cache), and emptying them; beside them, the
device's C kernels (hfadapt.spyre.numerics.dl16_native): whether this process uses them and AMX's tiles,
or why not, and clearing the records of failed builds so that the next use builds again. Thin:
the library does the work."""

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


_NATIVE = "hfadapt.spyre.numerics.dl16_native"
# what each state of the C kernels and of AMX's tiles reads as
_KERNELS = {
    "built": "built, in use",
    "failed": "not built: the build failed",
    "no compiler": "not built",
    "load failed": "built, but not loadable",
    "disabled": "off (HFADAPT_NATIVE_DL16=0)",
}
_AMX = {
    "available": "in use",
    "unavailable": "not on this CPU (or not granted by the kernel)",
    "no kernels": "unused (no C kernels)",
    "disabled": "off (HFADAPT_NATIVE_AMX=0)",
}


def _native_line(item: dict[str, Any]) -> str:
    """The C kernels' line of ``cache info``: their state, where, and why not."""
    where = item["library"] or item["path"]
    line = f"native kernels {escape(where)}: {_KERNELS.get(item['kernels'], item['kernels'])}"
    if item["message"] and item["kernels"] != "disabled":
        line += f" ({escape(item['message'])})"
    if item["record"]:
        line += (
            f"; the compiler's message is in {escape(item['record'])} (hfadapt cache clear "
            "tries again)"
        )
    return f"{line}; AMX tiles: {_AMX.get(item['amx'], item['amx'])}"


@cache_app.command("info")
def info(as_json: JsonOption = False) -> None:
    """Where each cache is, its entries and size, and its bound; whether the device's C
    kernels and AMX's tiles are in use (the kernels are built if they are not yet)."""
    data = {name: _module(module).cache_info() for name, _, module in _CACHES}
    data["native"] = _module(_NATIVE).native_status().as_dict()
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
    console.print(_native_line(data["native"]), highlight=False, soft_wrap=True)


@cache_app.command("clear")
def clear() -> None:
    """Remove every entry of both caches (the next runs fill them again), the temporary
    files of unfinished writes, and the records of failed C kernel builds (the next use builds
    again)."""
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
    native = _module(_NATIVE)
    records = native.clear_failure_records()
    console.print(
        f"removed {records} failed-build records of the C kernels from {escape(str(native.cache_dir()))}",
        highlight=False,
        soft_wrap=True,
    )
