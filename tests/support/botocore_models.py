"""One botocore loader for every session a test process makes (issue #26).

Each test makes its own boto3 session (``tests.support.aws.moto_session``), and Sluice's runtime a
client per service from it; every new botocore session reads and parses the service models (JSON
files of up to a few MB: DynamoDB, SQS, Step Functions, SSM, S3, the endpoints) again, which is about
half the CPU of a small moto test. The models are the same files for the whole run, so the sessions
share one loader (botocore's ``Loader``, which caches what it parsed). A session still has its own
credentials, configuration, event handlers and clients; only the parsed JSON is shared, as the clients
of one session already share it.
"""

from __future__ import annotations

import os
from typing import Any

import boto3
import boto3.session
import botocore.loaders
import botocore.session

_LOADERS: dict[Any, botocore.loaders.Loader] = {}
_BOTO3_DATA = os.path.join(os.path.dirname(boto3.__file__), "data")


def _shared_loader(search_path_string: str | None = None) -> botocore.loaders.Loader:
    loader = _LOADERS.get(search_path_string)
    if loader is None:
        loader = _LOADERS[search_path_string] = botocore.loaders.create_loader(search_path_string)
    return loader


def _setup_loader(self: boto3.session.Session) -> None:
    """boto3's own: the loader, with boto3's data directory added once (not once per session)."""
    self._loader = self._session.get_component("data_loader")
    if _BOTO3_DATA not in self._loader.search_paths:
        self._loader.search_paths.append(_BOTO3_DATA)


def share_botocore_loader() -> None:
    """From now on, every botocore session of this process loads its models through one loader."""
    botocore.session.create_loader = _shared_loader
    boto3.session.Session._setup_loader = _setup_loader
