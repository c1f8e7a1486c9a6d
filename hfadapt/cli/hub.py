"""Commands about the Hub listing: crawl, models, census."""
