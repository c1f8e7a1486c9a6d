"""Adapters: the API an adapter file is written with (``api``), the registry that discovers
and applies them (``registry``), running stock code with swapped names (``rebind``), and the
proofs that an adapter computes what it replaces (``equivalence``, ``proofs``, ``examples``).
The bundled adapter files themselves ship as package data (the top-level ``adapters/``)."""
