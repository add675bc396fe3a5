"""Memos for moto's pure helpers, for the explorer's speed (the emulator only; Sluice is untouched).

moto recomputes, on every request, things that depend only on a class or a name: the method names
of a response class (``inspect.getmembers``), camelCase to snake_case, which attribute names a
response member may be read from, and the syntax tree of a DynamoDB update or condition expression
(of its text, names and values; moto's validator copies an update's tree before it touches it);
and, on the client's side, each part of botocore's User-Agent header (built anew for every call).
GetQueueAttributes reads a queue's attributes once, not twice for each name asked (each read
walks every message of the queue three times). The DynamoDB expression trees' walks (ten for each
update, by as many processors) ask ``isinstance`` of ABCs at every node; which processor entry
takes a node depends on the two classes alone, so each answer is kept by class.
Each is a pure function of its arguments; here each is memoised for the duration of the block
(``faster_moto``), or from now on (``memoise_moto``: the whole test session, from
tests/conftest.py). Nothing else about moto changes.

``lighter`` (the explorer's runs; its update-validator half for the whole test session, through
``memoise_moto``): botocore signs every request with SigV4, a chain of HMACs
that moto never checks; in the block a request carries the Authorization header moto reads (the
access key, for the account), with no signature computed. moto's validator copies an update
expression's tree by a pickle round trip (C) rather than ``copy.deepcopy`` (Python), the same copy,
and runs its three checks of the expression's shape (one SET, no overlapping paths, no key
updated), which read neither the item nor the values and change nothing, once per expression,
its names and its table's keys.
"""

from __future__ import annotations

import functools
import gc
import inspect
import json
import pickle
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import botocore.auth as auth
import botocore.useragent as useragent
import moto.core.responses as core_responses
import moto.core.serialize as serialize
import moto.core.utils as core_utils
import moto.dynamodb.comparisons as dynamo_conditions
import moto.dynamodb.parsing.ast_nodes as dynamo_nodes
import moto.dynamodb.parsing.expressions as dynamo_updates
import moto.dynamodb.parsing.validators as dynamo_validators
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


def _update_tree(original: Any) -> Any:
    """``UpdateExpressionParser.make``, memoised by the expression's text."""
    return classmethod(functools.lru_cache(maxsize=4096)(original.__func__))


def _condition_tree(original: Any) -> Any:
    """``ConditionExpressionParser.parse``, memoised by the expression, its names and its values
    (the tree holds the values), with the names and values it found."""
    memo: dict[tuple[Any, ...], tuple[Any, tuple[str, ...], tuple[str, ...]]] = {}

    def parse(self: Any) -> Any:
        key = (
            self.condition_expression,
            json.dumps(self.expression_attribute_names, sort_keys=True),
            json.dumps(self.expression_attribute_values, sort_keys=True),
        )
        found = memo.get(key)
        if found is None:
            op = original(self)
            if len(memo) > 20_000:
                memo.clear()
            memo[key] = (op, tuple(self.expr_attr_names_found), tuple(self.expr_attr_values_found))
            return op
        op, names, values = found
        self.expr_attr_names_found.extend(names)
        self.expr_attr_values_found.extend(values)
        return op

    return parse


def _lexed_once(original: Any) -> Any:
    """``ConditionExpressionParser._lex_condition_expression``, memoised by the expression's text
    alone (the tokens depend on nothing else; the parse above also keys on the values, which change
    from call to call). Each call is given fresh tokens, each with a list of children of its own."""
    memo: dict[str, tuple[Any, ...]] = {}

    def lex(self: Any) -> Any:
        text = self.condition_expression
        found = memo.get(text)
        if found is None:
            if len(memo) > 20_000:
                memo.clear()
            found = memo[text] = tuple(original(self))
        return deque(node._replace(children=[]) for node in found)

    return lex


def _get_queue_attributes(self: Any, queue_name: str, attribute_names: list[str]) -> dict[str, Any]:
    """``SQSBackend.get_queue_attributes`` with the queue's attributes read once."""
    queue = self.get_queue(queue_name)
    if not attribute_names:
        return {}
    valid_names = ["All", *queue.BASE_ATTRIBUTES, *queue.FIFO_ATTRIBUTES, *queue.KMS_ATTRIBUTES]
    invalid_name = next((name for name in attribute_names if name not in valid_names), None)
    if invalid_name or invalid_name == "":
        raise sqs_models.InvalidAttributeName(invalid_name)
    every = queue.attributes
    if "All" in attribute_names:
        return every
    return {name: every[name] for name in attribute_names if every.get(name) is not None}


_NO_MATCH = object()
_IS_NODE: dict[type, bool] = {}  # a class -> whether it is a Node (an ABC: isinstance is slow)
_PROCESSED_AS: dict[tuple[type, type], Any] = {}  # (traverser, node class) -> its map's key, or None


def _traverse_node_recursively(self: Any, node: Any, child_id: int = -1) -> Any:
    """``DepthFirstTraverser.traverse_node_recursively`` with its ``isinstance`` answers kept by
    class: a traverser's map has the same keys for every instance, so which entry processes a node
    depends on the two classes alone. The same traversal, in the same order."""
    kind = type(node)
    is_node = _IS_NODE.get(kind)
    if is_node is None:
        is_node = _IS_NODE[kind] = isinstance(node, dynamo_nodes.Node)
    if not is_node:
        return node
    parent_node = node.parent
    if node.children is not None:
        for i, child_node in enumerate(node.children):
            self.pre_processing_of_child(node, i)
            self.traverse_node_recursively(child_node, i)
    key = (type(self), kind)
    entry = _PROCESSED_AS.get(key, _NO_MATCH)
    if entry is _NO_MATCH:
        entry = _PROCESSED_AS[key] = next((k for k in self._processing_map() if isinstance(node, k)), None)
    if entry is not None:
        node = self._processing_map()[entry](node)
        node.parent = parent_node
        if parent_node:
            parent_node.children[child_id] = node
    return node


_DESCENDS: dict[type, bool] = {}  # a class -> whether find_clauses looks inside it


def _find_clauses(self: Any, clause_types: Any) -> list[Any]:
    """``Node.find_clauses`` with its ``isinstance`` answers kept by class."""
    clauses = []
    for child in self.children or []:
        kind = type(child)
        if kind in clause_types:
            clauses.append(child)
            continue
        descends = _DESCENDS.get(kind)
        if descends is None:
            descends = _DESCENDS[kind] = issubclass(
                kind, (dynamo_nodes.Expression, dynamo_nodes.UpdateExpressionFunction)
            )
        if descends:
            clauses.extend(child.find_clauses(clause_types))
    return clauses


_SCALARS = {"S": str, "N": str, "BOOL": bool, "NULL": bool}


def _wire_form(value: Any) -> bool:
    """Whether a DynamoDB ``AttributeValue`` is already what moto's JSON serializer would write for
    it: one member, a string, number, boolean or null, a string or number set, or a map or list of
    such values (a binary value is base64-encoded on the way: not one)."""
    if type(value) is not dict or len(value) != 1:
        return False
    ((kind, inner),) = value.items()
    scalar = _SCALARS.get(kind)
    if scalar is not None:
        return type(inner) is scalar
    if kind in ("SS", "NS"):
        return type(inner) is list and all(type(x) is str for x in inner)
    if kind == "M":
        return type(inner) is dict and all(type(k) is str and _wire_form(v) for k, v in inner.items())
    if kind == "L":
        return type(inner) is list and all(_wire_form(v) for v in inner)
    return False


def _attribute_values_as_they_are(original: Any) -> Any:
    """``BaseJSONSerializer._serialize_type_structure``: an ``AttributeValue`` already in its wire
    form (``_wire_form``) is written as it is, not walked member by member (each member asks each
    of its possible names: about a quarter of a DynamoDB-heavy run's CPU). The same JSON."""

    def serialize_structure(self: Any, serialized: Any, value: Any, shape: Any, key: str) -> None:
        if key and shape.name == "AttributeValue" and _wire_form(value):
            self._default_serialize(serialized, value, shape, key)
            return
        original(self, serialized, value, shape, key)

    return serialize_structure


@contextmanager
def _patched(*patches: tuple[Any, str, Callable[[Any], Any]]) -> Iterator[None]:
    """Each ``(owner, name, make)``: ``owner.name`` is ``make(original)`` for the block."""
    saved = [(owner, name, inspect.getattr_static(owner, name)) for owner, name, _ in patches]
    for (owner, name, make), (_, _, original) in zip(patches, saved, strict=True):
        setattr(owner, name, make(original))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def faster_moto() -> AbstractContextManager[None]:
    return _patched(
        (core_utils, "camelcase_to_underscores", lambda _: _camel),
        (core_responses, "camelcase_to_underscores", lambda _: _camel),
        (sqs_models, "camelcase_to_underscores", lambda _: _camel),
        (core_responses, "method_names_from_class", lambda _: _methods),
        (serialize.AttributePicker, "get_possible_keys", _possible_keys),
        (dynamo_updates.UpdateExpressionParser, "make", _update_tree),
        (dynamo_conditions.ConditionExpressionParser, "parse", _condition_tree),
        (dynamo_conditions.ConditionExpressionParser, "_lex_condition_expression", _lexed_once),
        (useragent.UserAgentComponent, "to_string", functools.lru_cache(maxsize=1024)),
        (sqs_models.SQSBackend, "get_queue_attributes", lambda _: _get_queue_attributes),
        (dynamo_nodes.DepthFirstTraverser, "traverse_node_recursively", lambda _: _traverse_node_recursively),
        (dynamo_nodes.Node, "find_clauses", lambda _: _find_clauses),
        (serialize.BaseJSONSerializer, "_serialize_type_structure", _attribute_values_as_they_are),
    )


def _named_only(self: Any, request: Any) -> None:
    """``SigV4Auth.add_auth``: the header moto reads the access key from, with no signature."""
    request.headers["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={self.credentials.access_key}/20260101/{self._region_name}/"
        f"{self._service_name}/aws4_request, SignedHeaders=host, Signature=0"
    )


def _copied(original: Any) -> Any:
    """``deepcopy`` as a pickle round trip; what pickle cannot copy, ``original`` copies."""

    def deepcopy(value: Any, memo: Any = None) -> Any:
        try:
            return pickle.loads(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
        except Exception:
            return original(value, memo)

    return deepcopy


_SHAPE_CHECKS = (
    dynamo_validators.ActionCountValidator,
    dynamo_validators.OverlappingPathsValidator,
    dynamo_validators.UpdateHashRangeKeyValidator,
)


_PASSED: dict[tuple[Any, ...], Any] = {}  # shape checks passed -> the tree itself (its id not reused)


def _keeping_the_tree(original: Any) -> Any:
    """``UpdateExpressionValidator.__init__``, keeping the tree it was given (moto's parse is
    memoised: one tree per text), before moto copies it."""

    def __init__(self: Any, expression: Any, *args: Any, **kwargs: Any) -> None:
        self._sluice_tree = expression
        original(self, expression, *args, **kwargs)

    return __init__


def _shape_checked_once(_: Any) -> Any:
    """``UpdateExpressionValidator.validate``: the shape checks passed once for a tree, its names
    and its table's keys are not run again for them."""

    def validate(self: Any) -> Any:
        key = (
            id(self._sluice_tree),
            json.dumps(self.expression_attribute_names or {}, sort_keys=True),
            tuple(self.table.table_key_attrs),
        )
        checked = _PASSED.get(key) is self._sluice_tree
        node = self.node_to_validate
        for processor in self.processors:
            if not (checked and isinstance(processor, _SHAPE_CHECKS)):
                node = processor.traverse(node)
        _PASSED[key] = self._sluice_tree
        return node

    return validate


_LIGHTER_UPDATES = (
    (dynamo_validators, "deepcopy", _copied),
    (dynamo_validators.UpdateExpressionValidator, "__init__", _keeping_the_tree),
    (dynamo_validators.UpdateExpressionValidator, "validate", _shape_checked_once),
)


def lighter() -> AbstractContextManager[None]:
    """Requests made in the block go unsigned (moto checks no signature), and moto's update
    validator copies its tree in C and checks an expression's shape once."""
    return _patched((auth.SigV4Auth, "add_auth", lambda _: _named_only), *_LIGHTER_UPDATES)


def _lighter_updates() -> AbstractContextManager[None]:
    """moto's update validator copies its tree in C and checks an expression's shape once."""
    return _patched(*_LIGHTER_UPDATES)


def quiet_collector() -> None:
    """What is alive now (moto, botocore and their models) lives as long as the process: it is frozen
    out of the collector's full passes, which walked it again and again (about a tenth of a
    DynamoDB-heavy module's CPU), and the youngest generation is collected less often. Only when
    and how often cycles are freed changes."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)


_FOR_GOOD: list[Any] = []  # the blocks ``memoise_moto`` entered (collected, they would be left)


def memoise_moto() -> None:
    """The same memos, and the update validator's lighter copies and checks, from now on
    (idempotent). Requests stay signed: S3 reads a streamed body by its signing headers, and some
    tests' faults and credential checks ride on the signer."""
    if _FOR_GOOD:
        return
    for block in (faster_moto(), _lighter_updates()):
        block.__enter__()  # never left: the block's memos stay in place
        _FOR_GOOD.append(block)
