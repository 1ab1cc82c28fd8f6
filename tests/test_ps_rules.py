"""The parameter server's update rules (imagenet_recipes/ps/update_rules.py) on scripted speed
profiles, in-process: the real rule objects, fed what the server would feed them, on quadratic
objectives whose answers are known. The multi-process runs that they learn are in
tests/test_ps.py."""
from __future__ import annotations

import dataclasses
import heapq

import pytest
import torch

from imagenet_recipes.ps.config import PSConfig
from imagenet_recipes.ps.options import ASYNC_RULE_NAMES, ESYNC_AVERAGE_NAMES, RuleOptions
from imagenet_recipes.ps.shards import RoundSums
from imagenet_recipes.ps.update_rules import (ASYNC_RULES, ESYNC_AVERAGES, AsyncSGD, ESyncMean,
                                              StalenessAwareAsyncSGD, async_momentum,
                                              make_rule, rule_class)

from test_ps import simulate_esync


# --- async ------------------------------------------------------------------------------------
def simulate_async(rule: str, step_times, pushes: int, lr: float, momentum: float = 0.9):
    """Workers on a fake clock: worker w pulls the weights, computes the gradient of
    0.5 |x|^2 at them for step_times[w] seconds and pushes it; the server applies each push
    with the real async rule at the staleness the server counts (its updates since that pull).
    Returns the loss after every push."""
    cfg = PSConfig(data="x", mode="async", async_rule=rule, momentum=momentum, lr=lr,
                   batch_size=256, weight_decay=0.0)  # batch 256: the lr is --lr itself
    x = torch.ones(8, dtype=torch.float64)
    server = make_rule(RuleOptions.of(cfg), [x], len(step_times))
    step = 0
    queue = [(t, w, 0, x.clone()) for w, t in enumerate(step_times)]
    heapq.heapify(queue)
    losses = []
    for _ in range(pushes):
        now, worker, pulled, weights = heapq.heappop(queue)
        server.apply_push([weights.clone()], 1.0, step - pulled, len(step_times))
        step += 1
        heapq.heappush(queue, (now + step_times[worker], worker, step, x.clone()))
        losses.append(0.5 * float(x.pow(2).sum()))
    return losses


@pytest.mark.parametrize("profile", [(1, 1), (1, 2), (1, 1, 4)])
def test_stale_gradients_at_full_rate_and_momentum_do_not_converge_where_one_worker_does(
        profile):
    """At lr 0.1 and momentum 0.9 one worker converges; the same rate and momentum applied to
    stale gradients (plain) does not, while the staleness rule converges on every profile."""
    assert simulate_async("plain", (1,), 300, lr=0.1)[-1] < 1e-10
    plain = simulate_async("plain", profile, 300, lr=0.1)
    staleness = simulate_async("staleness", profile, 300, lr=0.1)
    assert plain[-1] > 0.1, plain[-1]  # 0.6, 1.3 and 2.7e4 for the three profiles
    assert staleness[-1] < 1e-10, staleness[-1]


def test_the_staleness_rule_divides_the_rate_by_the_staleness():
    cfg = PSConfig(data="x", mode="async", async_rule="staleness", momentum=0.9, lr=0.5,
                   batch_size=256, weight_decay=0.0)
    for staleness, expected in [(0, 0.5), (1, 0.5), (2, 0.25), (5, 0.1)]:
        x = torch.zeros(1)
        make_rule(RuleOptions.of(cfg), [x], 1).apply_push([torch.ones(1)], 1.0, staleness, 1)
        assert x.item() == pytest.approx(-expected)  # the first step: no momentum yet
    cfg = dataclasses.replace(cfg, async_rule="plain")
    x = torch.zeros(1)
    make_rule(RuleOptions.of(cfg), [x], 1).apply_push([torch.ones(1)], 1.0, 5, 1)
    assert x.item() == pytest.approx(-0.5)


def test_the_momentum_asynchrony_adds_is_taken_out_of_the_explicit_one():
    assert async_momentum(0.9, 1) == pytest.approx(0.9)  # one worker: nothing is stale
    assert async_momentum(0.9, 2) == pytest.approx(0.8)  # (1 - 0.8) / 2 = 1 - 0.9
    assert async_momentum(0.9, 4) == pytest.approx(0.6)
    assert async_momentum(0.9, 10) == pytest.approx(0.0, abs=1e-12)
    assert async_momentum(0.9, 16) == 0.0
    assert async_momentum(0.0, 3) == 0.0
    # in the step: the second push's momentum buffer is 0.8 g1 + g2 with two workers
    cfg = PSConfig(data="x", mode="async", async_rule="staleness", momentum=0.9, lr=1.0,
                   batch_size=256, weight_decay=0.0)
    x = torch.zeros(1)
    rule = make_rule(RuleOptions.of(cfg), [x], 2)
    rule.apply_push([torch.ones(1)], 1.0, 1, 2)
    rule.apply_push([torch.full((1,), 2.0)], 1.0, 1, 2)
    assert x.item() == pytest.approx(-1.0 - (0.8 * 1.0 + 2.0))


# --- esync ------------------------------------------------------------------------------------
def esync_on_quadratics(targets, local_steps, average: str, rounds: int = 400,
                        local_lr: float = 0.01) -> float:
    """ESync rounds on 1-d quadratics: worker i minimises 0.5 (x - targets[i])^2 with
    local_steps[r][i] plain SGD steps in round r (from the state service's scripted profile),
    pushes its average's pushed_delta of its delta, and the server applies the real rule to
    the round's sums (RoundSums, as server.py does). Returns where x ends up."""
    cfg = PSConfig(data="x", mode="esync", esync_average=average, global_lr=1.0)
    x = torch.zeros(1, dtype=torch.float64)
    server = make_rule(RuleOptions.of(cfg), [x], len(targets))
    for r in range(rounds):
        steps = local_steps[min(r, len(local_steps) - 1)]
        sums = RoundSums([x])
        for target, taken in zip(targets, steps):
            local = x.clone()
            for _ in range(taken):
                local -= local_lr * (local - target)
            sums.add(type(server).pushed_delta([local - x], taken), taken)
        server.apply_round(sums.sums, sums.pushes, 1.0, sums.mean_steps())
    return x.item()


def test_normalized_averaging_reaches_the_mean_objective_where_the_plain_mean_drifts():
    """Workers with speeds (1, 1, 4): the state service gives the two fast ones 4 local steps
    for the slow one's 1. The plain mean then weighs each worker by its steps, and lands near
    the fast workers' optimum ((4 * 0 + 4 * 0 + 1 * 1) / 9); FedNova's normalised average
    weighs each worker once and lands on the mean objective's optimum (1/3)."""
    history = simulate_esync([1, 1, 4], 3, "reference")
    local_steps = [[steps for steps, _ in done] for done in history]
    assert local_steps[1:] == [[4, 4, 1]] * 2
    targets = [0.0, 0.0, 1.0]
    mean = esync_on_quadratics(targets, local_steps, "mean")
    normalized = esync_on_quadratics(targets, local_steps, "normalized")
    assert mean == pytest.approx(1 / 9, abs=0.01)
    assert normalized == pytest.approx(1 / 3, abs=0.01)


def test_with_equal_steps_both_averages_make_the_same_update():
    for steps in ([[1, 1, 1]], [[3, 3, 3]]):
        assert esync_on_quadratics([0.0, 2.0, 5.0], steps, "normalized", rounds=20) == \
            pytest.approx(esync_on_quadratics([0.0, 2.0, 5.0], steps, "mean", rounds=20),
                          rel=1e-12)


def test_an_epoch_no_worker_reported_in_has_no_loss_rather_than_zero():
    """One ESync round can carry more than an epoch's samples on a small data set: the epochs
    it completes after the first had no report of their own."""
    from imagenet_recipes.ps.server import epoch_stats

    assert epoch_stats({"loss": 0.0, "correct1": 0.0, "correct5": 0.0, "count": 0.0}) == {
        "loss": None, "top1": None, "top5": None, "count": 0}
    assert epoch_stats({"loss": 6.0, "correct1": 1.0, "correct5": 3.0, "count": 4.0}) == {
        "loss": 1.5, "top1": 25.0, "top5": 75.0, "count": 4}


def test_a_worker_told_to_stop_ends_cleanly_when_the_server_is_gone_before_its_goodbye(capsys):
    """An async run that lost a worker ends without RPC's graceful barrier: the server may exit
    before its answer to the last worker's goodbye leaves. That worker was already told to stop,
    so it finishes (exit 0, no graceful shutdown to wait in) instead of failing the run."""
    from imagenet_recipes.ps.worker import Worker, WorkerStopped

    def server_gone(fn, *args):
        raise WorkerStopped("EOF: end of file (this error originated at tensorpipe/...)")

    worker = Worker.__new__(Worker)  # only what leaving needs: no model, loader or RPC
    worker.worker, worker.lost_peers, worker.server_gone = 1, [], False
    worker._call = server_gone
    worker.leave()
    assert worker.server_gone and "server ended before answering" in capsys.readouterr().out

    worker.server_gone = False
    worker._call = lambda fn, *args: [2]  # the answer names the workers lost meanwhile
    worker.leave()
    assert worker.lost_peers == [2] and not worker.server_gone


def test_each_option_picks_its_registered_rule():
    """--async-rule and --esync-average name classes (registered in update_rules), so a rule is
    a subclass with its own docstring, not a branch."""
    assert rule_class(PSConfig(data="x", mode="async", async_rule="plain")) is AsyncSGD
    assert rule_class(PSConfig(data="x", mode="async")) is StalenessAwareAsyncSGD  # the default
    assert rule_class(PSConfig(data="x", mode="esync")) is ESyncMean  # the default
    for rule in ASYNC_RULES:
        assert rule_class(PSConfig(data="x", mode="async", async_rule=rule)) is ASYNC_RULES[rule]
    for average in ESYNC_AVERAGES:
        cfg = PSConfig(data="x", mode="esync", esync_average=average)
        assert rule_class(cfg) is ESYNC_AVERAGES[average]
    assert rule_class(PSConfig(data="x", mode="sync")).__name__ == "SyncSGD"
    # every name the options offer has its class, and no class is registered unoffered
    assert tuple(ASYNC_RULES) == ASYNC_RULE_NAMES and tuple(ESYNC_AVERAGES) == ESYNC_AVERAGE_NAMES
