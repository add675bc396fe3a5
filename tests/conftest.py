from __future__ import annotations

import os

import pytest

# Never reach a real account from a test, whatever the machine's environment says.
for _name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN"):
    os.environ.pop(_name, None)
os.environ.update(
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_DEFAULT_REGION="us-east-1",
    AWS_REGION="us-east-1",
    POWERTOOLS_METRICS_NAMESPACE="Sluice",
    POWERTOOLS_SERVICE_NAME="sluice-test",
    POWERTOOLS_TRACE_DISABLED="1",
)

from tests.support.moto_patches import serialise_dynamodb  # noqa: E402

serialise_dynamodb()


@pytest.fixture
def session():
    from tests.support.aws import moto_session

    with moto_session() as s:
        yield s


@pytest.fixture
def stack(session):
    from tests.support.aws import build_stack

    return build_stack(session)
