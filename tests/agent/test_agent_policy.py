"""The AST policy: allowed drafts pass, every way out is refused with its line, and nothing
of the draft runs to find out."""

from __future__ import annotations

import pytest

from hfadapt.agent.policy import check_policy
from hfadapt.agent.suite import SUITE

HEAD = "import torch\nfrom hfadapt.adapters.api import adapter\n\n"
DEC = '@adapter(name="a", target="transformers.activations:NewGELUActivation.forward", rule="op.pow.square")\n'


def wrap(body: str, top: str = "") -> str:
    return HEAD + top + DEC + "def forward(self, x):\n" + body + "\n"


@pytest.mark.parametrize("spec", SUITE, ids=lambda s: s.name)
def test_known_good_solutions_pass(spec) -> None:
    result = check_policy(spec.solution, expected_target=spec.target)
    assert result.ok, result.problems
    assert result.adapter["target"] == spec.target and result.adapter["rule"] == spec.rule_id


BAD = {
    "import os": (wrap("    return x", "import os\n"), "import of 'os' is not allowed"),
    "from subprocess": (
        wrap("    return x", "from subprocess import run\n"),
        "import from 'subprocess'",
    ),
    "socket": (wrap("    return x", "import socket\n"), "import of 'socket'"),
    "torch.hub": (wrap("    return x", "import torch.hub\n"), "import of 'torch.hub'"),
    "open": (wrap("    open('/tmp/x', 'w')\n    return x"), "use of 'open'"),
    "eval": (wrap("    return eval('x')"), "use of 'eval'"),
    "exec": (wrap("    exec('y = 1')\n    return x"), "use of 'exec'"),
    "compile": (wrap("    compile('1', 'f', 'eval')\n    return x"), "use of 'compile'"),
    "__import__": (wrap("    __import__('os')\n    return x"), "use of '__import__'"),
    "getattr builtins": (
        wrap("    getattr(__builtins__, 'ev' + 'al')\n    return x"),
        "use of 'getattr'",
    ),
    "dunder escape": (
        wrap("    return x.__class__.__mro__"),
        "attribute '__class__' is not allowed",
    ),
    "torch.load": (wrap("    torch.load('w.pt')\n    return x"), "attribute 'load'"),
    "from_pretrained": (
        wrap("    m.from_pretrained('x')\n    return x"),
        "attribute 'from_pretrained'",
    ),
    "try fallback": (
        wrap(
            "    try:\n        return x * x * x\n    except Exception:\n        return torch.pow(x, 3.0)"
        ),
        "try/except",
    ),
    "calls original": (
        wrap("    return NewGELUActivation.forward(self, x)"),
        "calls the code it replaces",
    ),
    "super fallback": (wrap("    return super().forward(x)"), "use of 'super'"),
    "top-level call": (
        wrap("    return x", "torch.randn(10)\n"),
        "only imports, literal constants",
    ),
    "syntax": ("def f(:\n", "syntax error"),
    "two adapters": (
        wrap("    return x") + DEC + "def g(self, x):\n    return x\n",
        "exactly one @adapter",
    ),
    "relative import": (wrap("    return x", "from . import secrets\n"), "import from '.'"),
    # every route around the old denylist
    "torch.os": (wrap("    torch.os.posix_spawn('/bin/sh', [], {})\n    return x"), "'os'"),
    "torch.sys": (wrap("    torch.sys.modules.clear()\n    return x"), "'sys'"),
    "torch.ctypes": (wrap("    torch.ctypes.CDLL(None)\n    return x"), "'ctypes'"),
    "torch._C": (wrap("    return torch._C._nn.gelu(x)"), "'_C'"),
    "torch.ops": (wrap("    return torch.ops.aten.gelu(x)"), "'ops'"),
    "F.torch.os": (wrap("    return F.torch.os", "import torch.nn.functional as F\n"), "'os'"),
    "module route": (wrap("    return torch.random.seed()"), "is the module 'torch.random'"),
    "aliased getattr": (wrap("    return x", "_G = getattr\n"), "must be a literal"),
    "contextlib": (
        wrap("    return x", "from contextlib import suppress\n"),
        "import from 'contextlib'",
    ),
    "TYPE_CHECKING or True": (
        wrap(
            "    return x",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING or True:\n    pass\n",
        ),
        "(found if)",
    ),
    "class": (wrap("    return x", "class Evil:\n    pass\n"), "(found classdef)"),
    "decorator arg": (
        "import torch\nfrom hfadapt.adapters.api import adapter\nF = 1\n"
        '@adapter(name="a", target="m:C.forward", rule="r", applies=lambda m, c: True)\n'
        "def forward(self, x):\n    return x\n",
        "literal arguments only",
    ),
    "default smuggles getattr": (
        wrap("    def inner(a, getattr=getattr):\n        return a\n    return x"),
        "may not be bound",
    ),
    "unknown name": (wrap("    return os_module.x"), "name 'os_module' is not"),
    "torch.load alias": (
        wrap("    return x", "from torch import load\n"),
        "import of 'torch.load'",
    ),
    "storage": (wrap("    return x.untyped_storage()"), "'untyped_storage'"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_refused(name: str) -> None:
    source, expected = BAD[name]
    result = check_policy(source)
    assert not result.ok
    assert any(expected in p for p in result.problems), result.problems


def test_target_must_be_the_failing_code() -> None:
    source = wrap("    return x * x * x")
    result = check_policy(source, expected_target="transformers.activations:GELUActivation.forward")
    assert any("but the failing code is" in p for p in result.problems), result.problems


def test_problems_carry_line_numbers() -> None:
    result = check_policy(wrap("    return x", "import os\n"))
    assert result.problems[0].startswith("line 4:"), result.problems  # HEAD is 3 lines
