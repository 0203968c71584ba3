"""The collapse rules judge the answers of several sampled batches, never one batch alone.

A classifier with two balanced classes measured on batches of eight answers one class in a whole
batch once in 128 batches by chance. ``OneAnswerLossDrop`` and ``JointCollapse`` read the measured
shares pooled (an EWMA over about ten steps' batches), so such a batch, arriving while a small training
set is learnt by heart (the loss falling two decades), is not taken for a collapse; a real
collapse, whose answers stay on one class, is still named.
"""

from __future__ import annotations

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.detectors._answers import (
    ANSWER_ALPHA,
    ONE_ANSWER,
    answer_levels,
    answer_weight,
    last_share_step,
    pooled_answer,
)
from trainsignals.testing import check_detector

STEPS = 400


def interpolating_run(seed: int, batch: int = 8) -> dict[str, np.ndarray]:
    """Loss and grad norm that fall two decades between steps 20 and 80 (a small set learnt by
    heart), answers spread: each batch's share is that of the larger class among ``batch`` draws
    of a fair coin."""
    rng = np.random.default_rng(seed)
    t = np.arange(STEPS)
    fall = 10.0 ** (-2.0 * np.clip((t - 20) / 60, 0.0, 1.0))
    heads = rng.binomial(batch, 0.5, STEPS)
    return {"loss": 0.7 * fall * np.exp(rng.normal(0, 0.05, STEPS)),
            "grad_norm": 2.0 * fall * np.exp(rng.normal(0, 0.05, STEPS)),
            "pred_top_share": np.maximum(heads, batch - heads) / batch}


def collapsing_run(seed: int) -> dict[str, np.ndarray]:
    """Spread answers (about 0.55) until step 200, then every answer one class, while the loss and
    the grad norm fall two decades over the next 40 steps."""
    rng = np.random.default_rng(seed)
    t = np.arange(STEPS)
    fall = 10.0 ** (-2.0 * np.clip((t - 200) / 40, 0.0, 1.0))
    share = np.where(t >= 200, 1.0, np.clip(0.55 + rng.normal(0, 0.05, STEPS), 0, 1))
    return {"loss": 0.7 * np.exp(-t / 2000) * fall * np.exp(rng.normal(0, 0.05, STEPS)),
            "grad_norm": 1.0 * fall * np.exp(rng.normal(0, 0.05, STEPS)),
            "pred_top_share": share}


RULES = {"OneAnswerLossDrop": (ts.OneAnswerLossDrop, ("loss", "pred_top_share")),
         "JointCollapse": (ts.JointCollapse, ("loss", "grad_norm", "pred_top_share"))}


def run_rule(name: str, data: dict[str, np.ndarray]) -> list[ts.Event]:
    cls, names = RULES[name]
    return cls().scan(**{k: data[k] for k in names})


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_chance_batch_of_one_class_while_a_small_set_is_learnt_is_no_collapse(name):
    # 9 of these 30 runs hold a batch of eight answers in one class while the loss's fall is steep
    # (steps 70-110); judged on the latest batch alone (the code before 7 December 2026),
    # OneAnswerLossDrop fired in one of the 30 runs and JointCollapse in nine
    chance = [s for s in range(30) if (interpolating_run(s)["pred_top_share"][70:111] == 1.0).any()]
    assert len(chance) >= 5
    fired = [s for s in range(30) if run_rule(name, interpolating_run(s))]
    assert fired == []


@pytest.mark.parametrize("name", sorted(RULES))
def test_a_collapse_is_named_once_the_answers_of_several_batches_are_one_class(name):
    for seed in range(5):
        events = run_rule(name, collapsing_run(seed))
        assert events, seed
        first = events[0]
        assert first.kind is ts.Kind.SILENT_COLLAPSE
        # the pooled answers pass ONE_ANSWER seven batches after the switch; the loss has fallen by then
        assert 210 <= first.step <= 250, (seed, first.step)
        assert "of the recent answers are one class" in first.message


def test_the_pooled_answers_are_an_ewma_of_the_measured_shares_a_step():
    assert pooled_answer(-1.0, 0.4) == 0.4  # the first share measured is the answers
    assert pooled_answer(0.5, 1.0) == pytest.approx(0.5 + ANSWER_ALPHA * 0.5)
    assert answer_weight(10) == pytest.approx(1 - (1 - ANSWER_ALPHA) ** 10)  # a row every ten steps: mostly its own
    rng = np.random.default_rng(3)
    shares = rng.uniform(0, 1, 500)
    shares[rng.random(500) < 0.3] = np.nan  # steps without a measure
    steps = np.cumsum(rng.choice([1, 1, 1, 2, 10], 500))  # and rows at uneven steps
    for start, last in ((-1.0, -1), (0.7, 3)):
        level, at, loop = start, last, []
        for s, st in zip(shares, steps.tolist()):
            if s == s:
                level, at = pooled_answer(level, float(s), st - at), st
            loop.append(level)
        got = answer_levels(shares, start, steps, last)
        assert np.array_equal(got, np.array(loop))  # bit for bit: scan == update
        assert last_share_step(shares, steps, last) == at
    assert np.array_equal(answer_levels(np.full(4, np.nan), -1.0, np.arange(4), -1), np.full(4, -1.0))


def test_seven_batches_in_one_class_take_spread_answers_to_one_answer():
    level, batches = 0.55, 0
    while level < ONE_ANSWER:
        level, batches = pooled_answer(level, 1.0), batches + 1
    assert batches == 7  # 0.55 + 0.45 * (1 - 0.8 ** n) >= 0.9 first at n = 7


def test_a_log_with_a_row_every_ten_steps_reads_mostly_its_latest_row():
    # the weight is a step, compounded: one row of answers all in one class, ten steps after a row of
    # spread ones, is one answer; one batch a step after is not (seven are)
    assert pooled_answer(0.55, 1.0, 10) >= ONE_ANSWER > pooled_answer(0.55, 1.0, 1)
    rows = np.arange(9, 400, 10)
    share = np.where(rows >= 200, 1.0, 0.55)
    got = answer_levels(share, -1.0, rows, -1)
    assert got[rows < 200].max() == pytest.approx(0.55) and (got[rows >= 200] >= ONE_ANSWER).all()


def test_on_a_log_every_ten_steps_the_loss_drop_rule_keeps_its_spans_in_steps():
    from trainsignals.detectors._interval import interval_settings

    assert interval_settings(ts.OneAnswerLossDrop, 10) == {"span": 8, "lag": 25, "alpha": pytest.approx(2 / 9)}
    rows = np.arange(9, STEPS, 10)
    for seed in range(5):
        d = collapsing_run(seed)
        rule = ts.OneAnswerLossDrop(**interval_settings(ts.OneAnswerLossDrop, 10))
        got = [e.step for e in rule.scan(steps=rows, loss=d["loss"][rows], pred_top_share=d["pred_top_share"][rows])]
        assert got and 200 <= got[0] <= 290, (seed, got)  # counted in rows, its 50-value span was 500 steps


@pytest.mark.parametrize("name", sorted(RULES))
def test_conformance_on_small_batches(name):
    cls, names = RULES[name]
    data = interpolating_run(7)
    data["pred_top_share"][::3] = np.nan  # measured on two batches in three
    check_detector(cls, {k: data[k] for k in names})
