"""From a message to a start, and from an end to a release: launcher, admission, completion, hand-over, reconciliation, settings."""
