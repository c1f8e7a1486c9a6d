"""The DL16 rounding's two paths on every float32 bit pattern: the C kernel
(``hfadapt_round_dl16``, hfadapt.spyre.numerics.dl16_native) and the torch ops (``dl16._round_inplace``)
must give the same bits for all 2^32 patterns (NaN for NaN: a NaN's payload may differ), in
device arithmetic and for a host value moved onto the device (``transfer``: +-inf lands on the
format's host infinity), with the profile's overflow (NaN, the card's 0x7FFF code) and with
+-inf instead. Prints the mismatches (count, first examples), the time and the rate; exit code 1
when any pattern differs, 3 when the C kernels are not built here.

    python benchmarks/check_dl16_exhaustive.py [--profile NAME] [--threads 2]
        [--range 0x3F800000:0x40000000] [--stride 1] [--chunk-bits 24] [--variants nan,inf]

The default is the full run: every pattern, the four variants (nan, nan-transfer, inf,
inf-transfer). ``--range START:END`` (END exclusive, decimal or 0x hex) and ``--stride N``
(every Nth pattern of the range) check a part when the whole takes too long."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time

import torch
from machine import report_machine

from hfadapt.spyre.numerics import dl16_native
from hfadapt.spyre.numerics.dl16 import DL16Format, _round_inplace, native_rounding_args
from hfadapt.spyre.rules.profile import load_profile

PATTERNS = 1 << 32
VARIANTS = ("nan", "nan-transfer", "inf", "inf-transfer")


@dataclasses.dataclass
class Tally:
    """One variant's outcome: patterns checked, mismatches, the first few, and NaN pairs whose
    bits differ (a match: NaN for NaN), and the seconds its two paths and the comparison took."""

    checked: int = 0
    mismatches: int = 0
    examples: list[str] = dataclasses.field(default_factory=list)
    nan_payloads: int = 0
    seconds: float = 0.0


def _range(text: str) -> tuple[int, int]:
    start, _, end = text.partition(":")
    lo, hi = int(start, 0), int(end, 0) if end else PATTERNS
    if not 0 <= lo < hi <= PATTERNS:
        raise argparse.ArgumentTypeError(f"--range {text}: need 0 <= START < END <= 2^32")
    return lo, hi


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--profile", default=None, help="device profile (default: the bundled)")
    parser.add_argument("--range", type=_range, default=(0, PATTERNS), dest="span")
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--chunk-bits", type=int, default=24, help="2^N patterns a chunk")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--examples", type=int, default=5)
    args = parser.parse_args()
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants:
        parser.error(f"--variants: unknown {unknown}; choose from {', '.join(VARIANTS)}")
    if args.stride < 1 or not 10 <= args.chunk_bits <= 28 or args.threads < 1:
        parser.error("--stride >= 1, --chunk-bits from 10 to 28, --threads >= 1")
    return args


def _formats(base: DL16Format, names: list[str]) -> list[tuple[str, DL16Format, bool]]:
    """(name, format, transfer) for each variant: the profile's format with NaN or +-inf as
    the overflow value."""
    out = []
    for name in names:
        overflow_nan = name.startswith("nan")
        fmt = dataclasses.replace(base, overflow_nan=overflow_nan)
        out.append((name, fmt, name.endswith("transfer")))
    return out


def _patterns(first: int, count: int, stride: int) -> torch.Tensor:
    """``count`` float32 values whose bits are first, first + stride, ... (as uint32)."""
    bits = torch.arange(count, dtype=torch.int64).mul_(stride).add_(first)
    bits.sub_(PATTERNS * (bits >= 1 << 31).to(torch.int64))  # uint32 -> int32, same bits
    return bits.to(torch.int32).view(torch.float32)


def _compare(
    x: torch.Tensor, native: torch.Tensor, ops: torch.Tensor, tally: Tally, keep: int
) -> None:
    a, b = native.view(torch.int32), ops.view(torch.int32)
    differ = torch.ne(a, b)
    if not bool(differ.any()):
        return
    where = differ.nonzero().squeeze(1)
    both_nan = native[where].isnan() & ops[where].isnan()
    tally.nan_payloads += int(both_nan.sum())
    bad = where[~both_nan]
    tally.mismatches += bad.numel()
    for i in bad[: max(0, keep - len(tally.examples))].tolist():
        pattern = int(x[i : i + 1].view(torch.int32)) & 0xFFFFFFFF
        tally.examples.append(
            f"0x{pattern:08X} ({float(x[i]):.9g}): C 0x{int(a[i]) & 0xFFFFFFFF:08X} "
            f"({float(native[i]):.9g}), torch ops 0x{int(b[i]) & 0xFFFFFFFF:08X} "
            f"({float(ops[i]):.9g})"
        )


def main() -> int:
    args = _arguments()
    torch.set_num_threads(args.threads)
    report_machine()
    round_native = dl16_native.load()
    if round_native is None:
        print(f"the C kernels are not built here: {dl16_native.native_status().as_dict()}")
        return 3
    variants = _formats(load_profile(args.profile).dl16, args.variants)
    lo, hi = args.span
    total = len(range(lo, hi, args.stride))
    chunk = 1 << args.chunk_bits
    print(f"checking {total:,} patterns [0x{lo:08X}, 0x{hi:08X}) stride {args.stride}, "
          f"{len(variants)} variants ({', '.join(v[0] for v in variants)}), "
          f"{args.threads} threads, chunks of {chunk:,}", flush=True)  # fmt: skip
    tallies = {name: Tally() for name, _, _ in variants}
    started, done, shown = time.perf_counter(), 0, 0.0
    while done < total:
        count = min(chunk, total - done)
        x = _patterns(lo + done * args.stride, count, args.stride)
        for name, fmt, transfer in variants:
            t0 = time.perf_counter()
            host_inf = fmt.host_inf if transfer else 0.0
            native = x.clone()
            round_native(native, native_rounding_args(fmt), host_inf, args.threads)
            ops = _round_inplace(x.clone(), fmt, transfer)
            _compare(x, native, ops, tallies[name], args.examples)
            tallies[name].checked += count
            tallies[name].seconds += time.perf_counter() - t0
        done += count
        if done / total - shown >= 0.05 or done == total:
            shown = done / total
            elapsed = time.perf_counter() - started
            print(f"  {shown:6.1%} after {elapsed:7.1f} s", file=sys.stderr, flush=True)
    elapsed = time.perf_counter() - started
    return _report(tallies, elapsed)


def _report(tallies: dict[str, Tally], elapsed: float) -> int:
    bad = 0
    for name, t in tallies.items():
        rate = t.checked / t.seconds / 1e6 if t.seconds else 0.0
        print(f"{name}: {t.checked:,} patterns, {t.mismatches:,} mismatches "
              f"({t.nan_payloads:,} NaN for NaN with other payload bits), {t.seconds:.1f} s "
              f"({rate:.1f} M patterns/s through both paths)")  # fmt: skip
        for line in t.examples:
            print(f"    {line}")
        bad += t.mismatches
    checked = sum(t.checked for t in tallies.values())
    print(f"total: {checked:,} pattern checks in {elapsed:.1f} s "
          f"({checked / elapsed / 1e6:.1f} M/s), {bad:,} mismatches")  # fmt: skip
    report_machine("after")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
