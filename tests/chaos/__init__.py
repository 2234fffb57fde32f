"""Long fault scenarios: chaos, outages, failovers, resharding."""
