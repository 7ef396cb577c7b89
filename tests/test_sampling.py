"""Token choice on the GPU (kernels/attention/sampler.py): greedy ids are numpy's argmax; sampled
ids follow softmax(adjusted logits / T) restricted to the top-k, top-p and min-p cuts (checked over
thousands of seeds against `Sampling.probabilities`, the float64 reference); a tokens excluded by
a cut never comes; a seed gives the same ids whatever rows run beside it."""

from dataclasses import replace

import numpy as np
import pytest

from async_runtime.errors import InputError
from async_runtime.sampling import Sampling

from .sampler_kernels import run_sampler, sampler_device

pytestmark = pytest.mark.usefixtures("adapter")

VOCAB = 4099  # prime, three of the sampler's slices


@pytest.fixture(scope="module")
def device():
    return sampler_device()


def chi_square(counts, probs):
    """Pearson's statistic over the tokens expected 5 times or more (the rest pooled in one
    cell), with its degrees of freedom."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    observed = np.append(counts[big], counts[~big].sum())
    expected = np.append(expected[big], expected[~big].sum())
    keep = expected > 0
    stat = float((((observed - expected) ** 2)[keep] / expected[keep]).sum())
    return stat, int(keep.sum()) - 1


def draws(device, logits, sampling, seeds, position=7, **tables):
    rows = [Sampling(**{**sampling, "seed": s}).row(0, logits.shape[-1]) for s in seeds]
    ids, *_ = run_sampler(device, np.repeat(logits[None], len(seeds), 0), rows, [position] * len(seeds), **tables)
    return ids[:, 0]


SETTINGS = [
    dict(temperature=0.8, top_p=0.95),
    dict(temperature=1.0),
    dict(temperature=1.0, top_k=5),
    dict(temperature=0.7, min_p=0.05),
    dict(temperature=1.3, top_k=40, top_p=0.8),
    dict(temperature=0.9, top_k=VOCAB + 3, top_p=0.5),  # top_k past the vocabulary: no cut
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_draws_follow_the_softmax_within_the_cuts(device, settings):
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(VOCAB) * 1.5).astype(np.float32)
    logits[rng.choice(VOCAB, 40, replace=False)] += 3  # a head of likely tokens in a long tail
    n = 3000
    ids = draws(device, logits, settings, range(n))
    probs = Sampling(**settings).probabilities(logits)
    counts = np.bincount(ids, minlength=VOCAB)
    assert counts[probs == 0].sum() == 0, f"drawn outside the cuts: {np.flatnonzero(counts * (probs == 0))}"
    stat, dof = chi_square(counts, probs)
    assert dof >= 4 and stat < dof + 6 * np.sqrt(2 * dof), (stat, dof)  # within about 4 standard deviations


def test_the_cuts_are_exact(device):
    """top_k keeps exactly k tokens, the kth's tie included; top_p keeps the smallest head
    reaching the mass, here designed so one token more or less would be wrong."""
    logits = np.full(VOCAB, -5.0, np.float32)
    logits[[11, 2048, 4000, 3]] = [3.0, 2.0, 1.0, 1.0]  # 4000 and 3 tie for third
    ids = draws(device, logits, dict(temperature=1.0, top_k=3), range(2000))
    assert set(ids.tolist()) == {11, 2048, 4000, 3}
    # masses 0.5, 0.3, 0.2 of three tokens, nothing else (the rest at -inf): just under a sum, the
    # tokens of the sum; just over it, one more
    logits = np.full(VOCAB, -np.inf, np.float32)
    logits[[100, 4098, 2047]] = np.log([0.5, 0.3, 0.2])
    for top_p, kept in ((0.799, {100, 4098}), (0.801, {100, 4098, 2047}), (0.499, {100}), (0.501, {100, 4098})):
        ids = draws(device, logits, dict(temperature=1.0, top_p=top_p), range(600))
        assert set(ids.tolist()) == kept, top_p


def test_a_seed_gives_the_same_ids_beside_any_rows(device):
    rng = np.random.default_rng(2)
    logits = (rng.standard_normal((9, VOCAB)) * 3).astype(np.float32)
    settings = [Sampling(temperature=0.8, top_p=0.95, seed=1234), Sampling(temperature=1.0, top_k=7, seed=99),
                Sampling(), Sampling(temperature=0.5, min_p=0.1, seed=7)]
    alone = [run_sampler(device, logits[:1], [s.row(0, VOCAB)], [20], passes=3)[0][0] for s in settings]
    order = [2, 0, 3, 1]  # the same settings as rows 5..8 of a batch, other rows before them
    rows = [Sampling(temperature=1.0, seed=i).row(0, VOCAB) for i in range(5)] + [settings[i].row(0, VOCAB) for i in order]
    mixed = np.concatenate([logits[4:9], np.repeat(logits[:1], 4, 0)])
    ids, tokens, positions, _ = run_sampler(device, mixed, rows, [20] * 9, passes=3)
    for b, i in enumerate(order):
        np.testing.assert_array_equal(ids[5 + b], alone[i])
    assert ids[5].tolist() == [int(logits[0].argmax())] * 3  # the greedy row
    np.testing.assert_array_equal(tokens, ids[:, -1])
    np.testing.assert_array_equal(positions, np.full(9, 23))
    other = run_sampler(device, logits[:1], [Sampling(temperature=0.8, top_p=0.95, seed=1235).row(0, VOCAB)], [20], passes=3)[0][0]
    assert other.tolist() != alone[0].tolist()  # another seed, other ids (3 draws from ~40 likely tokens)
    assert len(set(alone[0].tolist())) > 1  # each pass's position is a new draw


@pytest.mark.parametrize("seqs", [1, 4])
def test_slices_merged_apart_pick_what_the_last_to_arrive_picks(device, seqs):
    """Each kernel's slices merged by a second dispatch (where storage barriers order only a
    workgroup's own accesses, as Dawn's compiler gives) pick the ids of the last workgroup to
    arrive merging them: greedy, top-k with top-p, min-p, and plain rows, over several passes."""
    rng = np.random.default_rng(8)
    logits = (rng.standard_normal((seqs, VOCAB)) * 2).astype(np.float32)
    settings = [Sampling(), Sampling(temperature=0.8, top_k=40, top_p=0.9, seed=3),
                Sampling(temperature=0.7, min_p=0.05, seed=5), Sampling(temperature=1.0, seed=11)][:seqs]
    rows = [s.row(0, VOCAB) for s in settings]
    last = run_sampler(device, logits, rows, [9] * seqs, passes=5, merge_apart=False)
    apart = run_sampler(device, logits, rows, [9] * seqs, passes=5, merge_apart=True)
    for got, want in zip(apart, last):
        np.testing.assert_array_equal(got, want)
    assert apart[0][0].tolist() == [int(logits[0].argmax())] * 5
    if seqs > 1:
        assert len(set(apart[0][3].tolist())) > 1  # the plain row draws, pass after pass


def test_greedy_ids_are_numpys_argmax_over_f16_logits():
    device = sampler_device(f16=True)
    if device is None:
        pytest.skip("the adapter has no shader-f16")
    seqs = 5
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((seqs, VOCAB)) * 4).astype(np.float16)
    logits[1, [3, 3700]] = logits[1].max() + 1  # a tie across slices: the first index wins
    logits[2] = -np.inf
    logits[2, VOCAB - 1] = -65504.0  # the lowest finite f16, last
    logits[3] /= 4
    logits[3, 2050] = np.float16(8.0) + np.float16(0.0078125)  # f16 neighbours of 8 differ by one ulp
    logits[3, 900] = 8.0
    ids, tokens, positions, _ = run_sampler(device, logits, [Sampling().row(0, VOCAB)] * seqs, [4] * seqs, passes=2)
    np.testing.assert_array_equal(ids, np.stack([logits.argmax(-1)] * 2, 1))
    assert (ids[1, 0], ids[2, 0], ids[3, 0]) == (3, VOCAB - 1, 2050)
    np.testing.assert_array_equal(tokens, ids[:, 1])
    np.testing.assert_array_equal(positions, np.full(seqs, 6))


def test_penalties_and_bias_adjust_the_logits_as_the_reference(device):
    """Greedy rows with penalties pick the reference's argmax of the adjusted logits, pass after
    pass as the counts grow; sampled ones draw from its distribution."""
    rng = np.random.default_rng(3)
    logits = rng.standard_normal(VOCAB).astype(np.float32)
    head = rng.choice(VOCAB, 6, replace=False)
    logits[head] = [9.0, 8.9, 8.8, -8.7, 8.6, 8.5]
    prompt = [int(head[1]), int(head[3]), 17]
    greedy = Sampling(presence_penalty=0.3, frequency_penalty=0.25, repetition_penalty=1.3, logit_bias={int(head[5]): 0.35, 5: -100})
    counts, bias = greedy.slot_rows(VOCAB, prompt)
    ids, _, _, after = run_sampler(device, logits[None], [greedy.row(0, VOCAB)], [3], counts=counts[None], bias=bias[None], passes=12)
    want = []
    for _ in range(12):
        want.append(greedy.pick(logits, want, prompt))
    assert ids[0].tolist() == want and len(set(want)) > 2  # the penalties move the choice on
    np.testing.assert_array_equal(after[0] & 0x7FFFFFFF, np.bincount(want, minlength=VOCAB))
    assert (after[0] >> 31).sum() == len(set(prompt))
    sampled = Sampling(temperature=1.0, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.2, repetition_penalty=1.2,
                       logit_bias={int(head[0]): -2.0, 9: 3.0})
    counts, bias = sampled.slot_rows(VOCAB, prompt)
    counts[head[2]] += 3  # as if generated three times already
    n = 3000
    rows = [replace(sampled, seed=s).row(0, VOCAB) for s in range(n)]
    got, *_ = run_sampler(device, np.repeat(logits[None], n, 0), rows, [9] * n, counts=counts[None], bias=bias[None])
    probs = sampled.probabilities(logits, [int(head[2])] * 3, prompt)
    observed = np.bincount(got[:, 0], minlength=VOCAB)
    assert observed[probs == 0].sum() == 0
    stat, dof = chi_square(observed, probs)
    assert stat < dof + 6 * np.sqrt(2 * dof), (stat, dof)


def test_bad_settings_are_refused_with_what_was_wrong():
    for settings, words in [(dict(temperature=-1), "temperature -1"), (dict(top_p=0), "top_p 0"), (dict(top_k=2.5), "top_k 2.5"),
                            (dict(min_p=1.5), "min_p 1.5"), (dict(repetition_penalty=0), "repetition_penalty 0"),
                            (dict(logit_bias={"x": 1}), "logit_bias entry 'x'"), (dict(logit_bias={3: float("nan")}), "logit_bias entry 3")]:
        with pytest.raises(InputError, match=words):
            Sampling(**settings)
    with pytest.raises(InputError, match=r"token ids \[4099\] outside the vocabulary of 4099"):
        Sampling(logit_bias={4099: 1.0}).check_vocab(VOCAB)
