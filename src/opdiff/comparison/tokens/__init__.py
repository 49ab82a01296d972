"""The same tokens computed in another layout: a sequence alone against the same sequence as a
row of a padded batch (left or right), rows in another order.

One entry point, called before alignment with one step/rank pair's records::

    found = align_tokens(target_dump, golden_dump, target_records, golden_records)
    if found is not None:           # the sides lay out the same sequences differently
        target_records, golden_records = found.target_records, found.golden_records
        target_dump, golden_dump = found.target, found.golden     # tensors served cut
        notes += found.notes        # which sequences and positions were matched, and how

Each side's sequences come from its recorded input ids (`sequences.py`: the embedding's integer
input and the `attention_mask` input), matched by their real tokens; every activation is cut to
the matched sequences' rows and real positions (`slicing.py`, through the tensors' own recorded
shapes), so padding and masked positions never count. Statistics dumps record no ids: there the
sides are compared as recorded, and a note says why they cannot be aligned.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal, Optional, Union, cast

from ...errors import OpdiffError
from ...store.schema import Record
from ...store.source import DumpSource
from ..result import Divergence, Note, TensorRow
from .rewrite import rewrite, shapes_by_place
from .given import TokenIds
from .sequences import INSIDE_ROW, SAME_IDS, Layout, Match, Sequence, first_ids, given_layout, \
    match, read_layout
from .source import SlicedSource
from .decode import PREFIX, Decoded, decode_alignment
from .ties import generated_split
from .where import TokenErrors, token_errors, token_positions

log = logging.getLogger("opdiff")


@dataclass(frozen=True)
class TokenFacts:
    """What the alignment matched: each side's layout (rows x positions), the matched sequences
    (golden's row and positions, target's, and how), and the rows left without a partner."""

    golden: tuple[int, int]
    target: tuple[int, int]
    matches: tuple[Match, ...]
    golden_left: tuple[Sequence, ...]
    target_left: tuple[Sequence, ...]
    decoding: str = ""                  # "target" or "golden": the side that decoded, if one did
    passes: tuple[int, ...] = ()        # its tokens per forward pass (prefill, decode steps)

    def sentence(self) -> str:
        if self.decoding:
            other = "golden" if self.decoding == "target" else "target"
            m = self.matches[0]
            one = m.golden if other == "golden" else m.target
            return (f"token layouts differ: the {self.decoding} ran {len(self.passes)} forward "
                    f"passes through its KV cache ({' + '.join(map(str, self.passes))} tokens), "
                    f"the {other} one forward of row {one.row} {_span(one.positions)} holding "
                    f"the same tokens first ({m.how}); each pass is compared with the {other}'s "
                    f"forward cut to that pass's tokens (a key's dim: every token so far)")
        said = "; ".join(f"golden row {m.golden.row} {_span(m.golden.positions)} = target row "
                         f"{m.target.row} {_span(m.target.positions)} ({m.how})"
                         for m in self.matches)
        left = [f"{side} row {s.row} ({len(s.tokens)} tokens)" for side, rows in
                (("golden", self.golden_left), ("target", self.target_left)) for s in rows]
        tail = f"; not compared, no partner on the other side: {', '.join(left)}" if left else ""
        return (f"token layouts differ (target {self.target[0]} x {self.target[1]}, golden "
                f"{self.golden[0]} x {self.golden[1]} rows x positions): only the real tokens of "
                f"the same sequences are compared, padding never: {said}{tail}")


def _span(positions: tuple[int, ...]) -> str:
    if positions and positions == tuple(range(positions[0], positions[-1] + 1)):
        return f"positions {positions[0]}-{positions[-1]}"
    return "positions " + ",".join(map(str, positions))


@dataclass
class TokenAlignment:
    """Both sides rewritten to the matched sequences' real tokens (see the module docstring)."""

    target: DumpSource
    golden: DumpSource
    target_records: list[Record]
    golden_records: list[Record]
    facts: Optional[TokenFacts]
    notes: list[Note] = field(default_factory=list)

    def where(self, divergence: Optional[Divergence], rows: list[TensorRow]) -> list[Note]:
        """The token positions at which the first divergence's output differs, as a note."""
        if divergence is None or self.facts is None or not self.facts.matches:
            return []
        try:
            said = token_positions(divergence, rows, self.target, self.golden,
                                   self.facts.matches)
        except Exception as exc:    # a sentence for people: never the reason a compare fails
            log.warning("opdiff: cannot say at which tokens %s differs (%s)", divergence.name, exc)
            return []
        return [Note(said, Note.PAIRING)] if said else []

    def errors(self, rows: list[TensorRow]) -> Optional[TokenErrors]:
        """Each layer output's error per token of the first matched sequence (`where.py`)."""
        if self.facts is None or not self.facts.matches or self.facts.decoding:
            return None
        try:
            return token_errors(rows, self.target, self.golden, self.facts.matches)
        except Exception as exc:    # a picture for people: never the reason a compare fails
            log.warning("opdiff: cannot measure the error per token (%s)", exc)
            return None


def _same_layout(golden: Layout, target: Layout) -> bool:
    return golden.ids == target.ids and [s.positions for s in golden.rows] == \
        [s.positions for s in target.rows]


def align_tokens(target: DumpSource, golden: DumpSource, t_records: list[Record],
                 g_records: list[Record], given: Optional[TokenIds] = None
                 ) -> Optional[TokenAlignment]:
    """Both sides cut to the same token sequences, or None where there is nothing to align
    (the same layout on both sides, or ids recorded on neither). given: ids from a file
    (`given.py`), for the sides whose dumps did not save theirs."""
    try:
        if given is not None:
            found = _given(target, golden, t_records, g_records, given)
            if found is not False:
                return cast(Optional[TokenAlignment], found)
        return _align(target, golden, t_records, g_records)
    except OpdiffError:
        raise
    except Exception as exc:    # the dumps compared as recorded, and the compare says why
        log.warning("opdiff: token alignment failed: %r", exc)
        return TokenAlignment(target, golden, t_records, g_records, None, [Note(
            f"inconclusive: the two runs' token layouts could not be aligned ({exc!r}); "
            f"compared as recorded", Note.INCONCLUSIVE)])


def _align(target: DumpSource, golden: DumpSource, t_records: list[Record],
           g_records: list[Record]) -> Optional[TokenAlignment]:
    t_layout, g_layout = read_layout(target, t_records), read_layout(golden, g_records)
    if t_layout is None or g_layout is None:
        return _unaligned(target, golden, t_records, g_records, t_layout, g_layout)
    split = _split(target, golden, t_records, g_records)
    if _same_layout(g_layout, t_layout):
        return TokenAlignment(target, golden, t_records, g_records, None, split) if split \
            else None
    decoded = decode_alignment(target, golden, t_records, g_records, t_layout, g_layout)
    if decoded is not None:
        return _decoded(target, golden, t_records, g_records, decoded)
    matches = match(g_layout, t_layout)
    if not matches:
        return TokenAlignment(target, golden, t_records, g_records, None, split) if split \
            else None       # other inputs, not another layout: compared as recorded
    used_g = {m.golden.row for m in matches}
    used_t = {m.target.row for m in matches}
    if (g_layout.batch, g_layout.length) == (t_layout.batch, t_layout.length) and \
            g_layout.masked == t_layout.masked and \
            (len(used_g) < g_layout.batch or len(used_t) < t_layout.batch):
        return None     # one layout, rows whose ids differ: other data, compared as recorded
    facts = TokenFacts((g_layout.batch, g_layout.length), (t_layout.batch, t_layout.length),
                       tuple(matches), tuple(s for s in g_layout.rows if s.row not in used_g),
                       tuple(s for s in t_layout.rows if s.row not in used_t))
    t_side = SlicedSource(target, [], t_layout, [m.target for m in matches])
    g_side = SlicedSource(golden, [], g_layout, [m.golden for m in matches])
    t_new = rewrite(t_side, t_records, shapes_by_place(g_records), g_layout)
    g_new = rewrite(g_side, g_records, shapes_by_place(t_records), t_layout)
    t_side.keep(t_new)
    g_side.keep(g_new)
    notes = [Note(facts.sentence(), Note.PAIRING)] + split
    if facts.golden_left and facts.target_left:
        notes.append(Note(
            f"inconclusive: {len(facts.golden_left)} golden and {len(facts.target_left)} target "
            f"sequence(s) have no partner with the same tokens: their inputs may differ, and "
            f"they are not compared", Note.INCONCLUSIVE))
    return TokenAlignment(t_side, g_side, t_new, g_new, facts, notes)


def _split(target: DumpSource, golden: DumpSource, t_records: list[Record],
           g_records: list[Record]) -> list[Note]:
    """Where the runs' generated tokens part, a tie or a real split (`ties.py`), as a note."""
    try:
        found = generated_split(target, golden, t_records, g_records)
    except Exception as exc:    # a sentence for people: never the reason a compare fails
        log.warning("opdiff: cannot tell whether the generated tokens' split is a tie (%s)", exc)
        return []
    return [found] if found is not None else []


def _decoded(target: DumpSource, golden: DumpSource, t_records: list[Record],
             g_records: list[Record], decoded: Decoded) -> TokenAlignment:
    total = sum(decoded.lengths)
    steps = Sequence(0, tuple(range(total)), decoded.one.tokens)
    pair = Match(decoded.one, steps, PREFIX) if decoded.many == "target" else \
        Match(steps, decoded.one, PREFIX)
    facts = TokenFacts((0, 0), (0, 0), (pair,), (), (), decoded.many, decoded.lengths)
    if decoded.many == "target":
        found = TokenAlignment(decoded.many_source, decoded.source, decoded.many_records,
                               decoded.records, facts)
    else:
        found = TokenAlignment(decoded.source, decoded.many_source, decoded.records,
                               decoded.many_records, facts)
    found.notes.append(Note(facts.sentence(), Note.PAIRING))
    return found


def _given(target: DumpSource, golden: DumpSource, t_records: list[Record],
           g_records: list[Record], given: TokenIds) -> Union[TokenAlignment, None, Literal[False]]:
    """With ids given for a side that saved none: what the layouts allow a statistics dump
    (False: each side saved its own ids, aligned from them)."""
    layouts = []
    for side, dump, records in (("target", target, t_records), ("golden", golden, g_records)):
        recorded = read_layout(dump, records)
        if recorded is not None:
            layouts.append(recorded)
            continue
        ids, mask = given.side(side)
        shape = _ids_shape(records)
        if shape is not None and shape != (len(ids), len(ids[0])):
            raise OpdiffError(f"{given.path}: the {side}'s ids are {len(ids)} x {len(ids[0])}, "
                              f"its dump's {' x '.join(map(str, shape))}: ids of another run?")
        layouts.append(given_layout(ids, mask))
    if all(layout.ids_key for layout in layouts):
        return False
    t_layout, g_layout = layouts
    words = f"(ids from {given.path})"
    if _same_layout(g_layout, t_layout):
        return TokenAlignment(target, golden, t_records, g_records, None, [Note(
            f"the same token sequences in the same layout on both sides {words}: compared as "
            f"recorded", Note.PAIRING)])
    matches = match(g_layout, t_layout)
    if not matches:
        return None         # other inputs: compared as recorded
    if sorted(zip(g_layout.ids, [s.positions for s in g_layout.rows])) == \
            sorted(zip(t_layout.ids, [s.positions for s in t_layout.rows])):
        return TokenAlignment(target, golden, t_records, g_records, None, [Note(
            f"the same rows of tokens in another order {words}: a tensor's statistics over every "
            f"row are the same in any order, so they are compared as recorded", Note.PAIRING)])
    facts = TokenFacts((g_layout.batch, g_layout.length), (t_layout.batch, t_layout.length),
                       tuple(matches), (), ())
    said = facts.sentence().split(": ", 1)[-1].split("; not compared")[0]
    return TokenAlignment(target, golden, t_records, g_records, None, [Note(
        f"inconclusive: the runs lay the same tokens out differently {words}: {said}; a "
        f"statistics dump holds each tensor's statistics over every row and position, which "
        f"cannot be cut to these tokens; record both with task=\"tensor\" to compare them",
        Note.INCONCLUSIVE)])


def _unaligned(target: DumpSource, golden: DumpSource, t_records: list[Record],
               g_records: list[Record], t_layout: Optional[Layout],
               g_layout: Optional[Layout]) -> Optional[TokenAlignment]:
    """One side or both without recorded ids: where the embeddings' shapes show other layouts,
    say so ("inconclusive: ..."), compared as recorded."""
    t_shape, g_shape = _ids_shape(t_records), _ids_shape(g_records)
    if t_shape is None or g_shape is None or t_shape == g_shape:
        return None
    missing = [side for side, layout in (("target", t_layout), ("golden", g_layout))
               if layout is None]
    which = "neither dump holds" if len(missing) == 2 else f"the {missing[0]} dump holds no"
    note = (f"inconclusive: the runs lay their tokens out differently (ids {list(t_shape)} "
            f"against {list(g_shape)}) and {which} saved input ids, so "
            f"the same tokens cannot be found on both sides; record both with task=\"tensor\" "
            f"(or give the ids: opdiff compare --token-ids FILE)")
    return TokenAlignment(target, golden, t_records, g_records, None,
                          [Note(note, Note.INCONCLUSIVE)])


def _ids_shape(records: list[Record]) -> Optional[tuple[int, ...]]:
    desc = first_ids(records)
    return tuple(desc.get("shape") or ()) if desc is not None else None


__all__ = ["align_tokens", "TokenAlignment", "TokenFacts", "TokenIds", "TokenErrors", "Match", "Sequence",
           "SAME_IDS", "INSIDE_ROW"]
