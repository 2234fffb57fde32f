"""Both workers and their runtime: leases, claims, stops, give-backs, faults met by one worker."""
