"""Issue 27, item 10: every CLI command and option, stack parameter, stack output and promise is in the docs.

The lists come from their sources, never from the docs: the CLI's argparse parser, serverless.yml and
stack/*.js, and the promises the reliability suite checks (each row of docs/reliability.md's promise
tables names tests that exist).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator

from sluice.cli.app import build_parser
from sluice.launch.settings import MAX_CEILING
from tests.support.docs import ROOT, pages, section, serverless, stack_parameters, table

# Options every command takes (``sluice --help`` and operations.md's Setup describe them once).
COMMON = {"--json", "--region", "--stack", "--stage", "-h", "--help"}


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], list[tuple[str, ...]]]]:
    """Each command path with its own options, each as its spellings (the common ones left out)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                own = [tuple(a.option_strings) for a in sub._actions if set(a.option_strings) - COMMON]
                yield (*path, name), own
                yield from _commands(sub, (*path, name))


def _paragraphs() -> list[str]:
    """Every paragraph, list item and code block of README.md and docs/*.md."""
    found = []
    for text in pages().values():
        found += re.split(r"\n\s*\n|\n(?=- )", text)
    return found


def _operations_sections(command: str) -> str:
    """The sections of docs/operations.md whose heading names ``sluice COMMAND``."""
    text = (ROOT / "docs" / "operations.md").read_text()
    headings = re.findall(r"^#+ .*$", text, flags=re.M)
    return "\n".join(section("operations.md", h) for h in headings if f"sluice {command}" in h)


def test_item10_every_cli_command_and_option_is_in_the_docs():
    """Each command has a section of docs/operations.md; each option is in it, or in a paragraph of
    the docs that names the command."""
    paragraphs = _paragraphs()
    operations = (ROOT / "docs" / "operations.md").read_text()
    missing = []
    for path, options in _commands(build_parser()):
        command = " ".join(path)
        if not re.search(rf"^#+ .*`sluice {re.escape(command)}[ `]", operations, re.M) and not any(
            f"sluice {command}" in p for p in paragraphs
        ):
            missing.append(f"sluice {command}")
            continue
        own = _operations_sections(command)
        for spellings in options:
            said = re.compile("|".join(rf"(?<![\w-]){re.escape(o)}(?![\w-])" for o in spellings))
            if not said.search(own) and not any(
                said.search(p) for p in paragraphs if f"sluice {command}" in p
            ):
                missing.append(f"sluice {command} {spellings[-1]}")
    text = "\n".join(pages().values())
    missing += [o for o in sorted(COMMON - {"-h", "--help"}) if o not in text]
    assert missing == [], "not in the docs"


def test_item10_every_stack_parameter_is_in_the_docs():
    """deploy.md's table lists each one (tests/deploy/test_docs_match_stack.py checks both ways)."""
    documented = {
        n
        for row in table("deploy.md", "## Parameters", "| Parameter |")
        for n in re.findall(r"`([^`]+)`", row[0])
    }
    assert sorted(stack_parameters() - documented) == []


def _stack_outputs() -> set[str]:
    """serverless.yml's outputs and those stack/*.js add (a lane's, named by its queue's id)."""
    outputs = {
        o for part in serverless()["resources"] if isinstance(part, dict) for o in part.get("Outputs", {})
    }
    for source in sorted((ROOT / "stack").glob("*.js")):
        js = source.read_text()
        outputs |= set(re.findall(r"Outputs\.(\w+)\s*=", js))
        for block in re.findall(r"const Outputs = \{\n(.*?)\n  \};", js, flags=re.S):
            outputs |= set(re.findall(r"^    (\w+):", block, flags=re.M))
        if "Outputs[`${id}Url`]" in js:
            outputs.add("Lane<Name>QueueUrl")
    return outputs


def test_item10_every_stack_output_is_in_the_docs():
    outputs = _stack_outputs()
    assert {"QueueUrl", "AlarmTopicArn", "LaneQueueUrls", "Lane<Name>QueueUrl"} <= outputs
    documented = {
        n for row in table("deploy.md", "### Outputs", "| Output |") for n in re.findall(r"`([^`]+)`", row[0])
    }
    assert sorted(outputs - documented) == []


# The promises, as the design states them (1 to 5) and as later work added them: a phrase of each that
# docs/reliability.md's promise tables must keep.
PROMISES = {
    1: "Never more than MAX executions RUNNING",
    2: "Never two executions of one payload key RUNNING at once",
    3: "Nothing lost",
    4: "Nothing leaks",
    5: "Bad input never crashes a tick and never blocks its FIFO group",
    6: "never starts before every key it awaits has SUCCEEDED",
    7: "Each effect is enqueued once",
    8: "never runs twice successfully",
    9: "no waiter stays parked",
    10: "Never more than a concurrency key's cap",
    11: "A payload waiting in its key's line spends no receives",
    12: "Never more than a lane's MAX",
    13: "A fair lane shares its slots",
}


def _promise_rows() -> dict[int, list[str]]:
    text = section("reliability.md", "## The promises")
    rows = {}
    for line in text.splitlines():
        if match := re.match(r"\| (\d+) \| (.*)", line):
            rows[int(match[1])] = [c.strip() for c in match[2].split(" | ")]
    return rows


def test_item10_every_promise_is_in_the_promise_tables_with_tests_that_exist():
    rows = _promise_rows()
    assert sorted(rows) == sorted(PROMISES)
    sources = "\n".join(p.read_text() for p in (ROOT / "tests").rglob("*.py"))
    defined = set(re.findall(r"^\s*def (test_\w+)", sources, flags=re.M))
    defined |= {p.stem for p in (ROOT / "tests").rglob("test_*.py")}
    for number, phrase in PROMISES.items():
        promise, *_, tests = rows[number]
        assert phrase in promise, f"promise {number}"
        named = set(re.findall(r"`(test_\w+)", tests))
        assert named, f"promise {number} names no test"
        assert sorted(n for n in named if n not in defined and not n.endswith(".py")) == [], (
            f"promise {number}"
        )
    protocol = section("protocol.md", "## Promises")
    for number in range(1, 6):
        assert PROMISES[number] in protocol, f"protocol.md, promise {number}"


def test_item8_maxconcurrency_bounds_are_stated_as_the_code_checks_them():
    """The deploy parameter's range (stack/config.js) and the run-time ceiling (set-max, SSM)."""
    config = (ROOT / "stack" / "config.js").read_text()
    low, high = map(int, re.search(r"integer\('maxConcurrency', [^,]+, (\d+), (\d+)\)", config).groups())
    [row] = [r for r in table("deploy.md", "## Parameters", "| Parameter |") if r[0] == "`maxConcurrency`"]
    assert f"{low} to {high:,}" in row[2]
    assert high == MAX_CEILING
    assert f"0 to {MAX_CEILING:,}" in section("operations.md", "### `sluice set-max N`")


def test_item10_every_setting_the_functions_read_is_in_configuration_md():
    read = set(
        re.findall(r'"(SLUICE_[A-Z_]+)"', (ROOT / "lib" / "sluice" / "launch" / "settings.py").read_text())
    )
    assert len(read) > 20
    documented = set(re.findall(r"`(SLUICE_[A-Z_]+)`", (ROOT / "docs" / "configuration.md").read_text()))
    assert sorted(read - documented) == []
