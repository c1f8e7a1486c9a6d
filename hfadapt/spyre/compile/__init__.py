"""The compiled half of the simulated device: ``torch.compile(model, backend="spyre")``
captures an ATen graph, judges it whole against the profile, and runs it as generated DL16
code."""
