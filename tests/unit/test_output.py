"""ctxctl's output helper (clients/ctxclient/_output.py): one result printed as a table,
plain rows, TSV or JSON by ``--format``, its notes where each format wants them."""

from __future__ import annotations

from typing import Any

import pytest
from rich.console import Console

from ctxclient._output import (
    Column,
    Fields,
    Lines,
    Listing,
    Note,
    Output,
    Part,
    Raw,
    Stderr,
    cell,
)


def output(chosen: str | None, headers: bool = True) -> Output:
    return Output(Console(width=40, color_system=None, force_terminal=False), chosen, headers)


def things(empty: str = "no things") -> Listing:
    listing = Listing((Column("id"), Column("title", wrap=True), Column("n", right=True)),
                      title="things", empty=empty)
    listing.rows += [[cell("a1"), cell("tab\there and a long title that wraps"), cell("7")],
                     [cell("b22"), cell(""), cell("1,024")]]
    return listing


RESULT = {"things": [{"id": "a1", "n": 7}, {"id": "b22", "n": 1024}], "more": None,
          "title": "tab\there é"}


def printed(capsys: pytest.CaptureFixture[str], out: Output, value: Any,
            *parts: Part) -> tuple[str, str]:
    out.emit(value, *parts)
    captured = capsys.readouterr()
    return captured.out, captured.err


def test_json_is_the_result_whatever_the_parts(capsys: pytest.CaptureFixture[str]) -> None:
    assert printed(capsys, output("json"), RESULT, things(), Note("(a note)"),
                   Stderr("ctxctl: a warning")) == (
        '{\n  "things": [\n    {\n      "id": "a1",\n      "n": 7\n    },\n    {\n'
        '      "id": "b22",\n      "n": 1024\n    }\n  ],\n  "more": null,\n'
        '  "title": "tab\\there é"\n}\n', "")


def test_a_stream_prints_one_json_object_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    out = output("json")
    out.emit(RESULT, things(), one_line=True)
    out.row({"seq": 1}, ["ignored", "fields"])
    assert capsys.readouterr().out == (
        '{"things":[{"id":"a1","n":7},{"id":"b22","n":1024}],"more":null,'
        '"title":"tab\\there é"}\n{"seq":1}\n')


def test_plain_aligns_rows_and_notes_go_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    assert printed(capsys, output("plain"), RESULT, things(), Note("(a note)"),
                   Stderr("ctxctl: a warning")) == (
        "ID   TITLE                                     N\n"
        "a1   tab here and a long title that wraps      7\n"
        "b22  -                                     1,024\n",
        "(a note)\nctxctl: a warning\n")
    assert printed(capsys, output("plain", headers=False), RESULT, things())[0] == (
        "a1   tab here and a long title that wraps      7\n"
        "b22  -                                     1,024\n")


def test_tsv_keeps_whole_cells_escaped(capsys: pytest.CaptureFixture[str]) -> None:
    assert printed(capsys, output("tsv"), RESULT, things(), Note("(a note)")) == (
        "id\ttitle\tn\na1\ttab\\there and a long title that wraps\t7\nb22\t\t1,024\n",
        "(a note)\n")
    assert printed(capsys, output("tsv", headers=False), RESULT, things())[0] == (
        "a1\ttab\\there and a long title that wraps\t7\nb22\t\t1,024\n")


def test_a_table_fits_the_terminal_with_its_notes_under_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert printed(capsys, output("table"), RESULT, things(), Note("(a note)"),
                   Stderr("ctxctl: a warning")) == (
        "things                                  \n"
        "┏━━━━━┳━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━┓\n"
        "┃ id  ┃ title                  ┃     n ┃\n"
        "┡━━━━━╇━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━┩\n"
        "│ a1  │ tab     here and a     │     7 │\n"
        "│     │ long title that wraps  │       │\n"
        "│ b22 │                        │ 1,024 │\n"
        "└─────┴────────────────────────┴───────┘\n"
        "(a note)\n", "ctxctl: a warning\n")


def test_the_default_format_is_a_table_on_a_terminal_only() -> None:
    assert output(None).format == "plain"
    terminal = Output(Console(force_terminal=True), None)
    assert (terminal.format, terminal.json) == ("table", False)


@pytest.mark.parametrize(("chosen", "expected"), [
    ("table", ("no things\n", "")), ("plain", ("", "no things\n")),
    ("tsv", ("", "no things\n")), ("json", ('{\n  "things": []\n}\n', ""))])
def test_an_empty_listing_says_so_where_the_format_wants_it(
        capsys: pytest.CaptureFixture[str], chosen: str, expected: tuple[str, str]) -> None:
    empty = things()
    empty.rows.clear()
    assert printed(capsys, output(chosen), {"things": []}, empty) == expected


@pytest.mark.parametrize(("chosen", "expected"), [
    ("table", "name         x    \nlonger name  multi\n             line \n"),
    ("plain", "name         x\nlonger name  multi line\n"),
    ("tsv", "name\tx\nlonger name\tmulti\\nline\n"),
    ("json", '{\n  "name": "x"\n}\n')])
def test_fields_are_shown_whole_without_a_header(capsys: pytest.CaptureFixture[str],
                                                 chosen: str, expected: str) -> None:
    fields = Fields([("name", "x"), ("longer name", "multi\nline")])
    assert printed(capsys, output(chosen), {"name": "x"}, fields) == (expected, "")


@pytest.mark.parametrize("chosen", ["plain", "tsv"])
def test_lines_and_raw_text_are_written_as_they_are(capsys: pytest.CaptureFixture[str],
                                                    chosen: str) -> None:
    assert printed(capsys, output(chosen), None, Lines(["[user]\nhi", ""]),
                   Raw("no newline\tadded")) == ("[user]\nhi\n\nno newline\tadded", "")


def test_on_a_terminal_a_note_after_raw_text_starts_its_own_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert printed(capsys, output("table"), None, Raw("a page that stops mid-"),
                   Note("(more: --offset 22)")) == (
        "a page that stops mid-\n(more: --offset 22)\n", "")
    assert printed(capsys, output("table"), None, Raw("whole lines\n"), Note("(end)")) == (
        "whole lines\n(end)\n", "")


@pytest.mark.parametrize(("chosen", "expected"), [
    ("table", "12:00  7  a.b  -  {\"x\":\"a\\tb\"}\n"),
    ("plain", "12:00  7  a.b  -  {\"x\":\"a\\tb\"}\n"),
    ("tsv", "12:00\t7\ta.b\t-\t{\"x\":\"a\\tb\"}\n"),
    ("json", '{"seq":7}\n')])
def test_a_streamed_row_is_printed_as_it_is(capsys: pytest.CaptureFixture[str], chosen: str,
                                            expected: str) -> None:
    # Events: TSV fields are not escaped (the data is compact JSON, already escaped).
    output(chosen).row({"seq": 7}, ["12:00", "7", "a.b", "-", '{"x":"a\\tb"}'])
    assert capsys.readouterr().out == expected


def test_text_parts_are_left_out_of_json(capsys: pytest.CaptureFixture[str]) -> None:
    output("json").text(Lines(["only in text"]), Stderr("nor this"))
    output("plain").text(Lines(["in text"]), Stderr("and this"))
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("in text\n", "and this\n")
