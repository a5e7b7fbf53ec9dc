"""A small PowerShell syntax check for the lines xtrain prints (there is no pwsh here).

It is not a PowerShell parser: it accepts exactly the constructs xtrain emits and rejects the rest,
so a new kind of fix line must be added here on purpose. Accepted, per line:

- ``# comment``
- ``$env:NAME = "text"`` / ``'text'`` / ``(Cmdlet -Param value).Property``
- ``Remove-Item Env:NAME``
- a command: ``& 'C:\\path with space\\python.exe' args`` or ``word args``; args are barewords
  without PowerShell metacharacters, '...' strings (quote chars doubled, typographic ones too),
  or "..." strings (whose ``$(...)`` subexpressions are checked for balanced brackets)
- several of these joined by ``;`` (PowerShell 5.1 has no ``&&`` / ``||``)

``tokens`` also returns the literal value of each argument, so tests can check that a quoted
path reaches the program unchanged.
"""

from __future__ import annotations

import re

SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"
DOUBLE_QUOTES = '"\u201c\u201d\u201e'
# Characters that change meaning in an unquoted argument (array, splat, script block, redirect,
# pipeline, variable, subexpression, statement end, escape).
META = set(",@{}()<>|$;&`'\"") | set(SINGLE_QUOTES) | set(DOUBLE_QUOTES)
BAREWORD = re.compile(r"[^\s]+")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class PsSyntaxError(ValueError):
    pass


def _single(text: str, i: int) -> tuple[str, int]:
    """A '...' string starting at text[i]; returns (value, index after it)."""
    out, i = "", i + 1
    while i < len(text):
        ch = text[i]
        if ch in SINGLE_QUOTES:
            if i + 1 < len(text) and text[i + 1] in SINGLE_QUOTES:
                out += ch
                i += 2
                continue
            return out, i + 1
        out += ch
        i += 1
    raise PsSyntaxError(f"unterminated '...' string: {text}")


def _balanced(text: str, i: int, open_ch: str, close_ch: str) -> int:
    """Index after the bracket that closes text[i] (quotes inside are skipped)."""
    depth = 0
    while i < len(text):
        ch = text[i]
        if ch in SINGLE_QUOTES:
            _, i = _single(text, i)
            continue
        if ch in DOUBLE_QUOTES:
            _, i = _double(text, i)
            continue
        if ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise PsSyntaxError(f"unbalanced {open_ch}{close_ch}: {text}")


def _double(text: str, i: int) -> tuple[str, int]:
    """A "..." string at text[i]: backtick escapes, $(...) subexpressions and $env:NAME."""
    out, i = "", i + 1
    while i < len(text):
        ch = text[i]
        if ch == "`":
            if i + 1 >= len(text):
                raise PsSyntaxError("backtick at the end of a string")
            out += text[i + 1]
            i += 2
            continue
        if ch == "$":
            if text.startswith("$(", i):
                end = _balanced(text, i + 1, "(", ")")
                out += text[i:end]
                i = end
                continue
            m = re.match(r"\$env:([A-Za-z_]\w*)", text[i:])
            if not m:
                raise PsSyntaxError(f"$ in a double-quoted string expands a variable: {text}")
            out += m.group(0)
            i += len(m.group(0))
            continue
        if ch in DOUBLE_QUOTES:
            return out, i + 1
        out += ch
        i += 1
    raise PsSyntaxError(f'unterminated "..." string: {text}')


def split_statements(line: str) -> list[str]:
    """Top-level ``;``-separated statements (quotes and brackets respected)."""
    parts, cur, i = [], "", 0
    while i < len(line):
        ch = line[i]
        if ch in SINGLE_QUOTES:
            _, j = _single(line, i)
        elif ch in DOUBLE_QUOTES:
            _, j = _double(line, i)
        elif ch == "(":
            j = _balanced(line, i, "(", ")")
        elif ch == ";":
            parts.append(cur)
            cur, i = "", i + 1
            continue
        else:
            j = i + 1
        cur += line[i:j]
        i = j
    parts.append(cur)
    return [p.strip() for p in parts]


def _words(stmt: str) -> list[tuple[str, str]]:
    """(kind, literal value) per word: bare | single | double."""
    out, i = [], 0
    while i < len(stmt):
        ch = stmt[i]
        if ch.isspace():
            i += 1
            continue
        if ch in SINGLE_QUOTES:
            value, i = _single(stmt, i)
            out.append(("single", value))
        elif ch in DOUBLE_QUOTES:
            value, i = _double(stmt, i)
            out.append(("double", value))
        else:
            word = BAREWORD.match(stmt, i).group(0)  # type: ignore[union-attr]
            bad = sorted(set(word) & META)
            if bad:
                raise PsSyntaxError(f"unquoted {''.join(bad)!r} in {word!r} (statement: {stmt})")
            out.append(("bare", word))
            i += len(word)
        if i < len(stmt) and not stmt[i].isspace():
            raise PsSyntaxError(f"no space between arguments in: {stmt}")
    return out


def check_statement(stmt: str, commands: set[str]) -> list[tuple[str, str]]:
    """Raise PsSyntaxError unless ``stmt`` is one of the accepted forms; returns its words."""
    if not stmt:
        raise PsSyntaxError("empty statement")
    if "&&" in stmt or "||" in stmt:
        raise PsSyntaxError(f"Windows PowerShell 5.1 has no && or ||: {stmt}")
    m = re.match(r"^\$env:([A-Za-z_]\w*) = (.+)$", stmt)
    if m:
        value = m.group(2)
        if value[0] in SINGLE_QUOTES:
            v, end = _single(value, 0)
        elif value[0] in DOUBLE_QUOTES:
            v, end = _double(value, 0)
        elif value[0] == "(":
            end = _balanced(value, 0, "(", ")")
            if not re.fullmatch(r"\((Get-[A-Za-z]+)( -[A-Za-z]+ [\w.:]+)*\)(\.[A-Za-z]+)+", value):
                raise PsSyntaxError(f"unexpected expression: {value}")
            return [("assign", value)]
        else:
            raise PsSyntaxError(f'quote the value: $env:NAME = "value" ({stmt})')
        if value[end:].strip():
            raise PsSyntaxError(f"text after the value: {stmt}")
        return [("assign", v)]
    if stmt.startswith("&"):
        rest = stmt[1:]
        if not rest.startswith(" "):
            raise PsSyntaxError(f"& needs a space: {stmt}")
        words = _words(rest)
        if not words or words[0][0] == "bare":
            raise PsSyntaxError(f"& should call a quoted path: {stmt}")
        return words
    words = _words(stmt)
    name = words[0][1]
    if words[0][0] != "bare" or not (name in commands or re.search(r"(?i)python(\.exe)?$|^py$", name)):
        raise PsSyntaxError(f"{name!r} is not a command xtrain prints (prose?): {stmt}")
    return words


def check_line(line: str, commands: set[str]) -> list[list[tuple[str, str]]]:
    """Check one printed line; returns the words of each statement (comments: [])."""
    if line != line.strip():
        raise PsSyntaxError(f"leading/trailing space: {line!r}")
    if line.startswith("#"):
        if "\n" in line:
            raise PsSyntaxError("a comment spans lines")
        return []
    if line.endswith("`") or line.endswith("\\"):
        raise PsSyntaxError(f"continuation at the end of a fix line: {line}")
    return [check_statement(s, commands) for s in split_statements(line)]


def unquoted_commas(line: str) -> list[str]:
    """The arguments of a PowerShell command line that hold a comma outside quotes (and not
    escaped with a backtick): PowerShell reads ``--gpus 0,1`` as an array and hands a program
    ``0 1``, two arguments. Lenient where ``check_line`` is strict (doc lines hold more than
    xtrain's fix lines): quotes and ``(...)`` / ``{...}`` expressions are skipped, a ``#``
    comment ends the line. (A ``[`` inside a word is literal: ``key=[a,b]`` is an array too.)"""
    found, word, depth, i = [], "", 0, 0
    comma = False
    while i < len(line):
        ch = line[i]
        if ch == "`" and i + 1 < len(line):  # an escaped character is literal
            word += line[i : i + 2]
            i += 2
            continue
        if ch in SINGLE_QUOTES or ch in DOUBLE_QUOTES:
            close = SINGLE_QUOTES if ch in SINGLE_QUOTES else DOUBLE_QUOTES
            j = i + 1
            while j < len(line) and line[j] not in close:
                j += 1
            word += line[i : j + 1]
            i = j + 1
            continue
        if ch in "({":
            depth += 1
        elif ch in ")}":
            depth = max(0, depth - 1)
        elif depth == 0 and (ch.isspace() or ch == ";" or (ch == "#" and not word)):
            if comma:
                found.append(word)
            if ch == "#":
                return found
            word, comma = "", False
            i += 1
            continue
        elif depth == 0 and ch == ",":
            comma = True
        word += ch
        i += 1
    if comma:
        found.append(word)
    return found
