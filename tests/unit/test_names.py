import pytest

from sluice.core.names import NAME_PATTERN, execution_arn, execution_name


@pytest.mark.parametrize(
    "key",
    [
        "scene-1",
        "sentinel-s2-l2a/workflow-cog/S2A_OPER_MSI_L1C_TL_SGS__20160101T000000_A002769_T31UFU",
        "é/ü:ß",
        "日本語",
        'a b<c>{d}[e]?*"#%\\^|~`$&,;:/',
        "-" * 600,
        "x" * 512,
    ],
)
def test_names_are_valid_step_functions_names(key):
    name = execution_name(key, "7b1e2b9a-2d4e-4c55-9d55-6a8f7d3b2c10")
    assert NAME_PATTERN.match(name)
    assert len(name) <= 80


def test_same_message_same_name_new_message_new_name():
    assert execution_name("k", "m1") == execution_name("k", "m1")
    assert execution_name("k", "m1") != execution_name("k", "m2")


def test_keys_alike_after_sanitising_get_different_names():
    a, b = execution_name("a/b", "m"), execution_name("a:b", "m")
    assert a.split("-")[0] == b.split("-")[0] == "a"
    assert a != b
    assert execution_name("日本", "m") != execution_name("中国", "m")


def test_readable_prefix():
    assert execution_name("scene/2024-01-01", "m").startswith("scene-2024-01-01-")


def test_execution_arn_follows_from_the_name():
    sm = "arn:aws-us-gov:states:us-gov-west-1:123456789012:stateMachine:flow"
    assert execution_arn(sm, "n") == "arn:aws-us-gov:states:us-gov-west-1:123456789012:execution:flow:n"
    with pytest.raises(ValueError, match="not a state machine ARN"):
        execution_arn("arn:aws:sqs:us-east-1:1:q", "n")
