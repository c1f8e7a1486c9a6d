"""Row programs: chains of the eager device's pointwise ops, made a row at a time.

An op of the eager device reads its inputs from memory and writes its result back, and
the device rounds that result in another pass. An unfused LayerNorm (the ``layer-norm-unfused``
adapter) is a dozen such ops on tensors of the activations' size: at an encode's 928 x 384
values each one misses the core's cache (the norm took 2.26 ms; as the row programs below,
1.44 ms, of which their kernel 0.98 ms). The card runs each op as written; the simulator may
compute them in any order that gives the same values.

So a binary op (add, sub, mul, div) of DL16 operands and a DL16 sum over the last dimension
are not run when they are called: they become nodes of this thread's row program and return
a device tensor without data (``tensor.pending``). Every other op of the device runs the
program first (``settle``), and so does anything that reads a pending tensor's data
(``SpyreTensor._held``). The C kernel (``hfadapt_row_program``) then makes every row of every
node in turn, keeps the values only later nodes read in a scratch row, and writes out the
nodes whose tensors are still alive. Each node's result is rounded to DL16 as the op by op path
rounds it, and a sum adds in the order of ATen's CPU sum (checked against ``torch.sum`` once a
process, with the vector width this PyTorch uses; without a match sums run op by op): the
values are the same, bit for bit, as running the ops one at a time.

Calls are judged and counted when they are made, as before; only the arithmetic waits. The ops
of a program never write into a tensor, and every op that may write runs the program first,
so a program's inputs hold what they held when it was built."""

from __future__ import annotations

import ctypes
import math
import threading
import weakref
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import torch

from hfadapt.spyre.eager.tensor import SpyreTensor, is_dl16, pending, set_maker
from hfadapt.spyre.numerics.dl16 import DL16Format, native_rounding_args
from hfadapt.spyre.numerics.kernels import (
    BINARY_OPS,
    FULL,
    ROW,
    SCALAR,
    broadcast_shape,
    operand_kind,
)
from hfadapt.spyre.numerics.scalars import device_number

SUM = "aten::sum.dim_IntList"
FUSED_OPS = frozenset(BINARY_OPS) | {SUM}
_OP_SUM = 4  # dl16_kernels.c: OP_SUM, after the binary ops' codes
_GATHER = 4  # a row of the operand's own per row of the result, by a table of row numbers
_FROM_INPUT, _FROM_NODE, _FROM_NUMBER = 0, 1, 2

# A program starts with a result of at least this many values (a smaller chain gains nothing)
MIN_VALUES = 4096
# A program this long runs, and the next op starts another
MAX_NODES = 64

# (where from, how it broadcasts, index, index of its table of row numbers when gathered)
Operand = tuple[int, int, int, int]


class _Node:
    __slots__ = ("index", "kind", "op", "operands", "program", "result")

    def __init__(self, program: _Program, op: int, kind: int, operands: list[Operand]) -> None:
        self.program = program
        self.op = op
        self.kind = kind
        self.operands = operands
        self.index = len(program.nodes)
        self.result: weakref.ref[SpyreTensor] | None = None


class _Program:
    """The nodes waiting in one thread, over one shape (rows x the last dimension)."""

    def __init__(self, shape: tuple[int, ...], fmt: DL16Format) -> None:
        self.shape = shape
        self.row_shape = (*shape[:-1], 1)
        self.rows = math.prod(shape[:-1])
        self.cols = shape[-1]
        self.fmt = fmt
        self.nodes: list[_Node] = []
        self.inputs: list[torch.Tensor] = []
        self.numbers: list[float] = []
        self.lock = threading.Lock()
        self.done = False

    def add_input(self, held: torch.Tensor) -> int:
        for i, t in enumerate(self.inputs):
            if t is held:
                return i
        self.inputs.append(held)
        return len(self.inputs) - 1


_local = threading.local()


def _current() -> _Program | None:
    program: _Program | None = getattr(_local, "program", None)
    if program is not None and program.done:
        _local.program = program = None
    return program


def settle() -> None:
    """Run this thread's waiting program, if any (before an op that is not deferred)."""
    program = getattr(_local, "program", None)
    if program is not None:
        _local.program = None
        _run(program)


# -- the kernels, and the vector width of torch's sum ---------------------------------------

_kernel: Any = False  # False: not looked up yet; None: not built
_lanes: int | None = None  # the lanes ATen's CPU sum adds in (None: no sum is deferred)


def _load() -> Any:
    global _kernel, _lanes
    if _kernel is False:
        from hfadapt.spyre.numerics.dl16_native import load_aten_sum, load_row_program

        _kernel = load_row_program()
        _lanes = _sum_lanes(load_aten_sum()) if _kernel is not None else None
    return _kernel


def _sum_lanes(aten_sum: Any) -> int | None:
    """The vector width for which the C sum gives torch.sum's bits on rows of many lengths
    (ATen builds its sum for the CPU it finds), or None when none does."""
    if aten_sum is None:
        return None
    g = torch.Generator().manual_seed(20261203)
    rows = [
        torch.randn(5, n, generator=g) * torch.exp(torch.randn(5, n, generator=g) * 4)
        for n in (1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 384, 385, 1000, 4099)
    ]
    for lanes in (8, 16, 4):
        ok = True
        for x in rows:
            out = torch.empty(x.shape[0])
            aten_sum(x.data_ptr(), x.shape[0], x.shape[1], lanes, out.data_ptr())
            if not torch.equal(out.view(torch.int32), x.sum(-1).view(torch.int32)):
                ok = False
                break
        if ok:
            return lanes
    return None


# -- deferring a call -----------------------------------------------------------------------


def defer(
    name: str, args: tuple[object, ...], kwargs: dict[str, object], fmt: DL16Format
) -> SpyreTensor | None:
    """A pending device tensor for this call of a FUSED_OPS op, or None when the call is of
    another kind (then the caller runs it now)."""
    if _load() is None:
        return None
    if name == SUM:
        return _defer_sum(args, kwargs, fmt)
    return _defer_binary(BINARY_OPS[name], args, kwargs, fmt)


def _program_for(shape: tuple[int, ...], fmt: DL16Format) -> tuple[_Program, int] | None:
    """The program a result of ``shape`` joins (this thread's, when the shape is its own or
    its rows'; else a new one, after the old one ran, when ``shape`` is large enough to gain)
    and the result's kind there."""
    program = _current()
    if program is not None and program.fmt is fmt:
        if shape == program.shape:
            return program, FULL
        if shape == program.row_shape:
            return program, ROW
    if len(shape) == 0 or shape[-1] < 2 or math.prod(shape) < MIN_VALUES:
        return None
    settle()
    program = _local.program = _Program(shape, fmt)
    return program, FULL


def _operand(program: _Program, value: object, fmt: DL16Format) -> Operand | None:
    if not isinstance(value, SpyreTensor):  # a number: a device constant, as the op path has it
        number = float(device_number(value, fmt))
        if ctypes.c_float(number).value != number:
            return None
        program.numbers.append(number)
        return (_FROM_NUMBER, SCALAR, len(program.numbers) - 1, 0)
    node = value._node
    if isinstance(node, _Node) and node.program is program and not program.done:
        return (_FROM_NODE, node.kind, node.index, 0)
    held = value._held  # a tensor made before (or by another program, which runs now)
    if held.dtype != torch.float32 or held.requires_grad or type(held) is not torch.Tensor:
        return None
    kind = operand_kind(held, program.shape)
    if kind is not None:
        return (_FROM_INPUT, kind, program.add_input(held), 0)
    rows_at = _rows_at(tuple(held.shape), program.shape) if held.is_contiguous() else None
    if rows_at is None:
        return None
    return (_FROM_INPUT, _GATHER, program.add_input(held), program.add_input(rows_at))


@lru_cache(maxsize=16)
def _rows_at(operand: tuple[int, ...], shape: tuple[int, ...]) -> torch.Tensor | None:
    """For each row of a result of ``shape``, the row of a contiguous operand of shape
    ``operand`` that broadcasts to it over its leading dimensions (the last one whole, e.g. a
    [batch, 1, queries, keys] mask beside [batch, heads, queries, keys] scores); None when it
    does not broadcast so. A table per pair of shapes, kept: a model's layers share them."""
    if (
        len(operand) != len(shape)
        or operand[-1] != shape[-1]
        or any(o not in (1, s) for o, s in zip(operand[:-1], shape[:-1], strict=True))
    ):
        return None
    with torch.inference_mode(False):
        rows = torch.arange(math.prod(operand[:-1]), dtype=torch.int64).view(operand[:-1])
        return rows.expand(shape[:-1]).contiguous().view(-1)


def _dl16_operands(args: Sequence[object]) -> torch.dtype | None:
    """The one DL16 dtype of the device tensors among ``args`` (numbers beside them), or None."""
    dtype = None
    for a in args:
        if isinstance(a, SpyreTensor):
            if dtype is None:
                dtype = a.dtype
            if a.dtype != dtype or not is_dl16(a.dtype):
                return None
        elif not isinstance(a, (int, float)) or isinstance(a, bool):
            return None
    return dtype


def _defer_binary(
    op: int, args: tuple[object, ...], kwargs: dict[str, object], fmt: DL16Format
) -> SpyreTensor | None:
    if kwargs or len(args) != 2:
        return None
    dtype = _dl16_operands(args)
    if dtype is None:
        return None
    tensors = [a for a in args if isinstance(a, SpyreTensor)]
    shape = _broadcast([tuple(t.shape) for t in tensors])
    if shape is None:
        return None
    found = _program_for(shape, fmt)
    if found is None:
        return None
    program, kind = found
    operands = [_operand(program, a, fmt) for a in args]
    if any(o is None for o in operands) or (
        kind == ROW and any(o[1] not in (ROW, SCALAR) for o in operands if o is not None)
    ):
        return None
    return _add(program, op, kind, [o for o in operands if o is not None], dtype, tensors[0].device)


def _defer_sum(
    args: tuple[object, ...], kwargs: dict[str, object], fmt: DL16Format
) -> SpyreTensor | None:
    if _lanes is None or not args:
        return None
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if (
        not isinstance(x, SpyreTensor)
        or not is_dl16(x.dtype)
        or kwargs.get("dtype") is not None
        or keepdim is not True
        or x.dim() < 2
        or not isinstance(dim, (list, tuple))
        or len(dim) != 1
        or int(dim[0]) % x.dim() != x.dim() - 1
        or math.prod(x.shape[:-1]) < 2  # one row: ATen may split its sum between threads
    ):
        return None
    found = _program_for(tuple(x.shape), fmt)
    if found is None or found[1] != FULL:
        return None
    program = found[0]
    operand = _operand(program, x, fmt)
    if operand is None or operand[1] != FULL:
        return None
    return _add(program, _OP_SUM, ROW, [operand], x.dtype, x.device)


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    out: tuple[int, ...] | None = shapes[0]
    for s in shapes[1:]:
        out = broadcast_shape(out, s) if out is not None else None
    return out


def _add(
    program: _Program,
    op: int,
    kind: int,
    operands: list[Operand],
    dtype: torch.dtype,
    device: torch.device,
) -> SpyreTensor | None:
    with program.lock:
        if program.done:  # run meanwhile (another thread read one of its tensors): not joined
            return None
        node = _Node(program, op, kind, operands)
        out = pending(program.shape if kind == FULL else program.row_shape, dtype, device, node)
        node.result = weakref.ref(out)
        program.nodes.append(node)
    if len(program.nodes) >= MAX_NODES:
        settle()
    return out


# -- running a program ----------------------------------------------------------------------


def _made(t: SpyreTensor) -> None:
    """SpyreTensor._held of a pending tensor: run its program."""
    node = t._node
    if isinstance(node, _Node):
        if getattr(_local, "program", None) is node.program:
            _local.program = None
        _run(node.program)


set_maker(_made)


def _run(program: _Program) -> None:
    with program.lock:
        if program.done:
            return
        program.done = True
        nodes = program.nodes
        if not nodes:
            return
        alive = [n.result() if n.result is not None else None for n in nodes]
        needed = [t is not None for t in alive]
        for i in range(len(nodes) - 1, -1, -1):
            if needed[i]:
                for source, _, index, _ in nodes[i].operands:
                    if source == _FROM_NODE:
                        needed[index] = True
        desc: list[int] = []
        outs: list[int] = []
        made: list[tuple[SpyreTensor, torch.Tensor]] = []
        for node, t, need in zip(nodes, alive, needed, strict=True):
            operands = [*node.operands, (0, 0, 0, 0)][:2]
            desc += [node.op, node.kind, int(need), *operands[0], *operands[1]]
            if t is None:
                outs.append(0)
                continue
            data = torch.empty(program.shape if node.kind == FULL else program.row_shape)
            outs.append(data.data_ptr())
            made.append((t, data))
        count = len(nodes)
        _kernel(
            program.rows,
            program.cols,
            count,
            (ctypes.c_int64 * len(desc))(*desc),
            (ctypes.c_int64 * max(1, len(program.inputs)))(*[x.data_ptr() for x in program.inputs]),
            (ctypes.c_float * max(1, len(program.numbers)))(*program.numbers),
            (ctypes.c_int64 * count)(*outs),
            _lanes or 8,
            *native_rounding_args(program.fmt),
            torch.get_num_threads(),
        )
        for t, data in made:
            t._data = data
            t._node = None
        program.nodes = []
        program.inputs = []
