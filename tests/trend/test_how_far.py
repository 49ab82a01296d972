"""`opdiff trend` says a doubling is a doubling ("is 2 times golden's"), not "differs by
5.0e-01 (relative)"."""
from opdiff.trend.divergence import Departure, how_far
from opdiff.trend.layout import Slot


def test_a_factor_is_said_as_a_factor():
    assert how_far(1.2, 0.6, 0.5).startswith("is 2 times golden's (1.2 in target vs 0.6")
    assert how_far(0.3, 0.6, 0.5).startswith("is 0.5 times golden's")


def test_a_small_change_is_a_percentage_and_a_sign_change_the_relative_size():
    assert how_far(1.01, 1.0, 0.0099).startswith("differs by 1.00% (1.01 in target")
    assert how_far(-1.0, 1.0, 2.0).startswith("differs by 2.0e+00 of its size")


def test_the_departure_reason_uses_it():
    slot = Slot(column="loss", name="loss", quantity="loss", phase="loss", position=0)
    d = Departure(step=30, slot=slot, relative_difference=0.5, sigma=40.0, baseline=(0, 29),
                  exact_before=False, target_value=2.0, golden_value=1.0)
    assert "is 2 times golden's" in d.reason and "(relative)" not in d.reason
