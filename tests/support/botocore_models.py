"""One botocore loader for every session a test process makes, and its set-up done once (issue #26).

Each test makes its own boto3 session (``tests.support.aws.moto_session``), and Sluice's runtime a
client per service from it; every new botocore session reads and parses the service models (JSON
files of up to a few MB: DynamoDB, SQS, Step Functions, SSM, S3, the endpoints) again, which is about
half the CPU of a small moto test. The models are the same files for the whole run, so the sessions
share one loader (botocore's ``Loader``, which caches what it parsed). A session still has its own
credentials, configuration, event handlers and clients; only the parsed JSON is shared, as the clients
of one session already share it.

The rest of a new session's and a new client's set-up that gives the same answer every time is
worked out once too (``memoise_botocore_setup``): whether a handler takes ``**kwargs`` (asked of
every built-in handler of every session), the aliases of an event name (asked again by every
client's copy of its session's emitter) and the parsed endpoint rules of a service.
"""

from __future__ import annotations

import inspect
import os
import types
from typing import Any

import boto3
import boto3.session
import botocore.endpoint_provider
import botocore.hooks
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


_ARGSPEC_KWARGS: dict[Any, bool] = {}
_ALIASED_NAMES: dict[str, str] = {}
_RULESETS: dict[tuple[int, int], tuple[Any, Any, Any]] = {}


def _accepts_kwargs(func: Any) -> bool:
    """botocore's ``accepts_kwargs``, asked once per function: every session registers the same ~130
    handlers, and ``inspect.getfullargspec`` on each is most of a session's set-up."""
    key = getattr(func, "__func__", func)
    if not isinstance(key, types.FunctionType):
        return bool(inspect.getfullargspec(func)[2])
    known = _ARGSPEC_KWARGS.get(key)
    if known is None:
        known = _ARGSPEC_KWARGS[key] = bool(inspect.getfullargspec(func)[2])
    return known


def _aliaser_init(self: Any, event_emitter: Any, event_aliases: Any = None) -> None:
    """botocore's own, but the aliases of an event name (a pure function of the name under the default
    table) are cached once for every emitter rather than once per emitter."""
    default = event_aliases is None or event_aliases == botocore.hooks.EVENT_ALIASES  # a client's is a copy
    self._event_aliases = botocore.hooks.EVENT_ALIASES if default else event_aliases
    self._alias_name_cache = _ALIASED_NAMES if default else {}
    self._emitter = event_emitter


_RuleSet = botocore.endpoint_provider.RuleSet


def _ruleset(ruleset_data: dict[str, Any], partitions: Any) -> Any:
    """A service's endpoint rules, parsed once: with one loader, each client is given the same ruleset
    and partition objects, and the parsed rules are read-only."""
    key = (id(ruleset_data), id(partitions))
    held = _RULESETS.get(key)
    if held is None or held[0] is not ruleset_data or held[1] is not partitions:
        held = _RULESETS[key] = (ruleset_data, partitions, _RuleSet(**ruleset_data, partitions=partitions))
    return held[2]


def _provider_init(self: Any, ruleset_data: Any, partition_data: Any, excluded_params: Any = None) -> None:
    self.ruleset = _ruleset(ruleset_data, partition_data)
    self._excluded_params = excluded_params or frozenset()


def memoise_botocore_setup() -> None:
    """From now on, a new session and a new client redo none of botocore's pure set-up work: the
    handlers' signatures, the event names' aliases and the endpoint rules are worked out once."""
    botocore.hooks.accepts_kwargs = _accepts_kwargs
    botocore.hooks.EventAliaser.__init__ = _aliaser_init
    botocore.endpoint_provider.EndpointProvider.__init__ = _provider_init
