"""The tests' helpers, not tests: fixtures' plugins (browser, redis_server, s3_server), the
database's template and flush, the zygote that forks the product's processes, the agents and
tools registered for the tests by dotted path (`tests.support.agents_for_tests…`), and the
platforms' request builders (e2e for Telegram, slack, whatsapp)."""
