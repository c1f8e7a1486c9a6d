"""The C kernels are declared once: the C file's exports block is what the ctypes bindings are
made from (and what the compiler checks the definitions against); the row programs' layout is
declared in C and as ctypes structures, compared here field by field, with the codes the eager
device writes."""

from __future__ import annotations

import ctypes
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from hfadapt.spyre.eager import fusion
from hfadapt.spyre.numerics import dl16_native, kernels, native_build

C_TEXT = native_build.source()
# sizes and alignments of the C types the row program ABI uses (x86-64 and aarch64 alike)
C_SIZES = {"int64_t": 8}


def _definitions(text: str) -> dict[str, list[tuple[str, str]]]:
    """Each exported kernel's parameters (name, type) as its definition writes them."""
    body = re.sub(r"/\*.*?\*/", " ", text.split("/* end exports */", 1)[1], flags=re.S)
    found: dict[str, list[tuple[str, str]]] = {}
    for match in re.finditer(r"\b(hfadapt_\w+)\s*\(([^)]*)\)\s*\{", body):
        declared = native_build.prototypes(f"int {match[1]}({match[2]});")[match[1]]
        found[match[1]] = list(declared.params)
    return found


def test_every_kernel_is_declared_once_and_bound_from_that_declaration() -> None:
    declared = native_build.declared()
    assert sorted(declared) == sorted(dl16_native.KERNELS), (
        f"declared in C, not called: {sorted(set(declared) - set(dl16_native.KERNELS))}; "
        f"called, not declared: {sorted(set(dl16_native.KERNELS) - set(declared))}"
    )
    defined = _definitions(C_TEXT)
    assert sorted(defined) == sorted(declared), sorted(defined)
    differ = {
        n: (defined[n], list(s.params)) for n, s in declared.items() if defined[n] != list(s.params)
    }
    assert differ == {}, f"definitions whose parameters differ from the declaration: {differ}"
    rounding = declared[dl16_native.ROW_PROGRAM]
    i64, ptr, f32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
    assert rounding.argtypes == [
        i64, i64, i64, ptr, ptr, ptr, ptr, ctypes.c_int, f32, f32, ctypes.c_int32, f32,
        ctypes.c_int,
    ], rounding  # fmt: skip
    assert declared[dl16_native.AMX_PACK].restype is ctypes.c_int64
    message = str(dl16_native.refused(dl16_native.ROUND, 8))
    assert "hfadapt_round_dl16 refused its argument threads (position 8)" in message, message


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("int hfadapt_x(double v);", "C type 'double' has no ctypes binding"),
        ("int hfadapt_x(float v, int);", "hfadapt_x: parameter 'int'"),
        ("#define X 1;", "not a prototype: '#define X 1'"),
    ],
)
def test_a_declaration_the_binding_cannot_read_is_refused(text: str, says: str) -> None:
    with pytest.raises(native_build.BindingError) as info:
        native_build.prototypes(text)
    assert says in str(info.value), str(info.value)
    with pytest.raises(native_build.BindingError, match=r"no /\* begin nothing \*/"):
        native_build.block(C_TEXT, "nothing")


def _c_structs(text: str) -> dict[str, list[tuple[str, str, int]]]:
    """typedef'd structs of the block: name -> [(field, type, count)]."""
    out: dict[str, list[tuple[str, str, int]]] = {}
    code = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    for body, name in re.findall(r"typedef struct \{(.*?)\}\s*(\w+);", code, re.S):
        fields = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            m = re.fullmatch(r"(\w+)\s+(\w+)(?:\[(\d+)\])?", " ".join(decl.split()))
            assert m is not None, f"{name}: a field this test cannot read: {decl!r}"
            fields.append((m[2], m[1], int(m[3] or 1)))
        out[name] = fields
    return out


def _layout(structs: dict[str, list[tuple[str, str, int]]], name: str) -> list[Any]:
    """(field, type, count, offset) of a C struct, and its size, by C's rules for these types
    (each field at a multiple of its alignment; the types here are 8-byte aligned)."""
    sizes = dict(C_SIZES)
    rows: list[Any] = []
    offset = 0
    for field, c_type, count in structs[name]:
        if c_type not in sizes:
            sizes[c_type] = _layout(structs, c_type)[-1]
        offset = -(-offset // 8) * 8
        rows.append((field, c_type, count, offset))
        offset += sizes[c_type] * count
    return [*rows, offset]


def _ctypes_layout(structure: Any, names: dict[Any, str]) -> list[Any]:
    rows: list[Any] = []
    for field, t in structure._fields_:
        count = getattr(t, "_length_", 1)
        base = getattr(t, "_type_", t) if count > 1 else t
        rows.append((field, names[base], count, getattr(structure, field).offset))
    return [*rows, ctypes.sizeof(structure)]


def test_the_row_program_layout_is_the_c_structs_field_by_field() -> None:
    abi = native_build.block(C_TEXT, "row program ABI")
    structs = _c_structs(abi)
    assert sorted(structs) == ["row_node", "row_operand"], sorted(structs)
    names = {
        ctypes.c_int64: "int64_t",
        dl16_native.ProgramOperand: "row_operand",
        dl16_native.ProgramNode: "row_node",
    }
    for c_name, py in (("row_operand", dl16_native.ProgramOperand),
                       ("row_node", dl16_native.ProgramNode)):  # fmt: skip
        c, ours = _layout(structs, c_name), _ctypes_layout(py, names)
        assert c == ours, f"{c_name} in C: {c}\n{py.__name__} in Python: {ours}"
    assert dl16_native.PROGRAM_FIELDS == _layout(structs, "row_node")[-1] // 8 == 11
    enums = {
        name: int(value)
        for body in re.findall(r"enum \{(.*?)\};", abi, re.S)
        for name, value in re.findall(r"(\w+)\s*=\s*(\d+)", body)
    }
    assert enums == dl16_native.PROGRAM_CODES, (enums, dl16_native.PROGRAM_CODES)


def test_the_codes_the_device_writes_are_the_c_files() -> None:
    """What hfadapt.spyre.eager.fusion and kernels write into a description (their own
    copies of the codes) is what the C file reads."""
    codes = dl16_native.PROGRAM_CODES
    written = {
        "BINARY_FULL": kernels.FULL, "BINARY_COLUMN": kernels.COLUMN, "BINARY_ROW": kernels.ROW,
        "BINARY_SCALAR": kernels.SCALAR, "PROGRAM_GATHER": fusion._GATHER,
        "OP_SUM": fusion._OP_SUM, "FROM_INPUT": fusion._FROM_INPUT,
        "FROM_NODE": fusion._FROM_NODE, "FROM_NUMBER": fusion._FROM_NUMBER,
        **{f"OP_{op.split('::')[1].split('.')[0].upper()}": code
           for op, code in kernels.BINARY_OPS.items()},
    }  # fmt: skip
    differ = {k: (v, codes[k]) for k, v in written.items() if codes[k] != v}
    assert differ == {}, f"written, read by C: {differ}"


def _syntax(source: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    compiler = native_build.compiler()
    if compiler is None:
        pytest.skip("no C compiler")
    src = tmp_path / "dl16.c"
    src.write_text(source)
    flags = [f for f in native_build.FLAGS if f not in ("-shared", "-O3")]
    return subprocess.run(
        [compiler, *flags, "-fsyntax-only", str(src)], capture_output=True, text=True, timeout=120
    )


@pytest.mark.native
def test_the_build_refuses_an_undeclared_export_or_a_definition_unlike_its_declaration(
    tmp_path: Path,
) -> None:
    """The compiler holds the definitions to the exports block: an exported function the
    block does not declare fails the build (-Werror=missing-prototypes), and so does a
    definition whose types differ from its declaration."""
    assert _syntax(C_TEXT, tmp_path).returncode == 0
    extra = _syntax(C_TEXT + "\nint hfadapt_extra(int x) { return x; }\n", tmp_path)
    assert extra.returncode != 0 and "hfadapt_extra" in extra.stderr, extra.stderr[-800:]
    changed = C_TEXT.replace("int hfadapt_aten_sum(const float* x, int64_t rows,",
                             "int hfadapt_aten_sum(const float* x, int32_t rows,", 1)  # fmt: skip
    assert changed != C_TEXT
    conflict = _syntax(changed, tmp_path)
    assert conflict.returncode != 0 and "conflicting types" in conflict.stderr, conflict.stderr[
        -800:
    ]
