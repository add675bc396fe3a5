"""Building blocks with no feature of their own: sharded slots, leases, calls side by side."""
