"""The Hugging Face Hub side: the client settings, the crawler that ranks embedding models,
the prefilter, the crawled listing in runs.db, the bundled snapshot, configs without weights,
and where a model reference points."""
