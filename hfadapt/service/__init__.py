"""hfadapt as a service: ``hfadapt cycle``, one pass of the whole job for a scheduler (crawl,
sweep, the comparison with the last completed cycle, the report), recorded in the ``cycle``
table, one at a time per database; and ``hfadapt serve``, the read-only JSON API and dashboard
over the results (api, dashboard, queries, database)."""
