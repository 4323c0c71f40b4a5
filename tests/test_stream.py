"""kohakuclip.read.stream: the global sample stream, weighted mixing, per-source epochs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kohakuclip.read.seeding import per_item_keys, uniforms
from kohakuclip.read.stream import SampleStream, mixture, sample_key, sample_rng


def items(stream: SampleStream, start: int, count: int) -> list[int]:
    return [d.item for d in stream.draw(start, count)]


@pytest.mark.parametrize("epochs", [False, True])
def test_a_sample_does_not_depend_on_how_the_stream_is_cut(epochs: bool) -> None:
    stream = SampleStream(9, [5, 11], [1.0, 3.0], epochs=epochs)
    whole = stream.draw(0, 60)
    fresh = SampleStream(9, [5, 11], [1.0, 3.0], epochs=epochs)
    pieces = [d for start in range(50, -10, -10) for d in fresh.draw(start, 10)]  # backwards
    pieces.sort(key=lambda d: d.sample)
    assert [(d.sample, d.source, d.item) for d in pieces] == [
        (d.sample, d.source, d.item) for d in whole
    ]
    # the per-sample Generator continues identically (it picks the frames next)
    assert [d.rng.random() for d in pieces] == [d.rng.random() for d in whole]
    random_draw = sample_rng(9, 7)
    if not epochs:
        random_draw.integers(int(stream.sizes[whole[7].source]))
    assert fresh.draw(7, 1)[0].rng.random() == random_draw.random()
    assert sample_key(9, 7) != sample_key(9, 8) != sample_key(10, 8)


def test_weights_set_the_proportions_within_statistical_bounds() -> None:
    weights = [1.0, 2.0, 5.0, 0.0]
    stream = SampleStream(4, [3, 50, 7, 0], weights)
    n = 200_000
    counts = np.bincount(stream.sources(0, n), minlength=4)
    for count, w in zip(counts, weights):
        p = w / sum(weights)
        sigma = math.sqrt(n * p * (1 - p))
        assert abs(count - n * p) <= 5 * sigma + 1e-9, (count, n * p)
    assert counts[3] == 0
    # draws of consecutive samples are independent: pairs follow the product distribution
    src = stream.sources(0, n)
    pairs = np.bincount(src[:-1] * 4 + src[1:], minlength=16).reshape(4, 4)[:3, :3]
    p = np.array(weights[:3]) / sum(weights)
    expected = (n - 1) * np.outer(p, p)
    chi2 = float(((pairs - expected) ** 2 / expected).sum())
    assert chi2 < 30  # 8 degrees of freedom: p ~ 2e-4
    # items are drawn within the chosen source, uniformly
    draws = stream.draw(0, 4000)
    for d in draws:
        first = int(stream.offsets[d.source])
        assert first <= d.item < first + int(stream.sizes[d.source])
    ones = np.bincount([d.item for d in draws if d.source == 1], minlength=53)[3:53]
    assert ones.min() > 0


def test_a_source_of_weight_0_is_never_picked_whatever_the_rounding() -> None:
    """Ten weights of 0.1 sum to 0.9999999999999999 of the total: the sliver of [0, 1) above
    goes to the last source with weight, never to the weight-0 source after it; a weight-0
    source between others is never picked either."""
    weights = [0.1] * 9 + [0.0, 0.1, 0.0]
    stream = SampleStream(5, [3] * len(weights), weights)
    edges = np.array([0.0, 0.1, 0.85, 0.9, 0.95, np.nextafter(1.0, 0.0)])
    assert stream._choose(edges).tolist() == [0, 1, 8, 10, 10, 10]
    assert set(stream.sources(0, 20_000).tolist()) == set(range(9)) | {10}


def test_epoch_mode_walks_each_source_once_per_epoch() -> None:
    sizes = [4, 9, 6]
    stream = SampleStream(2, sizes, [1.0, 1.0, 2.0], epochs=True)
    draws = stream.draw(0, 300)
    for k, n in enumerate(sizes):
        ids = [d.item - int(stream.offsets[k]) for d in draws if d.source == k]
        epochs = len(ids) // n
        assert epochs >= 4
        orders = np.array(ids[: epochs * n]).reshape(epochs, n)
        for order in orders:
            np.testing.assert_array_equal(np.sort(order), np.arange(n))
        assert len({tuple(o) for o in orders}) > 1
    sources = np.array([d.source for d in draws])
    for g in (300, 17, 250, 0, 299, 1):  # forward and back from the last count
        np.testing.assert_array_equal(stream.seen(g), np.bincount(sources[:g], minlength=3))


def test_a_restarted_stream_continues_per_source_epochs() -> None:
    straight = SampleStream(5, [3, 4], [1.0, 1.0], epochs=True)
    expected = items(straight, 0, 80)
    resumed = SampleStream(5, [3, 4], [1.0, 1.0], epochs=True)
    resumed.restart(37, straight.seen(37).tolist())
    assert items(resumed, 37, 43) == expected[37:]
    with pytest.raises(ValueError, match="before the resume point"):
        resumed.draw(36, 1)
    with pytest.raises(ValueError, match="add up"):
        resumed.restart(37, [1, 2])
    with pytest.raises(ValueError, match="2 sources"):
        resumed.restart(3, [3])


def test_new_weights_on_resume_keep_each_source_in_its_epoch() -> None:
    sizes = [5, 8]
    before = SampleStream(6, sizes, [1.0, 1.0], epochs=True)
    first = before.draw(0, 30)
    after = SampleStream(6, sizes, [1.0, 4.0], epochs=True)
    after.restart(30, before.seen(30).tolist())
    rest = after.draw(30, 90)
    for k, n in enumerate(sizes):
        ids = [d.item for d in first + rest if d.source == k]
        for e in range(len(ids) // n):
            assert sorted(ids[e * n : (e + 1) * n]) == list(
                range(sum(sizes[:k]), sum(sizes[: k + 1]))
            )
    assert sum(d.source for d in rest) > 0.6 * len(rest)  # the new weights apply


def test_one_source_epochs_are_permutations_of_positions() -> None:
    stream = SampleStream(1, [10], epochs=True)
    got = items(stream, 0, 30)
    for e in range(3):
        assert sorted(got[10 * e : 10 * e + 10]) == list(range(10))
    np.testing.assert_array_equal(stream.seen(1234), [1234])


@pytest.mark.parametrize("version", [1, 2])
def test_epoch_orders_are_keyed_apart_from_the_samples_generators(version: int) -> None:
    """Version 2 keys each source's epoch order (seed, epoch tag, source, epoch): the order of
    source 1 in epoch e no longer shares its seed with sample e's generator, (seed, 1, e),
    as in version 1, which resumed runs of states saved before keep."""
    from kohakuclip.read.permute import permute
    from kohakuclip.read.seeding import seed_sequence

    seed, sizes = 7, [5, 6]
    stream = SampleStream(seed, sizes, [1.0, 1.0], epochs=True, version=version)
    draws = stream.draw(0, 60)
    for k, n in enumerate(sizes):
        ids = [d.item - int(stream.offsets[k]) for d in draws if d.source == k]
        for e in range(len(ids) // n):
            key = (seed, 3, k, e) if version == 2 else (seed, k, e)
            expected = permute(n, key, np.arange(n)).tolist()
            assert ids[e * n : (e + 1) * n] == expected, (k, e)
    order_key = seed_sequence((seed, 3, 1, 2) if version == 2 else (seed, 1, 2))
    sample_key_2 = seed_sequence((seed, 1, 2))  # sample_rng(seed, 2)'s
    same = order_key.generate_state(4).tolist() == sample_key_2.generate_state(4).tolist()
    assert same == (version == 1)
    with pytest.raises(ValueError, match="version 3"):
        SampleStream(seed, sizes, epochs=True, version=3)


def test_mixture_forms() -> None:
    one = mixture(["a.zip", "b.zip"])
    assert one.names == ["0"] and one.paths == [["a.zip", "b.zip"]] and one.weights == [1.0]
    listed = mixture(["a.zip", ["b.zip", "c.tar"]], [1, 3])
    assert listed.names == ["0", "1"] and listed.flat == ["a.zip", "b.zip", "c.tar"]
    named = mixture({"x": "a.zip", "y": ["b.zip"]}, {"y": 2, "x": 1})
    assert named.names == ["x", "y"] and named.weights == [1.0, 2.0]
    assert mixture({"x": "a.zip", "y": "b.zip"}, [3, 1]).weights == [3.0, 1.0]


@pytest.mark.parametrize(
    ("sources", "weights", "error", "match"),
    [
        ({"x": "a"}, None, TypeError, "needs weights"),
        ("a.zip", [1], TypeError, "several sources"),
        (["a", "b"], [1], ValueError, "1 weights for 2"),
        (["a", "b"], [1, -1], ValueError, ">= 0"),
        (["a", "b"], [0, 0], ValueError, "not all 0"),
        (["a", "b"], [1, float("nan")], ValueError, "finite"),
        ({"x": "a"}, {"y": 1}, ValueError, "name the sources"),
    ],
)
def test_bad_mixtures(sources: object, weights: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        mixture(sources, weights)


def test_bad_streams() -> None:
    with pytest.raises(ValueError, match="nothing to draw"):
        SampleStream(0, [0])
    with pytest.raises(ValueError, match=r"'b' has weight 1\.0 but holds no items"):
        SampleStream(0, [3, 0], [1, 1], names=["a", "b"])
    with pytest.raises(ValueError, match="samples must be >= 0"):
        SampleStream(0, [3]).draw(-1, 2)


def test_uniforms_and_item_keys() -> None:
    u = uniforms((3, 0), np.arange(100_000))
    assert u.min() >= 0 and u.max() < 1 and abs(u.mean() - 0.5) < 0.005
    np.testing.assert_array_equal(u[[5, 70_000]], uniforms((3, 0), np.array([5, 70_000])))
    assert not np.array_equal(u[:10], uniforms((4, 0), np.arange(10)))
    assert per_item_keys(None, 3) is None
    assert per_item_keys([1, 2**64 - 1], 2) == [1, 2**64 - 1]
    with pytest.raises(ValueError, match="2 keys for 3 items"):
        per_item_keys([1, 2], 3)
    with pytest.raises(ValueError, match="2\\*\\*64"):
        per_item_keys([-1], 1)
