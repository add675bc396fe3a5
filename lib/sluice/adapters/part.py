"""``Part``: a store's method that one of its parts answers, named once.

A store (``DynamoStore``, ``MemoryStore``) is one part per concern; the ports (``sluice.core.ports``)
name each method and its signature. ``renew = Part("claims")`` in the store's class makes
``store.renew`` the bound ``store.claims.renew``: the call goes to the part unchanged, and a test
may still patch ``DynamoStore.renew`` as any method."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Part:
    def __init__(self, part: str, method: str | None = None) -> None:
        self.part, self.method = part, method or ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.method = self.method or name

    def __get__(self, store: object | None, owner: type | None = None) -> Callable[..., Any]:
        if store is None:  # read from the class: a function of the store, as a method is
            return lambda store, *args, **kwargs: getattr(getattr(store, self.part), self.method)(
                *args, **kwargs
            )
        return getattr(getattr(store, self.part), self.method)  # type: ignore[no-any-return]
