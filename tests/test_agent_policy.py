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
        "getattr() needs a literal",
    ),
    "dunder escape": (wrap("    return x.__class__.__mro__"), "dunder attribute '__class__'"),
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
    "super fallback": (wrap("    return super().forward(x)"), "calls the code it replaces"),
    "top-level call": (wrap("    return x", "torch.randn(10)\n"), "only imports, constants"),
    "syntax": ("def f(:\n", "syntax error"),
    "two adapters": (
        wrap("    return x") + DEC + "def g(self, x):\n    return x\n",
        "exactly one @adapter",
    ),
    "relative import": (wrap("    return x", "from . import secrets\n"), "import from '.'"),
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
