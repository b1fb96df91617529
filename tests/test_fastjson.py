"""plait.fastjson writes what the standard library reads, and reads what it writes:
stored records written before it are read the same, and its sorted keys are in the
standard library's order."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plait import fastjson

_leaf = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text()
values = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(), inner, max_size=4), max_leaves=20)


@given(values)
def test_what_one_writes_the_other_reads(value):
    assert json.loads(fastjson.dumps(value)) == value
    assert fastjson.loads(json.dumps(value).encode()) == value
    assert fastjson.loads(json.dumps(value, sort_keys=True)) == value  # (str too)


@given(st.dictionaries(st.text(), st.integers(0, 9), max_size=8))
def test_sorted_keys_are_in_the_standard_librarys_order(value):
    assert list(json.loads(fastjson.dumps(value, sort_keys=True))) == list(
        json.loads(json.dumps(value, sort_keys=True)))


def test_int_keys_are_written_as_strings_and_compact():
    assert fastjson.dumps({2: "b", "a": [1, 0.1, None]}, sort_keys=True) == (
        b'{"2":"b","a":[1,0.1,null]}')


def test_garbage_is_a_value_error_and_an_unwritable_value_a_type_error():
    for garbage in (b'{"a": ', b"", b"\xff\xfe", b'{"a": 1} x'):
        with pytest.raises(ValueError):
            fastjson.loads(garbage)
    with pytest.raises(TypeError):
        fastjson.dumps({"a": object()})


@given(st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
               | st.characters(), max_size=8))
def test_what_orjson_refuses_is_written_and_read_back_all_the_same(text):
    """A lone surrogate (JSON from a tenant's TaskController may hold the escape) and
    an integer beyond 64 bits: written as ``json`` would, read back the same."""
    value = {"reason": text, "big": 2**70, "n": [1, -(2**64)]}
    assert fastjson.loads(fastjson.dumps(value, sort_keys=True)) == value
    assert fastjson.loads(fastjson.dumps(value)) == json.loads(json.dumps(value))


@pytest.mark.parametrize("data", [b"[" * 5000 + b"]" * 5000, b'{"a":' * 3000 + b"1" + b"}" * 3000,
                                  b"[" * 100000 + b"\n"])
def test_json_nested_too_deeply_is_a_value_error(data):
    """Past orjson's depth the standard library's parser runs out of stack: both are
    a ValueError, as for any JSON that cannot be read."""
    with pytest.raises(ValueError):
        fastjson.loads(data)


def test_bytes_that_are_not_utf8_are_refused_naming_their_encoding() -> None:
    import pytest

    for encoding, named in (("utf-16", "UTF-16"), ("utf-32-le", "UTF-32-LE"),
                            ("utf-8-sig", "byte order mark")):
        with pytest.raises(fastjson.NotUtf8, match=named):
            fastjson.loads('{"a": "\\ud800", "b": 1}'.encode(encoding))
    with pytest.raises(ValueError, match="0xe9 at 7"):
        fastjson.loads('{"a": "\u00e9"}'.encode("latin-1"))
    assert fastjson.loads('{"a": "\u00e9"}'.encode()) == {"a": "\u00e9"}
    assert fastjson.loads(b'{"a": "\\ud800"}') == {"a": "\ud800"}  # (the fallback)
