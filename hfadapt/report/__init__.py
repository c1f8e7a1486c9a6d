"""What sweeps found: the failure census, coverage numbers, the diff between two sweeps, and
the self-contained HTML report with its charts."""
