"""The in-memory store and AWS fakes: the same contract, for tests and the bench."""
