"""Adapters: the API an adapter file is written with (``api``, which also hands out the host
helpers of ``host``), the registry that discovers and applies them (``registry``), running stock
code with swapped names (``rebind``), and the proofs that an adapter computes what it replaces
(``equivalence``, ``proofs``, ``examples``). The bundled adapter files themselves ship as
package data (the top-level ``adapters/``). How to write one: docs/adapters.md."""
