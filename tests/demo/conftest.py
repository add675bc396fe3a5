"""The stack packaged by osls once per parameter set in a run (``tests/deploy/conftest.py``)."""

from tests.deploy.conftest import packaged  # noqa: F401 - a fixture, shared with tests/deploy
