"""The crash matrix on the suite's database (SQLite in the SQLite run, PostgreSQL in the
PostgreSQL run): at every named fault point the real process that reaches it is killed
(SIGKILL) and started again; afterwards no acknowledged message is unanswered, no reply
arrived twice without the recovery label, and the booking asked for happened exactly
once. `python -m tests.faults` prints the same matrix for both databases."""

import pytest

from audit.failpoints import POINTS
from tests.conftest import is_postgres
from tests.faults.matrix import row, run_all, table

pytestmark = pytest.mark.e2e


def test_a_crash_at_every_fault_point_is_recovered(processes, fake_telegram):
    database = "postgresql" if is_postgres() else "sqlite"
    results = run_all(processes, fake_telegram, database)
    report = f"{table([row(r) for r in results])}\nprocess logs: {processes.log_dir}"

    assert [r.point for r in results] == list(POINTS)
    for result in results:
        assert not result.problems, report  # it died at its point, and all was quiet again
        assert result.lost == 0, report
        assert result.unlabelled == 0, report
        assert result.effects == result.expected_effects == 1, report
    # The points are really crossed: replies that may have gone out are resent
    # labelled, and turns that had acted are answered with a notice, not re-run.
    assert sum(r.labelled for r in results) > 0 and sum(r.notices for r in results) > 0, report
