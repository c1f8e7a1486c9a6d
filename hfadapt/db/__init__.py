"""runs.db: where it lives and how it is opened (``engine``), its tables (``tables``) and
their schema versions (``migrations``). The lowest layer above the core: it imports no other
part of hfadapt."""
