import hashlib
import json

import pytest

from sluice.core.errors import InvalidPayload
from sluice.enqueue import Item, prepare, read_items


def test_one_object_an_array_and_json_lines():
    assert [i.body for i in read_items('{\n "id": "a"\n}')] == ['{\n "id": "a"\n}']
    assert [(i.where, json.loads(i.body)) for i in read_items('[{"id": "a"}, {"id": "b"}]')] == [
        ("item 1", {"id": "a"}),
        ("item 2", {"id": "b"}),
    ]
    lines = '{"id": "a"}\n\n{"id": "b"}\nnot json\n'
    assert [(i.where, i.body) for i in read_items(lines)] == [
        ("line 1", '{"id": "a"}'),
        ("line 3", '{"id": "b"}'),
        ("line 4", "not json"),
    ]
    assert list(read_items("  \n")) == []


def test_prepare_key_group_and_dedup():
    p = prepare(Item("line 1", '{"id": "scene/1", "tile": "T31"}'), group_by="tile")
    assert (p.key, p.group_id) == ("scene/1", "T31")
    same = prepare(Item("line 9", '{"tile": "T31", "id": "scene/1"}'))
    assert same.dedup_id == p.dedup_id  # content hash ignores key order
    assert prepare(Item("x", '{"id": "a"}'), dedup_id="mine").dedup_id == "mine"


def test_group_ids_outside_the_sqs_alphabet_are_hashed():
    p = prepare(Item("line 1", '{"id": "日本"}'))
    assert p.key == "日本"
    assert len(p.group_id) == 64


def test_a_fair_lanes_message_goes_in_its_tenants_group():
    item = Item("line 1", json.dumps({"id": "a1", "tenant": "acme", "tile": "T1"}))
    assert prepare(item, concurrency_key="acme", fair_lane="shared").group_id == "acme"
    assert prepare(item, concurrency_key_field="tenant", fair_lane="shared").group_id == "acme"
    assert prepare(item, fair_lane="shared").group_id == "lane:shared"  # one tenant: the lane's
    assert (
        prepare(item, concurrency_key="ünï", fair_lane="shared").group_id
        == hashlib.sha256("ünï".encode()).hexdigest()
    )
    assert prepare(item, concurrency_key="acme", fair_lane="shared", group_by="tile").group_id == "T1"
    assert prepare(item, concurrency_key="acme").group_id == "a1"  # an ordinary lane: the key's


def test_errors_name_the_problem():
    with pytest.raises(InvalidPayload, match="group field 'tile' is missing"):
        prepare(Item("line 1", '{"id": "a"}'), group_by="tile")
    with pytest.raises(InvalidPayload, match="must be a JSON object, got an array"):
        prepare(Item("line 1", "[1]"))
