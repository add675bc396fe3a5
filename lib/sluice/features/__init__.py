"""What a payload may ask for: keys, awaits, lanes, fair lanes, receipts, effects, pointers, deferred duplicates."""
