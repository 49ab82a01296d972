"""A small expression language over compare rows (`opdiff query OUT 'EXPR'`), parsed, never eval'd.

    q = Query.parse('module ~ "layers.1" and result == "error"')
    q.matches(row)                 # row: anything with the fields as attributes (a TensorRow)

Grammar (keywords and field names are case-sensitive)::

    expr    := and ("or" and)*
    and     := not ("and" not)*
    not     := "not" not | "(" expr ")" | compare
    compare := field [OP value]         a field alone: true when set (not null, 0, "" or empty)
    OP      := == | != | < | <= | > | >= | ~ (regex search) | !~ | in
    value   := number | "text" | 'text' | true | false | null | [value, ...]  (after in);
               in text \\" \\' and \\\\ are a quote and a backslash, any other backslash stays
               (a regular expression's "layers\\.1" is written as it is)
    field   := a row field (`FIELDS`) or `name`, then .key or ."key with spaces" into a
               dict field: metrics.Cosine, metrics."One Thousandth Err Ratio", target_stats.max

A comparison with a missing value (null, an absent metric, NaN) is false, except `== null` and
`!= null`; comparing a number with text is false. Errors in an expression are `QueryError`s
(one line, exit 2 on the command line), raised before any row is read.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ..comparison.result import TensorRow
from ..errors import OpdiffError

FIELDS = tuple(TensorRow.__dataclass_fields__) + ("name",)
OPS = ("==", "!=", "<=", ">=", "<", ">", "!~", "~", "in")
_TOKEN = re.compile(r"""\s*(?:
    (?P<number>-?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<op>==|!=|<=|>=|!~|<|>|~)
  | (?P<punct>[()\[\],.])
  | (?P<word>[A-Za-z_][A-Za-z_0-9]*)
)""", re.X)
_KEYWORDS = {"and", "or", "not", "in", "true", "false", "null"}
_CONSTANTS = {"true": True, "false": False, "null": None}


class QueryError(OpdiffError):
    """An expression that does not parse or names no field."""


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    at: int


def _tokens(text: str) -> list[_Tok]:
    out, i = [], 0
    while i < len(text):
        if text[i:].strip() == "":
            break
        m = _TOKEN.match(text, i)
        if m is None or m.end() == i:
            raise QueryError(f"cannot read the expression at column {i + 1}: {text[i:i + 20]!r}")
        kind = m.lastgroup or ""
        out.append(_Tok(kind, m.group(kind), m.start(kind)))
        i = m.end()
    return out


def _unquote(s: str) -> str:
    body = s[1:-1]
    return re.sub(r"""\\(["'\\])""", lambda m: m.group(1), body)


Pred = Callable[[Any], bool]


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = _tokens(text)
        self.i = 0

    def peek(self, *texts: str) -> Optional[_Tok]:
        tok = self.toks[self.i] if self.i < len(self.toks) else None
        if tok is not None and texts and tok.text not in texts:
            return None
        return tok

    def take(self, what: str) -> _Tok:
        tok = self.peek()
        if tok is None:
            raise QueryError(f"the expression ends where {what} was expected")
        self.i += 1
        return tok

    def fail(self, tok: _Tok, what: str) -> QueryError:
        return QueryError(f"expected {what} at column {tok.at + 1}, found {tok.text!r}")

    def parse(self) -> Pred:
        if not self.toks:
            raise QueryError("the expression is empty")
        pred = self.expr()
        if self.peek() is not None:
            raise self.fail(self.toks[self.i], "'and', 'or' or the end")
        return pred

    def expr(self) -> Pred:
        parts = [self.conj()]
        while self.peek("or"):
            self.i += 1
            parts.append(self.conj())
        return parts[0] if len(parts) == 1 else (lambda row: any(p(row) for p in parts))

    def conj(self) -> Pred:
        parts = [self.neg()]
        while self.peek("and"):
            self.i += 1
            parts.append(self.neg())
        return parts[0] if len(parts) == 1 else (lambda row: all(p(row) for p in parts))

    def neg(self) -> Pred:
        if self.peek("not"):
            self.i += 1
            inner = self.neg()
            return lambda row: not inner(row)
        if self.peek("("):
            self.i += 1
            inner = self.expr()
            tok = self.take("')'")
            if tok.text != ")":
                raise self.fail(tok, "')'")
            return inner
        return self.compare()

    def field(self) -> Callable[[Any], Any]:
        tok = self.take("a field name")
        if tok.kind != "word" or tok.text in _KEYWORDS:
            raise self.fail(tok, "a field name")
        if tok.text not in FIELDS:
            raise QueryError(f"no field {tok.text!r}; fields: {', '.join(FIELDS)}")
        name, keys = tok.text, []
        while self.peek("."):
            self.i += 1
            key = self.take("a key after '.'")
            if key.kind == "string":
                keys.append(_unquote(key.text))
            elif key.kind in ("word", "number"):
                keys.append(key.text)
            else:
                raise self.fail(key, "a key after '.'")

        def get(row: Any) -> Any:
            v = (row.target_name or row.golden_name) if name == "name" else getattr(row, name, None)
            for k in keys:
                v = v.get(k) if isinstance(v, dict) else None
            return v
        return get

    def value(self) -> Any:
        tok = self.take("a value")
        if tok.kind == "number":
            return float(tok.text) if any(c in tok.text for c in ".eE") else int(tok.text)
        if tok.kind == "string":
            return _unquote(tok.text)
        if tok.kind == "word" and tok.text in _CONSTANTS:
            return _CONSTANTS[tok.text]
        raise self.fail(tok, "a number, a quoted text, true, false or null")

    def compare(self) -> Pred:
        get = self.field()
        op = self.peek(*OPS)
        if op is None:
            return lambda row: bool(_present(get(row)))
        self.i += 1
        if op.text == "in":
            tok = self.take("'['")
            if tok.text != "[":
                raise self.fail(tok, "'[' after in")
            values = [self.value()]
            while self.peek(","):
                self.i += 1
                values.append(self.value())
            tok = self.take("']'")
            if tok.text != "]":
                raise self.fail(tok, "']'")
            return lambda row: _present(get(row)) is not None and get(row) in values
        value = self.value()
        if op.text in ("~", "!~"):
            if not isinstance(value, str):
                raise QueryError(f"'{op.text}' takes a quoted regular expression")
            try:
                pattern = re.compile(value)
            except re.error as exc:
                raise QueryError(f"bad regular expression {value!r}: {exc}") from None
            want = op.text == "~"
            return lambda row: isinstance(get(row), str) and bool(pattern.search(get(row))) == want
        return _comparison(get, op.text, value)


def _present(v: Any) -> Any:
    """v, or None where it is missing (null or NaN)."""
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _comparison(get: Callable[[Any], Any], op: str, value: Any) -> Pred:
    if value is None:
        if op not in ("==", "!="):
            raise QueryError(f"null compares only with == and !=, not {op}")
        return (lambda row: _present(get(row)) is None) if op == "==" else \
            (lambda row: _present(get(row)) is not None)

    def number(v: Any) -> bool:
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def test(row: Any) -> bool:
        v = _present(get(row))
        if v is None:
            return False
        if number(v) != number(value) or isinstance(v, bool) != isinstance(value, bool):
            return op == "!="
        if op == "==":
            return bool(v == value)
        if op == "!=":
            return bool(v != value)
        if isinstance(v, (list, tuple, dict)):
            return False
        return {"<": v < value, "<=": v <= value, ">": v > value, ">=": v >= value}[op]
    return test


class Query:
    """A parsed expression: `Query.parse(text).matches(row)`."""

    def __init__(self, text: str, pred: Pred) -> None:
        self.text = text
        self._pred = pred

    @classmethod
    def parse(cls, text: str) -> "Query":
        return cls(text, _Parser(text).parse())

    @classmethod
    def all_of(cls, texts: Sequence[str]) -> "Query":
        """Every expression of `texts` (empty: every row)."""
        preds = [_Parser(t).parse() for t in texts if t.strip()]
        return cls(" and ".join(f"({t})" for t in texts), lambda row: all(p(row) for p in preds))

    def matches(self, row: Any) -> bool:
        return self._pred(row)


__all__ = ["Query", "QueryError", "FIELDS", "OPS"]
