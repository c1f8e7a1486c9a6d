"""Graphs of ATen ops as data: how an agent's drafted rewrite leaves the sandbox, and the only
form in which hfadapt runs it. :mod:`~hfadapt.graphs.capture` makes one with ``torch.export``
(inside the sandbox); :mod:`~hfadapt.graphs.artifact` reads and validates one without running
anything; :mod:`~hfadapt.graphs.program` runs a validated one; :mod:`~hfadapt.graphs.ops` is the
allowlist of ops it may hold."""

from hfadapt.graphs.artifact import GraphArtifact, TensorInput
from hfadapt.graphs.program import BoundCall, GraphProgram

__all__ = ["BoundCall", "GraphArtifact", "GraphProgram", "TensorInput"]
