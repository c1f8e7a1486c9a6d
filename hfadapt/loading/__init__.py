"""Loading a model to judge: its real weights and tokenizer (:mod:`.load`), or a structural
stand-in built from its config (:mod:`.structural`); the structural signature sweeps dedupe on,
native translations of remote-code families, its pooling and its probe inputs. Below judging:
``hfadapt.load`` and the sweep planner use it without importing the judge."""
