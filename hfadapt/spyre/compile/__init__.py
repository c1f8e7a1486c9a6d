"""The compiled half of the simulated device: ``torch.compile(model)`` on a model on
``spyre`` (the card's form, torch's default backend) or the ``backend="spyre"`` alias captures an
ATen graph, judges it whole against the profile, and runs it as generated DL16 code."""
