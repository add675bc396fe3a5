"""The emulator as the test session runs it, in one place: tests/conftest.py calls ``as_in_the_suite``
for ``make test``, and the explorer's command lines (``python -m tests.explorer``, ``python -m
tests.explorer.variants``) call it too, so that a hunt or a replay meets the same moto, at the same
speed, as the pinned seeds do under pytest. Each adjustment changes the emulator's speed or makes it
answer as AWS documents (tests/support/moto_patches.py, tests/explorer/fast_moto.py,
tests/support/botocore_models.py); Sluice's code is never patched."""

from __future__ import annotations

_INSTALLED: list[bool] = []


def as_in_the_suite() -> None:
    """Install every session-wide adjustment, once a process."""
    if _INSTALLED:
        return
    _INSTALLED.append(True)
    from tests.explorer.fast_moto import memoise_moto, quiet_collector
    from tests.support.botocore_models import memoise_botocore_setup, share_botocore_loader
    from tests.support.moto_patches import (
        cached_response_keys,
        cheap_rollbacks,
        dead_letter_source,
        projected_scans,
        redrive_filter,
        serialise_dynamodb,
    )

    cheap_rollbacks()  # first: the lock below holds a transaction's copies with it
    serialise_dynamodb()
    redrive_filter()
    dead_letter_source()
    projected_scans()
    cached_response_keys()
    memoise_moto()  # moto's pure helpers memoised (tests/explorer/fast_moto.py)
    share_botocore_loader()
    memoise_botocore_setup()
    quiet_collector()  # the long-lived heap out of the collector's full passes (idem)
