"""The one way meshscope prints a table on the terminal, so that no name in it is ever cut.

Left to itself, rich shrinks the columns of a table wider than the terminal and cuts their cells
behind an ellipsis: ``all_r…``, ``reduc…``, ``optim…`` at 80 columns, an op, phase or configuration
that can no longer be read. Every printer therefore builds its tables here, the same way:

- every column is at least as wide as its longest word (header and cells alike), so a cell may wrap
  between words but never inside one: op, axis, phase, region and configuration names are single
  words; the columns named in `whole` (rank lists such as ``[0, 2]``) are at least as wide as their
  longest cell and never wrap at all;
- what the terminal has beyond those minimums goes to the columns whose cells would otherwise wrap,
  the narrowest first, so short cells stay on one line and long texts share the rest;
- when even the minimums do not fit, the table is printed in as few parts as they allow, one under
  the other, each repeating the first `key` columns (the ones that name a row), so that the rows of
  the parts line up;
- the one thing that still folds (continues on the next line, never behind an ellipsis) is a word
  wider than what the terminal leaves beside the key columns, such as a long token in a detail text.

Every console and every cell here prints text as it is, never as rich markup (`make_console`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from rich.cells import cell_len
from rich.console import Console
from rich.table import Table
from rich.text import Text

PIPE_WIDTH = 160
"""Columns when stdout is not a terminal and COLUMNS is unset: rich would assume 80, and split tables
that a file or a pipe has room for."""

_PAD = 2
"""rich's cell padding, one space either side."""
_RULE = 1
"""One vertical rule per column, plus the table's left edge."""


def make_console() -> Console:
    """The console of every printer: the terminal's width, or COLUMNS where it is set (for a pipe
    too: a width asked for is kept), else `PIPE_WIDTH`.

    Markup and emoji codes are off. Most of what meshscope prints came from a job: a rank's error, the
    lines it printed, its script and run directory, its mesh dim, group and module names, check details
    and notes. rich would read them as markup (``rich.markup.render``, rich 13-15): gloo's
    ``[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer``
    opens with what reads as a closing tag, so ``MarkupError`` ended the command where its verdict was
    due (issue 42); ``[bold]``, or a budget entry's rank class ``[dp=first, tp=other]``, reads as a style
    and vanishes. Emoji codes are a separate switch (rich replaces ``:smile:`` even in text printed with
    markup off). A printer that wants a colour prints a `Text` with a style."""
    wide = not Console().is_terminal and "COLUMNS" not in os.environ
    return Console(highlight=False, markup=False, emoji=False, width=PIPE_WIDTH if wide else None)


def print_table(console: Console, title: str, head: Sequence[str], rows: Iterable[Sequence], *,
                key: int = 1, whole: Iterable[str] = (), title_justify: str = "center") -> None:
    """Print `rows` under `head` within the console's width (module docstring: how, and why)."""
    # Text, not str, for every cell, head and title: the table then prints them as they are on any console,
    # one made elsewhere with markup on included (`make_console`: why)
    head = [Text(str(h)) for h in head]
    cells = [[c if isinstance(c, Text) else Text(str(c)) for c in row] for row in rows]
    whole = set(whole)
    need, want = [], []
    for i, name in enumerate(h.plain for h in head):
        column = [row[i].plain for row in cells]
        need.append(max([_longest_word(name), *map(_longest_line if name in whole else _longest_word, column)]))
        want.append(max([_longest_line(name), *map(_longest_line, column)]))
    key = min(key, len(head))
    # as few parts as the minimum widths allow; at the natural widths when those need no more parts
    parts = min(_parts(want, key, console.width), _parts(need, key, console.width), key=len)
    for n, part in enumerate(parts):
        room = console.width - (_PAD + _RULE) * len(part) - _RULE
        # the first part carries the whole title, the others its head (up to the first parenthesis)
        label = title if n == 0 else f"{title.split(' (')[0]} (continued, {n + 1} of {len(parts)})"
        # rich styles a str title "table.title" itself, and a Text title not at all
        table = Table(title=Text(label, style="table.title"), title_justify=title_justify, expand=False)
        for i, width in zip(part, _fit([need[i] for i in part], [want[i] for i in part], room)):
            table.add_column(head[i], width=width, overflow="fold")
        for row in cells:
            table.add_row(*(row[i] for i in part))
        console.print(table)


def _longest_word(text: str) -> int:
    return max((cell_len(w) for w in text.split()), default=0)


def _longest_line(text: str) -> int:
    return max((cell_len(line) for line in text.split("\n")), default=0)


def _parts(widths: list[int], key: int, width: int) -> list[list[int]]:
    """Column indices of each part at these column widths: the key columns, then as many of the
    others, in order, as fit in `width`."""
    def cost(cols):
        return sum(widths[i] + _PAD + _RULE for i in cols) + _RULE

    keys = list(range(key))
    parts, current = [], list(keys)
    for i in range(key, len(widths)):
        if len(current) > key and cost(current + [i]) > width:
            parts.append(current)
            current = [*keys]
        current.append(i)
    parts.append(current)
    return parts


def _fit(need: list[int], want: list[int], room: int) -> list[int]:
    """Column widths within `room`: the widest columns give way first, down to a common width and
    never below their minimum, so short cells stay on one line and the long texts share the rest;
    below the minimums (a word wider than the terminal) the widest column folds."""
    def at(level: int) -> list[int]:
        return [min(w, max(n, level)) for n, w in zip(need, want)]

    level = max(want, default=0)
    while level > 0 and sum(at(level)) > room:
        level -= 1
    widths = at(level)
    spare = room - sum(widths)
    for i in range(len(widths)):  # what the whole-number level leaves, to the columns still short
        grow = max(0, min(spare, want[i] - widths[i]))
        widths[i] += grow
        spare -= grow
    while sum(widths) > room and max(widths) > 1:
        widths[widths.index(max(widths))] -= 1
    return widths
