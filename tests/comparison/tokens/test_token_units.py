"""The pieces of comparison/tokens on their own: which dims a shape's rows and positions are
(never a head or hidden size that happens to equal the length), a row index renumbered, the cut
statistics, sequences found without a mask; and statistics dumps, which record no ids: said to
be "inconclusive", never compared row against row."""
from __future__ import annotations

import torch

import opdiff
from opdiff.comparison.result import Note, note_kind
from opdiff.comparison.tokens.sequences import INSIDE_ROW, Layout, Sequence, match
from opdiff.comparison.tokens.slicing import BROADCAST, ROW, Cut, agrees, cut_for, statistics


def _layout(batch: int, length: int, rows: list[tuple[int, ...]]) -> Layout:
    return Layout(batch, length, tuple(Sequence(r, tuple(range(length)), ids)
                                       for r, ids in enumerate(rows)), tuple(rows), False, "k")


TARGET = _layout(2, 8, [tuple(range(1, 9)), tuple(range(11, 19))])
GOLDEN = _layout(1, 8, [tuple(range(11, 19))])


def test_rows_and_positions_from_the_shape():
    assert cut_for([2, 8, 32], TARGET) == Cut(ROW, (1,))
    assert cut_for([2, 4, 8, 8], TARGET) == Cut(ROW, (2, 3))       # scores: query and key
    assert cut_for([1, 8, 16], TARGET) == Cut(BROADCAST, (1,))      # rotary tables
    assert cut_for([64, 32], TARGET) is None                        # a weight


def test_a_size_equal_to_the_length_is_cut_only_where_the_other_side_agrees():
    # head size 8 == length 8: the golden tensor keeps 8 there while its length is 8 too, but
    # where golden's length differs (12), golden's 8 shows the dim holds no positions
    long_golden = _layout(1, 12, [tuple(range(11, 23))])
    cut = cut_for([2, 4, 8, 8], TARGET)
    assert agrees(cut, [2, 4, 8, 8], (1, 4, 12, 8), TARGET, long_golden) == Cut(ROW, (2,))
    assert agrees(cut, [2, 4, 8, 8], (1, 4, 12, 12), TARGET, long_golden) == Cut(ROW, (2, 3))
    # a lead of the batch size that the other side holds as is: not the batch
    assert agrees(Cut(ROW, ()), [2, 8 + 1], (2, 9), TARGET, GOLDEN) is None


def test_cut_values_a_row_index_and_statistics():
    x = torch.arange(2 * 8 * 3, dtype=torch.float32).reshape(2, 8, 3)
    row = (Sequence(1, (2, 3, 4), (13, 14, 15)),)
    part = Cut(ROW, (1,)).apply(x, row, TARGET)
    assert torch.equal(part, x[1:2, 2:5])
    assert Cut(ROW, (1,)).shape([2, 8, 3], row) == [1, 3, 3]
    # which row a sequence sat in is layout: the batch's own index becomes the sequence's
    assert Cut(ROW, ()).apply(torch.arange(2), row, TARGET).tolist() == [0]
    stats = statistics(part)
    assert stats["max"] == float(part.max()) and stats["min"] == float(part.min())
    assert abs(stats["norm"] - float(part.double().norm())) < 1e-9 and stats["nan"] == 0


def test_a_sequence_found_inside_an_unmasked_padded_row():
    padded = _layout(1, 8, [(0, 0, 0, 5, 6, 7, 8, 9)])
    alone = Layout(1, 5, (Sequence(0, tuple(range(5)), (5, 6, 7, 8, 9)),),
                   ((5, 6, 7, 8, 9),), False, "k")
    found = match(alone, padded)
    assert len(found) == 1 and found[0].how == INSIDE_ROW
    assert found[0].target.positions == (3, 4, 5, 6, 7)


def test_statistics_dumps_of_other_layouts_are_inconclusive(token_dump):
    result = opdiff.compare(token_dump("right", task="statistics"),
                            token_dump("alone", task="statistics"), progress=False)
    said = [str(n) for n in result.notes if note_kind(n) == Note.INCONCLUSIVE]
    assert any("the runs lay their tokens out differently (ids [2, 12] against [1, 12])" in n
               and "neither dump holds saved input ids" in n for n in said)


def test_rows_of_one_layout_whose_ids_differ_are_other_data_not_another_layout(token_dump,
                                                                               tmp_path):
    # the same batch shape and mask, one row's tokens changed: the input is what differs, and
    # the compare says so as it would without token alignment (never "row 1 left out")
    from tokenkit import llama

    ids, mask = __import__("tokenkit").batch("right")
    ids = ids.clone()
    ids[1, 0] = (ids[1, 0] + 1) % 64
    model = llama()
    with torch.no_grad(), opdiff.dump(model, str(tmp_path / "other"), level="mix", task="tensor"):
        model(input_ids=ids, attention_mask=mask)
    result = opdiff.compare(tmp_path / "other", token_dump("right"), progress=False)
    assert not any("token layouts differ" in str(n) for n in result.notes)
    assert result.first_divergence is not None and result.first_divergence.origin == "input"
