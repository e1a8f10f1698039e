"""The console tools' line formats and client settings, without a broker: what `stratalog consume` prints
`stratalog produce` reads back as the same record, and bad input is refused with the line's fault."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stratalog.admin.connect import AdminError, client_settings, parse_pairs, read_properties
from stratalog.admin.record_format import Fields, Format, Record, RecordFormatError, parse_line, render

maybe_bytes = st.none() | st.binary(max_size=64)
records = st.builds(Record, value=maybe_bytes, key=maybe_bytes,
                    headers=st.lists(st.tuples(st.text(max_size=8), maybe_bytes), max_size=3).map(tuple),
                    partition=st.integers(0, 1000), timestamp_ms=st.integers(0, 1 << 45),
                    topic=st.just("t"), offset=st.integers(0, 1 << 40))


@given(records)
def test_a_json_line_reads_back_as_the_record_it_shows(record: Record) -> None:
    again = parse_line(render(record, Format.JSON), Format.JSON)
    assert (again.key, again.value, again.headers, again.partition, again.timestamp_ms) == \
        (record.key, record.value, record.headers, record.partition, record.timestamp_ms)


@given(st.binary(max_size=64), st.binary(max_size=64))
def test_a_hex_line_with_its_key_reads_back_as_the_record_it_shows(key: bytes, value: bytes) -> None:
    line = render(Record(value=value, key=key), Format.HEX, Fields(key=True))
    assert parse_line(line, Format.HEX, key_separator="\t") == Record(value=value, key=key)


@given(st.text(alphabet=st.characters(blacklist_characters="\t\r\n", blacklist_categories=("Cs",)), max_size=32),
       st.text(alphabet=st.characters(blacklist_characters="\r\n", blacklist_categories=("Cs",)), max_size=32))
def test_a_text_line_with_its_key_reads_back_as_the_record_it_shows(key: str, value: str) -> None:
    record = Record(value=value.encode(), key=key.encode())
    assert parse_line(render(record, Format.TEXT, Fields(key=True)), Format.TEXT, "\t") == record


def test_text_output_escapes_bytes_that_are_not_utf8_and_shows_null() -> None:
    record = Record(value=b"caf\xc3\xa9 \xff", key=None, headers=(("h", b"1"),), partition=2, offset=9,
                    timestamp_ms=5)
    assert render(record, Format.TEXT, Fields(offset=True, timestamp=True, key=True, headers=True)) == \
        "2:9\t5\tnull\th:1\tcafé \\xff"


def test_a_json_value_that_is_not_a_string_is_sent_as_its_json_text() -> None:
    assert parse_line('{"value": {"amount": 3, "to": "é"}}', Format.JSON).value == '{"amount":3,"to":"é"}'.encode()


@pytest.mark.parametrize(("line", "fmt", "separator", "error"), [
    ("no separator here", Format.TEXT, ":", "no key separator ':'"),
    ("zz", Format.HEX, None, "not hexadecimal"),
    ("{not json", Format.JSON, None, "not JSON"),
    ("[1, 2]", Format.JSON, None, "expected a JSON object a line"),
    ('{"key": 5}', Format.JSON, None, "key: expected a string or null"),
    ('{"value": "v", "partition": -1}', Format.JSON, None, "partition: expected a non-negative integer"),
    ('{"value": "v", "headers": {"a": "b"}}', Format.JSON, None, "headers: expected a list"),
    ('{"value": "v", "headers": [{"value": "b"}]}', Format.JSON, None, "a header: expected"),
    ('{"value_hex": "0g"}', Format.JSON, None, "not hexadecimal"),
])
def test_a_line_that_holds_no_record_is_refused_saying_why(line: str, fmt: Format, separator: str | None,
                                                           error: str) -> None:
    with pytest.raises(RecordFormatError, match=error):
        parse_line(line, fmt, separator)


def test_settings_come_from_the_file_then_x_then_bootstrap(tmp_path: Path) -> None:
    properties = tmp_path / "client.properties"
    properties.write_text("# a comment\nsecurity.protocol = SASL_SSL\nsasl.username: alice\n"
                          "bootstrap.servers=b1:9092\n\nsasl.password=a=b\n")
    assert read_properties(properties) == {"security.protocol": "SASL_SSL", "sasl.username": "alice",
                                           "bootstrap.servers": "b1:9092", "sasl.password": "a=b"}
    settings = client_settings(None, properties, parse_pairs(["sasl.username=bob"]))
    assert settings["sasl.username"] == "bob" and settings["bootstrap.servers"] == "b1:9092"
    assert client_settings("b2:9092", properties)["bootstrap.servers"] == "b2:9092"
    assert client_settings(None)["bootstrap.servers"] == "127.0.0.1:9092"


def test_bad_settings_are_refused_naming_the_fault(tmp_path: Path) -> None:
    properties = tmp_path / "client.properties"
    properties.write_text("security.protocol=SSL\njust a line\n")
    with pytest.raises(AdminError, match=r"client\.properties:2: expected name=value"):
        read_properties(properties)
    with pytest.raises(AdminError, match=r"-X 'linger\.ms': expected name=value"):
        parse_pairs(["linger.ms"])
    with pytest.raises(AdminError, match=r"sasl\.jaas\.config: Java client settings"):
        client_settings(None, overrides={"sasl.jaas.config": "x"})
