"""The CSV files a user gives racsim (measured latencies, arrival traces, probe pairs), read alike.

Lines starting with ``#`` and blank lines are skipped (as in fault schedules); the header row is
optional for a file of one column (a first line of numbers is data); the header's names are taken
without surrounding spaces; and a bad value is named by its line in the file (:func:`line_of`),
found only when there is one (the file is read once by pandas otherwise).
"""

from __future__ import annotations

from typing import Iterator, Tuple

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


def has_header(path: str) -> bool:
    """Whether the first data line names the columns: it does unless every field of it is a number."""
    first = next(_data_lines(path), None)
    return first is not None and not all(_is_number(f.strip().strip("\"'")) for f in first[1].split(","))


def read_table(path: str) -> Tuple[pd.DataFrame, bool]:
    """The file's rows (columns named by the header, stripped; by position 0, 1... without one) and
    whether it had a header. Raises what pandas raises on an unreadable file (OSError, ValueError,
    UnicodeDecodeError, ParserError)."""
    header = has_header(path)
    df = pd.read_csv(path, comment=COMMENT, skip_blank_lines=True, header=0 if header else None)
    if header:
        df.columns = [str(c).strip() for c in df.columns]
    return df, header


def line_of(path: str, row: int, header: bool) -> int:
    """The line of the file that holds data row ``row`` (0: the first row of values)."""
    for i, (n, _) in enumerate(_data_lines(path)):
        if i == row + int(header):
            return n
    raise IndexError(f"{path} has no data row {row}")
