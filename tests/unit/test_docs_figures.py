"""Issue 27, items 8 and 10: the figures, lists and snippets the docs keep come from their sources.

- docs/benchmarks.md: every table row is one the benchmark's report prints from bench/results.json.
- The semaphore step's states to copy are what `sluice semaphore asl` prints.
"""

from __future__ import annotations

import json
import re
import shlex

from bench import docs_tables
from sluice.cli.app import main
from tests.support.docs import DOCS, ROOT, section, table

RESULTS = ROOT / "bench" / "results.json"


def _generated() -> set[str]:
    text = docs_tables.generated(json.loads(RESULTS.read_text()))
    return {line for line in text.splitlines() if line.startswith("|")}


def test_item10_every_table_row_of_benchmarks_md_is_printed_by_the_benchmark():
    """The one table written by hand says what each system is; it holds no figure."""
    generated = _generated()
    tables = re.findall(r"^(?:\|.*\n)+", (DOCS / "benchmarks.md").read_text(), flags=re.M)
    rows = [row for t in tables if not t.startswith("| system | what it is |") for row in t.splitlines()]
    assert len(rows) > 50
    assert [row for row in rows if row not in generated] == []


def test_item10_make_bench_writes_the_tables_of_benchmarks_md_as_they_are(tmp_path):
    """``bench.docs_tables.sync`` (what ``make bench`` runs after writing the results file) finds
    nothing to change in the page as committed; on a page whose figures moved it puts them back."""
    data = json.loads(RESULTS.read_text())
    page = tmp_path / "benchmarks.md"
    committed = (DOCS / "benchmarks.md").read_text()
    page.write_text(committed)
    assert docs_tables.sync(page, data) == 0
    target = next(row for row in committed.splitlines() if row.startswith("| standing by: <= $5 a month"))
    stale = committed.replace(target, target.replace("| met |", "| **missed** |"))
    stale = stale.replace("| Sluice, no linger, woken by `sluice enqueue` |", "| Sluice, old row |")
    # A table of chosen rows (three systems' fixed30 runs at MAX 100) keeps its choice.
    poller = next(row for row in committed.splitlines() if row.startswith("| fixed30 | SQS poller"))
    stale = stale.replace(poller, poller.replace("| 0.500 |", "| 0.499 |", 1))
    page.write_text(stale)
    assert docs_tables.sync(page, data) == 4  # the targets, the two tables with that row, the chosen rows
    assert page.read_text() == committed


def _asl_snippets() -> list[tuple[str, str, str]]:
    """Each JSON block of the docs that holds a semaphore's Acquire: (page, the command above it, JSON)."""
    found = []
    for page in sorted(DOCS.glob("*.md")):
        text = page.read_text()
        for match in re.finditer(r"```json\n(.*?)```", text, flags=re.S):
            if "waitForTaskToken" not in match[1]:
                continue
            before = text[: match.start()].rstrip().split("\n")
            command = next((line for line in reversed(before) if line.startswith("$ sluice ")), "")
            found.append((page.name, command, match[1]))
    return found


def test_item8_the_semaphore_states_to_copy_are_what_sluice_semaphore_asl_prints(capsys):
    """The docs once showed states that differed from the command's; now each snippet is its output."""
    snippets = _asl_snippets()
    assert snippets, "no semaphore states in the docs"
    for page, command, snippet in snippets:
        assert command.startswith("$ sluice semaphore asl "), f"{page}: a snippet no command printed"
        assert main(shlex.split(command)[2:]) == 0
        printed = capsys.readouterr().out
        assert json.loads(snippet) == json.loads(printed), f"{page}: {command}"


def _cost_rows() -> dict[str, tuple[str, str]]:
    rows = table("deploy.md", "### What it costs standing by", "| what |")
    return {row[0]: (row[1], row[2]) for row in rows}


def _dollars(cell: str) -> float:
    return float(re.search(r"\$(\d+\.\d\d)", cell)[1])


def test_item8_the_standing_cost_is_stated_once_from_the_bench_and_the_stacks_alarms():
    """deploy.md prices a stage standing by; its functions' rows are the benchmark's idle month, its
    alarm row counts deploy.md's alarm table (which tests/deploy/test_docs_match_stack.py keeps equal
    to the template); benchmarks.md links there instead of pricing alarms of its own."""
    data = json.loads(RESULTS.read_text())
    idle, bare = data["idle_month_usd"]["sluice-linger"], data["idle_month_usd"]["sluice"]
    rows = _cost_rows()
    assert _dollars(rows["launcher time"][1]) == idle["lambda"]
    why, cost = rows["launcher calls and logs"]
    assert _dollars(cost) == round(idle["sqs"] + idle["dynamodb"] + idle["logs"], 2)
    assert f"{idle['api_calls_per_month']:,} AWS calls" in why
    why, cost = rows["custom metrics"]
    metrics = re.findall(r"`(\w+)`", why.split(";")[0])
    assert f"{len(metrics)} metrics" in why and _dollars(cost) == round(0.30 * len(metrics), 2)
    alarms = {
        name
        for row in table("deploy.md", "## Alarms", "| Alarm |")
        for name in re.findall(r"`([^`]+)`", row[0])
        if "<name>" not in name
    }
    why, cost = rows["alarms"]
    assert why.startswith(f"{len(alarms)} standard-resolution alarms")
    assert _dollars(cost) == round(0.10 * len(alarms), 2)
    low = sum(_dollars(c) for w, (_, c) in rows.items() if w and w not in ("dashboard", "storage"))
    total = rows[""][1]
    assert f"about ${low:.1f}0" in total and f"${low + 3:.1f}0 past" in total
    text = section("deploy.md", "### What it costs standing by")
    assert (
        f"the first two rows come to ${bare['total']:.2f} (43,200 short ticks, {bare['api_calls_per_month']:,} calls)"
        in text
    )
    assert f"**${data['linger']['standing_cost_per_month_usd']:.2f}**" in text
    wake = data["linger"]["wake"]
    latency = section("deploy.md", "### Idle latency and what it costs")
    assert f"({wake['trickle_start_latency_p50_s']:.2f} s p50 in `make bench`" in latency
    assert (
        f"a wake costs ${wake['cost_per_million_wakes_usd']:.2f} a million at MAX {data['meta']['trickle']['max']}"
        in latency
    )
    benchmarks = (DOCS / "benchmarks.md").read_text()
    assert "deploy.md#what-it-costs-standing-by" in benchmarks
    assert not re.search(
        r"\b(\d+|one|two|three|four|five|six|ten|twelve) (standard-resolution )?alarms\b", benchmarks
    )
