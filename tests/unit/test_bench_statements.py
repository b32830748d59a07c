"""tests.bench.statements counts PostgreSQL's round trips from libpq's trace."""

from tests.bench.statements import round_trips

# libpq's trace of BEGIN, one parameterised SELECT and COMMIT (PQtrace, timestamps
# suppressed), as psycopg writes it.
TRACE = """F\t10\tQuery\t "BEGIN"
B\t17\tCommandComplete\t "BEGIN"
B\t5\tReadyForQuery\t T
F\t21\tParse\t "" "select $1" 1 21
F\t22\tBind\t "" "" 1 1 1 2 '\\x00\\x01' 1 0
F\t6\tDescribe\t P ""
F\t9\tExecute\t "" 0
F\t4\tSync
B\t4\tParseComplete
B\t13\tCommandComplete\t "SELECT 1"
B\t5\tReadyForQuery\t T
F\t11\tQuery\t "COMMIT"
B\t5\tReadyForQuery\t I
"""


def test_each_query_and_each_sync_is_a_round_trip():
    assert round_trips(TRACE.splitlines(keepends=True)) == 3
