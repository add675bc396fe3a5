"""Memos for moto's pure helpers, for the explorer's speed (the emulator only; Sluice is untouched).

moto recomputes, on every request, things that depend only on a class or a name: the method names
of a response class (``inspect.getmembers``), camelCase to snake_case, and which attribute names a
response member may be read from. Each is a pure function of its arguments; here each is memoised
for the duration of the block (``faster_moto``), or from now on (``memoise_moto``: the whole test
session, from tests/conftest.py). Nothing else about moto changes.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import moto.core.responses as core_responses
import moto.core.serialize as serialize
import moto.core.utils as core_utils
import moto.sqs.models as sqs_models

_camel = functools.lru_cache(maxsize=4096)(core_utils.camelcase_to_underscores)
_methods = functools.lru_cache(maxsize=256)(core_utils.method_names_from_class)


def _possible_keys(original: Any) -> Any:
    memo: dict[tuple[Any, ...], tuple[str, ...]] = {}

    def get_possible_keys(self: Any, context: Any) -> Iterator[str]:
        obj = context.obj
        meta = getattr(type(obj), "Meta", None)
        if meta is not None and getattr(obj, "Meta", None) is not meta:
            yield from original(self, context)  # an object with a Meta of its own: not memoised
            return
        key = (type(self), tuple(self.alias_providers), type(obj), context.key, context.shape)
        found = memo.get(key)
        if found is None:
            found = memo[key] = tuple(original(self, context))
        yield from found

    return get_possible_keys


@contextmanager
def faster_moto() -> Iterator[None]:
    saved = [
        (core_utils, "camelcase_to_underscores", core_utils.camelcase_to_underscores),
        (core_responses, "camelcase_to_underscores", core_responses.camelcase_to_underscores),
        (sqs_models, "camelcase_to_underscores", sqs_models.camelcase_to_underscores),
        (core_responses, "method_names_from_class", core_responses.method_names_from_class),
        (serialize.AttributePicker, "get_possible_keys", serialize.AttributePicker.get_possible_keys),
    ]
    core_utils.camelcase_to_underscores = _camel
    core_responses.camelcase_to_underscores = _camel
    sqs_models.camelcase_to_underscores = _camel
    core_responses.method_names_from_class = _methods
    serialize.AttributePicker.get_possible_keys = _possible_keys(saved[4][2])  # type: ignore[method-assign]
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


_FOR_GOOD: list[Any] = []  # the block ``memoise_moto`` entered (collected, it would be left)


def memoise_moto() -> None:
    """The same memos, from now on (idempotent)."""
    if _FOR_GOOD:
        return
    block = faster_moto()
    block.__enter__()  # never left: the block's memos stay in place
    _FOR_GOOD.append(block)
