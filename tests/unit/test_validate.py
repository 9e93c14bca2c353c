import pytest

from trainmedic.core import validate
from trainmedic.core.errors import InputError

INJECTIONS = [
    "node001;rm -rf /",
    "node001 && reboot",
    "$(reboot)",
    "`id`",
    "node001\nnode002",
    "NODE001",
    "-oProxyCommand=x",
    "node001'",
    "{{ lookup('pipe','id') }}",
    "",
]


@pytest.mark.parametrize("bad", INJECTIONS)
def test_hostname_rejects_injection(bad: str) -> None:
    with pytest.raises(InputError) as info:
        validate.hostname(bad)
    assert info.value.field == "node"
    assert repr(bad) in str(info.value)


@pytest.mark.parametrize("bad", ["12;3", "abc", "1 2", "-1", "1" * 13])
def test_job_id_rejects(bad: str) -> None:
    with pytest.raises(InputError, match="job_id"):
        validate.job_id(bad)


def test_job_id_accepts_array_task() -> None:
    assert validate.job_id("123_4") == "123_4"
    assert validate.job_id(77) == "77"


def test_expand_and_compress_nodelist_roundtrip() -> None:
    names = validate.expand_nodelist("node[001-003,010],gpu7")
    assert names == ["node001", "node002", "node003", "node010", "gpu7"]
    assert validate.compress_nodelist(names) == "gpu7,node[001-003,010]"
    assert set(validate.expand_nodelist(validate.compress_nodelist(names))) == set(names)


@pytest.mark.parametrize("bad", ["node[003-001]", "node[1-2-3]", "node[001-999999]", ",", "n[a-b]"])
def test_expand_nodelist_errors_name_the_field(bad: str) -> None:
    with pytest.raises(InputError, match="nodes"):
        validate.expand_nodelist(bad)


def test_safe_text() -> None:
    assert validate.safe_text("trainmedic triage run-1: ECCError job 12", "reason")
    for bad in ["a\nb", "$(x)", "a;`b`", "{{ x }}", "a'b"]:
        with pytest.raises(InputError, match="reason"):
            validate.safe_text(bad, "reason")


def test_a_number_read_from_a_log_is_short_or_none() -> None:
    assert validate.log_number("0007") == 7
    assert validate.log_number("123456789") == 123456789
    assert validate.log_number("1234567890") is None
    assert validate.log_number("9" * 5000) is None  # int() itself refuses past 4300 digits
