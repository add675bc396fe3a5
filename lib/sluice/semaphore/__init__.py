"""The semaphore step: a named semaphore workflows acquire around a critical section."""
