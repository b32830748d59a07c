"""No import cycle between the product's modules (issue 23: 0 cycles). The layer order
itself, the independence of the platform packages and the bottom package's isolation
are import-linter's contracts (.importlinter, run by scripts/test.sh); this checks what
they cannot: that no module of the product reaches itself again through its imports,
inside an app as well as across apps. Imports made inside functions count too; imports
under `if TYPE_CHECKING:` do not (they never run: annotations naming a model of the
package that imports them, as the platform registry's do)."""

import grimp

PRODUCT = ("agentloop", "conversations", "tools", "delivery", "audit")


def _graph():
    graph = grimp.build_graph(*PRODUCT, include_external_packages=False, exclude_type_checking_imports=True,
                              cache_dir=None)
    modules = {m for m in graph.modules if ".migrations" not in m and not m.endswith(".migrations")}
    return {m: sorted(i for i in graph.find_modules_directly_imported_by(m) if i in modules) for m in modules}


def _cycles(imports) -> list:
    """Strongly connected components of more than one module (Tarjan, iteratively)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(imports[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(imports[child])))
                    break
                if child in on_stack:
                    low[module] = min(low[module], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def test_no_import_cycle_between_modules_of_the_product():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": ["b"], "b": ["c"], "c": ["a"], "d": ["a"]}) == [["a", "b", "c"]]


# OpenTelemetry's SDK, its OTLP exporter and protobuf: loaded only by a process that
# traces (agentloop.core.tracing). Its API alone is imported by the MCP SDK
# (mcp.shared._otel), which a process loads only when it first talks MCP (tools/mcp/client.py).
TRACING_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter", "opentelemetry.proto", "google.protobuf")
UNTRACED = ("AGENTLOOP_TRACING", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def _loaded_in(argv, modules, tmp_path, **env):
    """Which of `modules` a product process started as `argv` has loaded once Django is
    set up and everything it serves is imported, a span asked for on the way (its kind
    comes from argv, as settings.py reads it: the product's start-up work runs)."""
    import os
    import subprocess
    import sys

    from django.conf import settings

    code = (f"import sys; sys.argv = {argv!r}; import django; django.setup(); "
            "import agentloop.urls, agentloop.asgi, conversations.worker, conversations.management.commands.runloop; "
            "from agentloop.core import tracing; tracing.span('agentloop.admit').end(); "
            f"print(sorted({{p for p in {modules!r} for m in sys.modules if m == p or m.startswith(p + '.')}}))")
    env = {**{k: v for k, v in os.environ.items() if k not in UNTRACED}, "DJANGO_SETTINGS_MODULE": "agentloop.settings",
           "AGENTLOOP_METRICS_DIR": str(tmp_path / "metrics"), **env}
    done = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_web_server_does_not_import_the_model_providers_sdk(tmp_path):
    """The openai SDK costs a web server's start about a second of CPU (11 s on a loaded
    2-core machine, measured with -X importtime), and every test that starts one pays it:
    only the worker's agents and transcription import it, where they run. Nor does it
    load OpenTelemetry's SDK while it does not trace."""
    loaded = _loaded_in(["agentloop/web_server.py"], ("openai", "pypdf", "PIL", "mcp", "mcp_types", *TRACING_MODULES),
                        tmp_path)
    assert loaded == "[]", f"the web server imports {loaded}"


def test_a_worker_that_does_not_trace_never_loads_opentelemetry(tmp_path):
    """Nor the MCP SDK, until a tool call or a listing needs it (tools/mcp/client.py)."""
    loaded = _loaded_in(["manage.py", "runloop"], ("mcp", "mcp_types", *TRACING_MODULES), tmp_path)
    assert loaded == "[]", f"the worker imports {loaded}"


def test_a_worker_that_traces_loads_it_at_start(tmp_path):
    """The check above can see them: a process told to trace loads them (at start, not
    at its first message)."""
    loaded = _loaded_in(["manage.py", "runloop"], TRACING_MODULES, tmp_path,
                        OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_EXPORTER_OTLP_TIMEOUT="0.2")
    assert loaded == repr(sorted(TRACING_MODULES))


def _admin_of(argv, tmp_path):
    """In a process started as `argv`: whether its set-up imported the admin modules, and
    the admin's registrations once a URL is reversed (the URLconf loaded)."""
    import os
    import subprocess
    import sys

    from django.conf import settings

    code = (f"import sys; sys.argv = {argv!r}; import django; django.setup(); "
            "import conversations.management.commands.runloop; "
            "at_setup = sorted(m for m in ('conversations.admin', 'delivery.admin', 'unfold.admin') if m in sys.modules); "
            "from django.urls import reverse; reverse('admin:conversations_channel_changelist'); "
            "from django.contrib import admin; print(at_setup, sorted(m._meta.label for m in admin.site._registry))")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "agentloop.settings", "AGENTLOOP_METRICS_DIR": str(tmp_path / "metrics")}
    done = subprocess.run([sys.executable, "-c", code], cwd=settings.BASE_DIR, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_worker_sets_up_without_the_admin_and_has_all_of_it_with_the_urlconf(tmp_path):
    """A worker serves no page: the admin's modules (about 0.1 s of its set-up CPU) are
    imported only when it loads the URLconf, and then every model is registered as in a
    web process, whose set-up imports them (AdminConfig)."""
    worker = _admin_of(["manage.py", "runloop"], tmp_path)
    web = _admin_of(["agentloop/web_server.py"], tmp_path)
    assert worker.startswith("[] "), worker
    assert web.startswith("['conversations.admin', 'delivery.admin', 'unfold.admin'] "), web
    assert worker.split("] ", 1)[1] == web.split("] ", 1)[1]
    assert "'conversations.Channel'" in worker
