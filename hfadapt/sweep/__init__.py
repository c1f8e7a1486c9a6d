"""Batch coverage sweeps: plan (dedupe by structural signature), run units in isolated
workers (a local pool or Ray), store the rows, resume after a crash."""
