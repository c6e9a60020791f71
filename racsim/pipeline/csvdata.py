"""The CSV files a user gives racsim (measured latencies, arrival traces, probe pairs), read alike.

Lines starting with ``#`` and blank lines are skipped (as in fault schedules); the header row is
optional for a file of one column (a first line of numbers is data); the header's names are taken
without surrounding spaces; only the column asked for is read (:func:`read_column`; the header alone
before it, :func:`first_fields`); and a bad value is named by its line in the file (:func:`line_of`),
found only when there is one (the file is read once by pandas otherwise).
"""

from __future__ import annotations

import csv
from typing import Iterator, List, Tuple

import pandas as pd

COMMENT = "#"


def _data_lines(path: str) -> Iterator[Tuple[int, str]]:
    """(line number from 1, text) of each line that is neither blank nor a comment."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            text = line.split(COMMENT, 1)[0]
            if text.strip():
                yield n, text


def _is_number(field: str) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def first_fields(path: str) -> List[str]:
    """The fields of the file's first data line, stripped (the header's names, when it has one), read as
    pandas reads a line (quotes and all) without reading any other line: a header of millions of names
    is read in a second. Raises EmptyDataError (as pandas) for a file without one."""
    first = next(_data_lines(path), None)
    if first is None:
        raise pd.errors.EmptyDataError("No columns to parse from file")
    return [f.strip() for f in next(csv.reader([first[1].rstrip("\r\n")]), [""])]


def has_header(fields: List[str]) -> bool:
    """Whether a first data line of ``fields`` names the columns: it does unless every field is a number."""
    return not all(_is_number(f.strip("\"'")) for f in fields)


def read_column(path: str, position: int, header: bool) -> pd.Series:
    """The file's column at ``position`` (0: the first), its header row skipped when it has one: pandas
    reads that column alone (``usecols``), however many the file has. Raises what pandas raises on an
    unreadable file (OSError, ValueError, UnicodeDecodeError, ParserError)."""
    df = pd.read_csv(path, comment=COMMENT, skip_blank_lines=True, header=0 if header else None, usecols=[position])
    return df.iloc[:, 0]


def line_of(path: str, row: int, header: bool) -> int:
    """The line of the file that holds data row ``row`` (0: the first row of values)."""
    for i, (n, _) in enumerate(_data_lines(path)):
        if i == row + int(header):
            return n
    raise IndexError(f"{path} has no data row {row}")
