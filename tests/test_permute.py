"""kohakuclip.read.permute: a seeded bijection on [0, n) evaluated per position."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kohakuclip.read.permute import permute
from kohakuclip.read.seeding import derive_seed, generator, seed_sequence


@pytest.mark.parametrize("n", [*range(0, 70), 127, 128, 129, 1000, 1023, 1024, 1025, 65537])
def test_every_small_n_is_a_bijection(n: int) -> None:
    out = permute(n, 7, np.arange(n))
    assert out.dtype == np.int64
    np.testing.assert_array_equal(np.sort(out), np.arange(n))


def test_large_n_is_a_bijection() -> None:
    n = 3_000_017
    out = permute(n, 1, np.arange(n))
    assert np.bincount(out, minlength=n).max() == 1
    assert out.min() == 0 and out.max() == n - 1


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5000), seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 1000))
def test_bijection_for_arbitrary_n_and_seed(n: int, seed: int, epoch: int) -> None:
    out = permute(n, (seed, epoch), np.arange(n))
    np.testing.assert_array_equal(np.sort(out), np.arange(n))


def test_positions_evaluate_independently_of_each_other() -> None:
    n = 10_007
    full = permute(n, 3, np.arange(n))
    rng = np.random.default_rng(0)
    picked = rng.integers(0, n, size=(5, 7))
    np.testing.assert_array_equal(permute(n, 3, picked), full[picked])
    assert permute(n, 3, 42).shape == ()
    assert int(permute(n, 3, 42)) == full[42]
    assert permute(n, 3, [n - 1]).tolist() == [full[n - 1]]


def test_huge_domains_need_no_table() -> None:
    n = 2**62
    pos = np.array([0, 1, 2, n - 2, n - 1], dtype=np.int64)
    out = permute(n, 9, pos)
    assert ((out >= 0) & (out < n)).all()
    assert len(set(out.tolist())) == len(pos)
    odd = 10**15 + 37  # not a power of two: exercises cycle-walking
    assert (permute(odd, 9, pos[:3]) < odd).all()


def test_seed_determines_the_order() -> None:
    n = 1000
    a = permute(n, 5, np.arange(n))
    np.testing.assert_array_equal(a, permute(n, 5, np.arange(n)))
    np.testing.assert_array_equal(a, permute(n, np.int64(5), np.arange(n)))
    others = [permute(n, s, np.arange(n)) for s in (6, (5, 0), (5, 1))]
    for other in others:
        assert (other != a).mean() > 0.9
    assert (a != np.arange(n)).mean() > 0.9


def test_each_value_is_equally_likely_over_seeds() -> None:
    # where position 0 lands over many seeds: a chi-square test against the uniform distribution
    n, trials = 10, 5000
    hits = np.bincount([int(permute(n, s, 0)) for s in range(trials)], minlength=n)
    expected = trials / n
    chi2 = float(((hits - expected) ** 2 / expected).sum())
    assert chi2 < 27.9  # 99.9th percentile of chi-square with 9 degrees of freedom


def test_adjacent_positions_are_decorrelated() -> None:
    n = 100_000
    out = permute(n, 11, np.arange(n)).astype(np.float64)
    corr = np.corrcoef(out[:-1], out[1:])[0, 1]
    assert abs(corr) < 0.02
    assert abs(np.corrcoef(np.arange(n), out)[0, 1]) < 0.02


@pytest.mark.parametrize(
    ("n", "positions", "error"),
    [
        (10, [10], ValueError),
        (10, [-1], ValueError),
        (0, [0], ValueError),
        (-1, [], ValueError),
        (2**62 + 1, [], ValueError),
        (10, [1.5], TypeError),
        (10.0, [1], TypeError),
        (True, [0], TypeError),
    ],
)
def test_bad_arguments_raise(n: object, positions: list, error: type) -> None:
    with pytest.raises(error):
        permute(n, 0, positions)  # type: ignore[arg-type]


def test_negative_seed_is_rejected() -> None:
    with pytest.raises(ValueError):
        permute(10, -1, [0])


def test_empty_positions() -> None:
    assert permute(0, 0, []).shape == (0,)
    assert permute(5, 0, np.zeros((0, 3), dtype=np.int64)).shape == (0, 3)


def test_seed_tuples_never_collide() -> None:
    # numpy's SeedSequence alone maps (5,) and (5, 0), or (2**32, 0) and (0, 1), to one stream
    tuples = [(5,), (5, 0), (5, 0, 0), (2**32, 0), (0, 1), (0, 2**32), (1, 0), (0, 0, 1)]
    draws = {t: generator(*t).integers(0, 2**63, size=4).tolist() for t in tuples}
    assert len({tuple(v) for v in draws.values()}) == len(tuples)
    assert generator(5, 0).integers(0, 2**63) == generator(5, 0).integers(0, 2**63)
    assert derive_seed(1, 2, 3) == derive_seed(1, 2, 3) != derive_seed(1, 2, 4)
    assert 0 <= derive_seed(2**64 - 1, 0) < 2**63


@pytest.mark.parametrize("parts", [(-1,), (2**64,), (1.0,), (True,)])
def test_bad_seed_parts_raise(parts: tuple) -> None:
    with pytest.raises((TypeError, ValueError)):
        seed_sequence(parts)
