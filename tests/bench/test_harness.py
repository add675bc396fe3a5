"""The benchmark harness at tiny scale: deterministic, counting as the adapters do, baselines as described."""

from __future__ import annotations

import inspect
import logging
import random
from pathlib import Path

import pytest
import yaml

from bench.aws import CountingStore, Meter, SimExecutions, SimQueue
from bench.harness import SYSTEMS, backlog, run, trickle
from bench.model import SLUICE_ARCHITECTURE, SLUICE_COMPLETION_MEMORY_MB, SLUICE_LAUNCHER_MEMORY_MB
from bench.pricing import cost_usd
from bench.quotas import TokenBucket
from bench.report import DEPLOYED, LABEL, NO_LINGER
from bench.sim import Container, LambdaFunction, Parallel, Sim
from bench.sluice_system import LINGER_SECONDS
from bench.validate import agreement
from sluice.core.ports import Store
from sluice.features.keys import KeyStore

ROOT = Path(__file__).resolve().parents[2]


def _jobs(kind: str, n: int, seed: int = 7, max_: int = 5) -> list:
    return backlog(kind, n, random.Random(f"{seed}/{kind}/{max_}"))


@pytest.mark.parametrize("system", ["sluice", "sluice-linger", "poller", "counter-semaphore"])
def test_same_seed_same_numbers(system):
    first = run(system, "exp30", 5, 7, jobs=_jobs("exp30", 40), timeline=True)
    second = run(system, "exp30", 5, 7, jobs=_jobs("exp30", 40), timeline=True)

    assert first == second
    assert first["finished"] and first["completed"] == 40


def test_another_seed_other_jobs():
    assert _jobs("exp30", 40, seed=7) != _jobs("exp30", 40, seed=8)
    assert _jobs("exp30", 40, seed=7) == _jobs("exp30", 40, seed=7)


def test_sluice_refills_a_freed_slot_within_a_second_and_never_exceeds_max():
    r = run("sluice", "fixed30", 10, 7, jobs=_jobs("fixed30", 60, max_=10))

    assert r["completed"] == 60 and r["dead_lettered"] == 0 and r["duplicate_starts"] == 0
    assert r["peak_concurrency"] == 10 and r["over_max_seconds"] == 0
    assert r["refill_latency_p50_s"] < 1.0
    assert r["lambda"]["completion"]["invocations"] == 60  # one per status event


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_the_log_bytes_count_every_line_a_deployed_function_ships():
    """The module loggers' INFO lines ship as the handler's do (handlers/_shared.py gives them its
    handler): each release's "slot released" is billed beside each start's "execution started" and
    every invocation's metrics; a routine completion's summary is not (handlers/completion.py)."""
    from bench.aws import POWERTOOLS_BASE_BYTES, LogBytes
    from bench.model import EMF_BYTES, SUMMARY_BYTES

    seen = _Lines()
    logging.getLogger("sluice").addHandler(seen)
    try:
        r = run("sluice", "fixed30", 10, 7, jobs=_jobs("fixed30", 60, max_=10))
    finally:
        logging.getLogger("sluice").removeHandler(seen)
    assert [rec.getMessage() for rec in seen.records].count("slot released") == 60
    weigh = LogBytes(Meter.__new__(Meter))
    weigh.meter.log_bytes = 0
    for record in seen.records:
        weigh.emit(record)
    rest = r["log_bytes"] - weigh.meter.log_bytes  # the handlers' lines, metrics and Lambda's own
    functions = r["lambda"]
    invocations = functions["completion"]["invocations"] + functions["launcher"]["invocations"]
    ticks = functions["launcher"]["invocations"]
    per_invocation = EMF_BYTES + LambdaFunction.platform_log_bytes  # metrics; START, END and REPORT
    started = 60 * (POWERTOOLS_BASE_BYTES + len("execution started"))
    assert started + invocations * per_invocation <= rest  # the module lines came on top
    assert rest < 60 * 750 + invocations * per_invocation + ticks * (SUMMARY_BYTES + 2_000)


def test_completions_ending_together_dead_letter_nothing():
    """Jobs of one length end in bursts; each completion refills only the slot it freed, so no claim
    is lost and no healthy message spends its receives."""
    r = run("sluice", "fixed5", 10, 7, jobs=_jobs("fixed5", 300, max_=10))

    assert r["completed"] == 300 and r["dead_lettered"] == 0
    assert "sqs:ChangeMessageVisibilityBatch" not in r["calls_by_api"]  # no message was returned
    assert r["lambda"]["completion"]["invocations"] == 300
    assert r["calls_by_api"]["states:StartExecution"] == 300


def test_the_variants_drop_exactly_the_calls_they_model():
    jobs = _jobs("fixed30", 60, max_=10)
    default = run("sluice-release-then-refill", "fixed30", 10, 7, jobs=jobs)["calls_by_api"]
    refill_one = run("sluice-refill-one", "fixed30", 10, 7, jobs=jobs)["calls_by_api"]
    lean = run("sluice-lean", "fixed30", 10, 7, jobs=jobs)["calls_by_api"]

    # refill one: a completion's admission skips its ledger read (one BatchGetItem per completion)
    assert default["dynamodb:BatchGetItem"] - refill_one["dynamodb:BatchGetItem"] == 60
    assert default["dynamodb:GetItem"] == refill_one["dynamodb:GetItem"]
    assert default["dynamodb:TransactWriteItems"] == refill_one["dynamodb:TransactWriteItems"]
    # lean: no read before a release (one GetItem per completion; the core writes no RUNNING mark
    # any more, so that half of lean is the core's); the ledger read stays
    assert default["dynamodb:GetItem"] - lean["dynamodb:GetItem"] == 60
    assert default["dynamodb:TransactWriteItems"] == lean["dynamodb:TransactWriteItems"]


def test_poller_starts_only_on_its_schedule():
    r = run("poller", "fixed30", 10, 7, jobs=_jobs("fixed30", 60, max_=10))

    assert r["completed"] == 60 and r["peak_concurrency"] <= 10
    # Nothing refills on completion: a slot freed at 30 s into the minute waits for the next tick.
    assert r["refill_latency_p50_s"] >= 25
    ticks = r["lambda"]["poller"]["invocations"]
    assert r["calls_by_api"]["states:ListExecutions"] == ticks  # one page per tick
    assert r["calls_by_api"]["sqs:DeleteMessage"] == r["calls_by_api"]["states:StartExecution"] == 60


def test_counter_semaphore_increments_before_each_start_and_decrements_per_event():
    r = run("counter-semaphore", "fixed30", 5, 7, jobs=_jobs("fixed30", 30))

    assert r["completed"] == 30 and r["peak_concurrency"] <= 5
    calls = r["calls_by_api"]
    # Every attempt, won or lost, is a PutItem and an UpdateItem; so is every decrement.
    assert calls["dynamodb:PutItem"] == calls["dynamodb:UpdateItem"]
    assert calls["dynamodb:UpdateItem"] > 2 * 30  # attempts on a full counter were charged too
    assert r["lambda"]["sfSemaphoreDown"]["invocations"] == 30


def test_linger_starts_a_payload_enqueued_while_slots_are_free_at_once():
    jobs = trickle(10, 15.0, 600.0, random.Random("trickle"))
    plain = run("sluice", "trickle", 20, 7, jobs=jobs, keep_latencies=True)
    linger = run("sluice-linger", "trickle", 20, 7, jobs=jobs, keep_latencies=True)

    assert plain["start_latency_p50_s"] > 2  # waits for the next tick
    assert linger["start_latency_p50_s"] < 2  # a long poll is waiting
    # Only the scheduled launcher lingers: each completion finds the queue empty and returns.
    completion = linger["lambda"]["completion"]
    assert completion["invocations"] == 10
    assert completion["gb_seconds"] <= plain["lambda"]["completion"]["gb_seconds"]
    assert linger["calls_by_api"]["sqs:ReceiveMessage"] > plain["calls_by_api"]["sqs:ReceiveMessage"]


def test_list_executions_lags():
    sim = Sim()
    meter = Meter(sim.clock)
    sfn = SimExecutions(meter, sim.clock, lag=3.0)
    sfn.start("a", "{}")
    sim.clock.t += 1
    assert sfn.list_running() == set()  # too fresh
    sim.clock.t += 3
    assert sfn.list_running() == {"a"}
    sfn.finish("a")
    sim.clock.t += 1
    assert sfn.list_running() == {"a"}  # ended, still listed
    sim.clock.t += 3
    assert sfn.list_running() == set()
    assert meter.calls == {"states:StartExecution": 1, "states:ListExecutions": 4}


def test_a_long_poll_waits_in_virtual_time_until_a_message_arrives():
    sim = Sim()
    meter = Meter(sim.clock, sim)
    queue = SimQueue(meter, sim.clock, visibility_timeout=30, max_receive_count=None)
    got: list = []
    fn = LambdaFunction(sim, "poller", 256, 60, 0.0, lambda: None)
    fn.invoke(lambda _state, _ms: got.append((queue.receive(10, 20), sim.now - sim.t0)))
    sim.at(sim.t0 + 5, queue.send, '{"id":"x"}', "x")
    sim.run()

    messages, at = got[0]
    assert [m.body for m in messages] == ['{"id":"x"}'] and at == pytest.approx(5.012)
    assert meter.calls == {"sqs:ReceiveMessage": 1}


def test_counting_store_implements_every_store_method():
    wanted = {
        n
        for port in (Store, KeyStore)
        for n, _ in inspect.getmembers(port, inspect.isfunction)
        if not n.startswith("_")
    }
    missing = {n for n in wanted if not callable(getattr(CountingStore, n, None))}
    assert not missing, f"CountingStore does not count {sorted(missing)}"


def test_counts_agree_with_the_real_adapters_on_moto():
    result = agreement(payloads=5, max_=2)

    assert result["agree"], (result["memory"], result["moto"])
    assert result["moto"]["states:StartExecution"] == 5


def test_keyed_counts_agree_with_the_real_adapters_on_moto():
    """Every payload under one concurrency key of cap 1: all but one park, and each end wakes one."""
    result = agreement(payloads=4, max_=3, ckey="tenant")

    assert result["agree"], (result["memory"], result["moto"])
    assert result["moto"]["states:StartExecution"] == 4
    assert (
        result["moto"]["dynamodb:TransactWriteItems"]
        > agreement(payloads=4, max_=3)["moto"]["dynamodb:TransactWriteItems"]
    )


def test_lane_counts_agree_with_the_real_adapters_on_moto():
    """Payloads sent to a priority lane and a low one in turn: every lane's pool read, its caps
    written, its shard in each claim's and release's transaction, the empty default lane's receives."""
    result = agreement(payloads=6, max_=3, lanes="fast:1:1,bulk:3:0")

    assert result["agree"], (result["memory"], result["moto"])
    assert result["moto"]["states:StartExecution"] == 6
    assert (
        result["moto"]["dynamodb:BatchGetItem"]
        > agreement(payloads=6, max_=3)["moto"]["dynamodb:BatchGetItem"]
    )


def test_fair_lane_counts_agree_with_the_real_adapters_on_moto():
    """Two tenants in turn in one fair lane: the first pass's newcomers claim the lane's 3 slots at
    once, shared out (the pass reads KEYS_WAITING and the tenants' CKEY#), the others park in their
    tenant's line; the lane's waker reads them again, sends the waiters back as slots free, they are
    claimed, and the emptied lines are forgotten (CKEY#'s fair lane removed)."""
    result = agreement(payloads=6, max_=3, ckey="heavy,light", lanes="default:3:0:1:fair")

    assert result["agree"], (result["memory"], result["moto"])
    assert result["moto"]["states:StartExecution"] == 6
    assert result["moto"]["sqs:SendMessage"] == 3  # the 3 that parked, each sent back once from its line


class _IgnoreTags(yaml.SafeLoader):
    """serverless.yml's CloudFormation tags (!Ref, !Sub ...) are not needed to read its sizes."""


_IgnoreTags.add_multi_constructor("!", lambda loader, suffix, node: None)


def test_sluice_is_simulated_at_the_sizes_serverless_yml_deploys():
    doc = yaml.load((ROOT / "serverless.yml").read_text(encoding="utf-8"), Loader=_IgnoreTags)
    defaults = doc["params"]["default"]
    assert doc["provider"]["architecture"] == SLUICE_ARCHITECTURE == "arm64"
    assert doc["functions"]["launcher"]["memorySize"] == "${self:custom.cfg.launcherMemory}"
    assert defaults["launcherMemory"] == SLUICE_LAUNCHER_MEMORY_MB == 128
    assert "memorySize" not in doc["functions"]["completion"]
    assert doc["provider"]["memorySize"] == SLUICE_COMPLETION_MEMORY_MB == 256
    # "Sluice" in the report is the lingering system: lingerSeconds' default.
    assert defaults["lingerSeconds"] == LINGER_SECONDS == 55
    assert LABEL[DEPLOYED] == "Sluice" and SYSTEMS[DEPLOYED].linger == LINGER_SECONDS
    assert SYSTEMS[NO_LINGER].linger == 0


def test_each_function_is_priced_at_its_own_size_and_architecture():
    r = run("sluice-linger", "fixed30", 5, 7, jobs=_jobs("fixed30", 20))
    launcher, completion = r["lambda"]["launcher"], r["lambda"]["completion"]
    assert (launcher["memory_mb"], launcher["architecture"]) == (128, "arm64")
    assert (completion["memory_mb"], completion["architecture"]) == (256, "arm64")
    poller = run("poller", "fixed30", 5, 7, jobs=_jobs("fixed30", 20))["lambda"]["poller"]
    assert (poller["memory_mb"], poller["architecture"]) == (256, "x86_64")

    # 1 GB-second on each architecture, and a million requests.
    costs = cost_usd(
        calls={},
        rru=0,
        wru=0,
        lambda_requests=1_000_000,
        gb_seconds={"arm64": 1.0, "x86_64": 1.0},
        log_bytes=0,
        fifo=True,
    )
    assert costs["lambda"] == pytest.approx(0.20 + 0.0000133334 + 0.0000166667)


def test_a_lambda_function_is_billed_by_its_memory():
    sim = Sim()
    small = LambdaFunction(sim, "launcher", 128, 60, 0.0, lambda: None, "arm64")
    large = LambdaFunction(sim, "launcher", 256, 60, 0.0, lambda: None, "arm64")
    for fn in (small, large):
        fn.invoke(lambda _state, _ms: sim.sleep(2.0))
    sim.run()
    assert small.gb_seconds == pytest.approx(2.0 * 128 / 1024)
    assert large.gb_seconds == pytest.approx(2 * small.gb_seconds)


def test_a_completion_hands_its_slot_over_in_its_release():
    """The hand-over against the completion before it, on the same jobs: per completion that finds
    a message, one read (the record and the pool item), one receive, one transaction, the start
    and the delete, where the release and the claim were two transactions and two reads."""
    jobs = _jobs("fixed30", 60, max_=10)
    before = run("sluice-release-then-refill", "fixed30", 10, 7, jobs=jobs)
    after = run("sluice", "fixed30", 10, 7, jobs=jobs)
    assert after["completed"] == before["completed"] == 60
    assert after["peak_concurrency"] <= 10 and after["dead_lettered"] == 0
    b, a = before["calls_by_api"], after["calls_by_api"]
    refills = 60 - 10  # every completion but the last ten found a message
    assert b["dynamodb:GetItem"] - a["dynamodb:GetItem"] >= 60  # the record is read with the pool item
    assert b["dynamodb:TransactWriteItems"] - a["dynamodb:TransactWriteItems"] >= refills  # no own claim
    assert a["states:StartExecution"] == b["states:StartExecution"] == 60
    assert after["api_calls_per_start"] < before["api_calls_per_start"] - 1.5  # 2 a refill


def test_the_calls_of_a_rounds_branches_happen_at_their_own_times():
    """A round's branches (``Parallel``, a tick's claims and starts in flight at once) each run from
    the moment the round began: a call after a branch's first sleep happens that much later, as it
    would, so a quota or a pacer meets it then; the round takes its longest branch."""
    sim = Sim()
    seen: list[tuple[str, float]] = []

    def round_() -> None:
        together = Parallel(sim)
        for name, waits in (("a", (0.5, 0.25)), ("b", (1.0,))):

            def branch(name: str = name, waits: tuple[float, ...] = waits) -> None:
                for w in waits:
                    sim.sleep(w)
                    seen.append((name, sim.clock.now() - sim.t0))

            together.branch(branch)
        seen.append(("issued", sim.clock.now() - sim.t0))
        together.join()
        seen.append(("joined", sim.clock.now() - sim.t0))

    sim.at(sim.t0, lambda: Container(sim, "c").start(round_))
    sim.run()
    assert seen == [("a", 0.5), ("a", 0.75), ("b", 1.0), ("issued", 0.0), ("joined", 1.0)]


def test_a_bucket_met_again_at_an_earlier_time_does_not_refill_twice():
    """The branches of a round call one after another from their own times, so StartExecution's
    bucket may see a time earlier than the last: it takes a token without refilling, and the
    refill up to the later time is not counted again."""
    bucket = TokenBucket(rate=10.0, burst=2)
    assert bucket.take(100.0) and bucket.take(100.0)
    assert not bucket.take(100.05)  # half a token
    assert bucket.take(100.1)  # a whole one: taken
    assert not bucket.take(100.0)  # an earlier branch's call: no token left, none refilled
    assert not bucket.take(100.15)  # half a token since 100.1, not one and a half since 100.0
    assert bucket.take(100.2)
