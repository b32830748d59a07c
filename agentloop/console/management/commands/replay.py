"""`manage.py replay RECORDING [options] [--json OUT]`: replay a recording against a
changed agent and compare (agentloop.console.replay); `manage.py replay --suite DIR`:
every recording of a folder against its expectations, non-zero exit on a failure."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agentloop.console.replay import comparison, document, playback, suites
from agentloop.console.replay.document import RecordingError
from agentloop.console.replay.playback import ReplayError


def _json(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise CommandError(f"not JSON: {value!r} ({exc.msg})") from None


class Command(BaseCommand):
    help = "Replay a recorded conversation in virtual time against a chosen agent configuration, and compare."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("recording", nargs="?", help="A recording (manage.py recording export).")
        parser.add_argument("--suite", help="A folder of recordings with expectations: replay them all, fail on one.")
        parser.add_argument("--agent", help="The agent to replay with; 'recorded' plays the recording's answers.")
        parser.add_argument("--agent-config", help="JSON merged over the recorded agent_config.")
        parser.add_argument("--model", help="The model (agent_config's model).")
        parser.add_argument("--prompt", help="The system prompt (agent_config's system_prompt).")
        parser.add_argument("--tools", help="The tools the agent may call, by name, separated by commas.")
        parser.add_argument("--window-ms", type=int, help="One window for every text, in milliseconds.")
        parser.add_argument("--double-texting", help="enqueue, reject, interrupt or rollback.")
        parser.add_argument("--set", action="append", default=[], metavar="SETTING=VALUE",
                            help="Any recorded channel setting (window_closed=1.5, max_wait=20…); repeatable.")
        parser.add_argument("--json", help="Write the report as JSON to this file ('-': standard output).")

    def handle(self, *args: Any, **options: Any) -> None:
        if bool(options["recording"]) == bool(options["suite"]):
            raise CommandError("give a recording, or --suite DIR")
        try:
            if options["suite"]:
                self.suite(Path(options["suite"]), self.configuration(options))
            else:
                self.one(Path(options["recording"]), self.configuration(options), options["json"])
        except (RecordingError, ReplayError) as exc:
            raise CommandError(str(exc)) from None

    @staticmethod
    def configuration(options: dict[str, Any]) -> dict[str, Any]:
        """The options given, as a replay configuration's JSON (a suite's own is merged under them)."""
        given: dict[str, Any] = {"agent": options["agent"], "model": options["model"],
                                 "system_prompt": options["prompt"], "window_ms": options["window_ms"],
                                 "double_texting": options["double_texting"]}
        if options["agent_config"]:
            given["agent_config"] = _json(options["agent_config"])
        if options["tools"] is not None:
            given["tools"] = [name.strip() for name in options["tools"].split(",") if name.strip()]
        pairs = [item.split("=", 1) for item in options["set"]]
        if any(len(pair) != 2 for pair in pairs):
            raise CommandError("--set takes SETTING=VALUE")
        if pairs:
            given["settings"] = dict(pairs)
        return {key: value for key, value in given.items() if value is not None}

    def warn_if_holding(self, configuration: playback.Configuration, recorded: document.Document) -> None:
        if playback.holds_writers(configuration, recorded):
            self.stderr.write("warning: on SQLite a replay holds the database's write lock while its agent answers; "
                              "run it on a copy of the database, not beside a live product")

    def one(self, path: Path, given: dict[str, Any], output: str | None) -> None:
        recorded = document.read(path)
        configuration = playback.configuration_of(given)
        self.warn_if_holding(configuration, recorded)
        result = playback.replay(recorded, configuration)
        report = comparison.report(recorded, result)
        compared = report["comparison"]
        self.stderr.write(f"{path}: {compared['totals']['recorded']['turns']} turn(s) recorded, "
                          f"{compared['totals']['replayed']['turns']} replayed in {result['wall_ms']} ms "
                          f"({result['virtual_ms']} ms of virtual time); "
                          f"{'the same' if compared['same'] else 'different: see the report'}")
        if output:
            text = json.dumps(report, ensure_ascii=False, indent=2) + "\n"
            sys.stdout.write(text) if output == "-" else Path(output).write_text(text, encoding="utf-8")

    def suite(self, folder: Path, given: dict[str, Any]) -> None:
        cases = list(suites.cases(folder))
        failed = 0
        for number, case in enumerate(cases, 1):
            self.stdout.write(f"[{number}/{len(cases)}] {case.recording.name} … ", ending="")
            self.stdout.flush()
            began = time.monotonic()
            recorded = suites.load(case)
            configuration = playback.configuration_of({**case.configuration, **given})
            self.warn_if_holding(configuration, recorded)
            result = playback.replay(recorded, configuration)
            problems = suites.failures(recorded, result, case.expect)
            took = f"{time.monotonic() - began:.2f} s"
            if problems:
                failed += 1
                self.stdout.write(f"FAILED ({took})")
                for problem in problems:
                    self.stdout.write(f"    {case.recording.name}: {problem}")
            else:
                self.stdout.write(f"ok ({len(case.expect)} expectation(s), {took})")
        if failed:
            raise CommandError(f"{failed} of {len(cases)} recording(s) failed their expectations")
        self.stdout.write(f"{len(cases)} recording(s), every expectation met")
