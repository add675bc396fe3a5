"""What ``sluice status KEY`` shows of awaits: a parked waiter and what it waits for, and with
``--tree`` what it awaits and what awaits it, with states."""

from __future__ import annotations

from typing import Any

from sluice.features.awaits import Waiter, judge, state_of
from sluice.runtime import Runtime

TREE_DEPTH = 10


def known_waiters(rt: Runtime) -> list[Waiter]:
    """Every parked waiter (``sluice enqueue`` checks cycles against them too)."""
    store = rt.store()
    return [w for w in store.waiters(store.waiting()) if w.parked]


def awaits_status(rt: Runtime, key: str, *, tree: bool = False) -> dict[str, Any]:
    rt.settings.require("table_name")
    store = rt.store()
    parked = known_waiters(rt)
    by_key: dict[str, list[Waiter]] = {}
    for w in parked:
        by_key.setdefault(w.key, []).append(w)
    waiting = []
    for w in by_key.get(key, []):
        verdict = judge(w.awaits, store.payloads(w.awaits), run_anyway=w.run_anyway)
        waiting.append(
            {
                "message_id": w.message_id,
                "parked_at": w.parked_at,
                "awaits": [{"key": k, "state": verdict.states[k]} for k in w.awaits],
                "missing": list(verdict.missing),
                "on_failure": "run" if w.run_anyway else "dead-letter",
            }
        )
    data: dict[str, Any] = {"key": key, "waiting": waiting}
    if tree:
        data["tree"] = _node(store, key, by_key, depth=0, path=())
        data["awaited_by"] = sorted({w.key for w in parked if key in w.awaits})
    return data


def _node(
    store: Any, key: str, by_key: dict[str, list[Waiter]], *, depth: int, path: tuple[str, ...]
) -> dict:
    record = store.payload(key)
    waiters = by_key.get(key, [])
    state = "WAITING" if waiters and (record is None or not record.holder) else state_of(record)
    node: dict[str, Any] = {"key": key, "state": state, "awaits": []}
    if depth >= TREE_DEPTH or key in path:
        return node
    awaited = list(dict.fromkeys(k for w in waiters for k in w.awaits))
    node["awaits"] = [_node(store, k, by_key, depth=depth + 1, path=(*path, key)) for k in awaited]
    return node


def tree_lines(node: dict[str, Any], indent: str = "") -> list[str]:
    lines = [f"{indent}{node['key']}  {node['state']}"]
    for child in node["awaits"]:
        lines.extend(tree_lines(child, indent + "  awaits "))
    return lines
