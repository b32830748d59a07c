"""The configuration page cannot drift: every variable settings.py reads is in the one
table (agentloop/config_table.py), the table claims nothing settings.py does not read,
literal defaults agree, and docs/configuration.md is what the generator writes now.
No database, no processes: settings.py is parsed, not imported."""

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

BASE_DIR = next(p for p in Path(__file__).resolve().parents if (p / "manage.py").exists())
SETTINGS = BASE_DIR / "agentloop" / "settings.py"
REGENERATE = ".venv/bin/python scripts/config_docs.py"
# django-environ: every call env(...) or env.<method>(...) reads one variable (env.str,
# env.bool, env.db_url, …), except these, which read none.
NOT_READERS = {"read_env"}


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


table = _load("agentloop_config_table_test", BASE_DIR / "agentloop" / "config_table.py")
generator = _load("config_docs_test", BASE_DIR / "scripts" / "config_docs.py")


def _is_os_environ(node):
    return (isinstance(node, ast.Attribute) and node.attr == "environ"
            and isinstance(node.value, ast.Name) and node.value.id == "os")


def settings_reads():
    """[(name, default node or None, line)] for every read of the environment in settings.py;
    a read whose name is not a string literal fails here (it could not be checked)."""
    reads, unreadable = [], []
    for node in ast.walk(ast.parse(SETTINGS.read_text())):
        name_node = default = None
        if isinstance(node, ast.Call):
            func = node.func
            is_env = (isinstance(func, ast.Name) and func.id == "env") or (
                isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name)
                and func.value.id == "env" and func.attr not in NOT_READERS)
            is_os = (isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault")
                     and _is_os_environ(func.value)) or (
                isinstance(func, ast.Attribute) and func.attr == "getenv"
                and isinstance(func.value, ast.Name) and func.value.id == "os")
            if not (is_env or is_os):
                continue
            if not node.args:
                unreadable.append(node.lineno)
                continue
            name_node = node.args[0]
            default = next((kw.value for kw in node.keywords if kw.arg == "default"), None)
            if default is None and is_os and len(node.args) > 1:
                default = node.args[1]
        elif isinstance(node, ast.Subscript) and _is_os_environ(node.value):
            name_node = node.slice
        else:
            continue
        if isinstance(name_node, ast.Constant) and isinstance(name_node.value, str):
            reads.append((name_node.value, default, node.lineno))
        else:
            unreadable.append(node.lineno)
    assert not unreadable, f"settings.py reads the environment by a computed name at lines {unreadable}"
    return reads


def test_settings_reads_are_found():
    names = {name for name, _, _ in settings_reads()}
    # The parser's own check: a few reads settings.py is known to make.
    assert {"DATABASE_URL", "SECRET_KEY", "AGENTLOOP_AGENT_DEADLINE", "EMAIL_URL"} <= names


def test_every_variable_settings_reads_is_in_the_table():
    documented = {var.name for var in table.VARIABLES}
    missing = sorted({name for name, _, _ in settings_reads()} - documented)
    assert not missing, f"add these to agentloop/config_table.py, then run {REGENERATE}: {missing}"


def test_the_table_claims_only_what_settings_reads():
    read = {name for name, _, _ in settings_reads()}
    extra = sorted(var.name for var in table.VARIABLES if var.read_by == table.SETTINGS and var.name not in read)
    assert not extra, f"agentloop/config_table.py lists variables settings.py does not read: {extra}"


def test_rows_read_elsewhere_are_read_somewhere():
    """A row read outside settings names a variable some module of the product spells out."""
    skip = {".venv", ".git", "tests", "node_modules", "site", "var", "docs", "static", "templates"}
    tops = [p for p in BASE_DIR.iterdir() if p.is_dir() and not p.is_symlink() and p.name not in skip]
    sources = [BASE_DIR / "manage.py", *(path for top in tops for path in top.rglob("*.py")
                                         if "node_modules" not in path.parts and path.name != "config_table.py")]
    text = "\n".join(path.read_text(errors="replace") for path in sources)
    unread = [var.name for var in table.VARIABLES
              if var.read_by != table.SETTINGS and not re.search(rf"\b{var.name}\b", text)]
    assert not unread, f"no module of the product reads {unread}: drop them from agentloop/config_table.py"


def test_no_variable_twice():
    names = [var.name for var in table.VARIABLES]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def _spellings(value):
    if isinstance(value, bool):
        return {str(value).lower()}
    if isinstance(value, float) and value.is_integer():
        return {str(value), str(int(value))}
    return {str(value)}


def test_literal_defaults_agree():
    """Where settings.py gives a literal default, the table's default says it."""
    rows = {var.name: var for var in table.VARIABLES}
    wrong = []
    for name, default, line in settings_reads():
        if not isinstance(default, ast.Constant) or default.value in (None, ""):
            continue
        said = rows[name].default.strip("`")
        if not any(re.search(rf"(?<![\w.]){re.escape(s)}(?![\w]|\.\d)", said) for s in _spellings(default.value)):
            wrong.append(f"{name}: settings.py line {line} says {default.value!r}, the table {rows[name].default!r}")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("page", ["configuration.md"])
def test_the_page_is_what_the_generator_writes(page):
    path = BASE_DIR / "docs" / page
    assert path.exists() and path.read_text() == generator.render(table), (
        f"docs/{page} is out of date: run {REGENERATE}")
