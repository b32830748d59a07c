"""Every reference to the product's code in the manual and in the code's own words resolves
(issue 52: docstrings and docs named modules that no longer existed).

Read: docs/**/*.md (not docs/diary/, the measurement diary, which records the code as it
was), README.md, and the docstrings (ast) and comments (tokenize) of the product's modules
(not their migrations: a migration records the past too). A reference is a dotted name
that starts with one of the product's packages — `delivery.ledger.send`, `tools.guard.
invoke()` — or a path into one of them — `conversations/platforms/telegram/`. A dotted
name resolves when a prefix of it imports as a module and the rest are attributes of it,
one after the other; a path, when the file or folder exists. A failure lists every stale
reference as `file:line: reference`, to be fixed where it is written."""

import ast
import functools
import importlib
import io
import re
import tokenize
from pathlib import Path

from django.apps import apps

BASE_DIR = Path(__file__).resolve().parents[2]
PACKAGES = ("agentloop", "conversations", "tools", "delivery", "audit")
_PACKAGE = "|".join(PACKAGES)
# Not after a letter, a dot, a slash or a dash: `docs/tools.md`, `x.tools.y`, a URL's host.
_BEFORE = r"(?<![\w./\-@])"
DOTTED = re.compile(rf"{_BEFORE}(?:{_PACKAGE})(?:\.[A-Za-z_]\w*)+")
# A path ends in a slash or a file's suffix, or has a folder between: `tools/call` and
# `tools/list_changed` are MCP's methods, `conversations/s` a rate.
SLASHED = re.compile(rf"{_BEFORE}(?:{_PACKAGE})/(?:[\w.\-]+/)*(?:[\w\-]+\.\w+)?")
# A file's name, not a module's attribute: `tools.md`, `conversations.py`.
FILE_SUFFIXES = (".md", ".py", ".html", ".txt", ".json", ".yml", ".yaml", ".toml", ".ini", ".css", ".js", ".po",
                 ".mo", ".sh", ".png", ".svg", ".sqlite3", ".log")


def manual_files() -> list[Path]:
    docs = BASE_DIR / "docs"
    pages = [p for p in docs.rglob("*.md") if "diary" not in p.relative_to(docs).parts]
    return sorted(pages) + [BASE_DIR / "README.md"]


def product_modules() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (BASE_DIR / package).rglob("*.py")
                  if "migrations" not in p.parts)


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def markdown_texts(path: Path):
    """(line number, text) for each line of a page."""
    yield from enumerate(path.read_text().splitlines(), start=1)


def docstring_nodes(tree: ast.Module):
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                yield first.value


def python_texts(path: Path):
    """(line number, text) for each line of a module's docstrings, as written (so that
    the line numbers are the file's), and for each comment."""
    source = path.read_text()
    lines = source.splitlines()
    for node in docstring_nodes(parsed(path)):
        for number in range(node.lineno, node.end_lineno + 1):
            yield number, lines[number - 1]
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def references(text: str):
    """The dotted names and the paths in a line of text, without what follows them
    (`()`, a sentence's full stop, a backtick)."""
    for match in DOTTED.finditer(text):
        name = match.group()
        if not name.endswith(FILE_SUFFIXES):
            yield name
    for match in SLASHED.finditer(text):
        yield match.group().rstrip(".")


def _imports(module: str) -> bool:
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        # Only this module's absence: a module that exists and fails to import is an error
        # of its own, raised.
        if error.name is not None and (module == error.name or module.startswith(error.name + ".")):
            return False
        raise
    return True


def resolves(reference: str) -> bool:
    if "/" in reference:
        return (BASE_DIR / reference).exists()
    return is_code(reference) or is_permission(reference) or reference in names_written()


def is_code(reference: str) -> bool:
    """A module, or a module's attribute's attribute…"""
    parts = reference.split(".")
    for length in range(len(parts), 0, -1):
        module = ".".join(parts[:length])
        if _imports(module):
            target = importlib.import_module(module)
            for attribute in parts[length:]:
                if not hasattr(target, attribute):
                    return False
                target = getattr(target, attribute)
            return True
    return False


def is_permission(reference: str) -> bool:
    """A permission's name, `app_label.codename` (`conversations.change_channel`)."""
    label, _, codename = reference.partition(".")
    try:
        app = apps.get_app_config(label)
    except LookupError:
        return False
    codenames = {f"{action}_{model._meta.model_name}" for model in app.get_models()
                 for action in model._meta.default_permissions}
    codenames |= {name for model in app.get_models() for name, _ in model._meta.permissions}
    return codename in codenames


@functools.cache
def names_written() -> frozenset[str]:
    """The strings the product's code writes: a span's or an attribute's name
    (`agentloop.admit`, `agentloop.turn.id`) is the product's word, not a module."""
    return frozenset(node.value for path in product_modules() for node in ast.walk(parsed(path))
                     if isinstance(node, ast.Constant) and isinstance(node.value, str))


def stale_references() -> list[str]:
    found = []
    texts = [(path, markdown_texts(path)) for path in manual_files()]
    texts += [(path, python_texts(path)) for path in product_modules()]
    cache: dict[str, bool] = {}
    for path, lines in texts:
        for number, text in lines:
            for reference in references(text):
                if reference not in cache:
                    cache[reference] = resolves(reference)
                if not cache[reference]:
                    found.append(f"{path.relative_to(BASE_DIR)}:{number}: {reference}")
    return found


def test_the_scan_reads_the_manual_and_the_code():
    """The reading itself: names of each kind are found (so an empty list of stale ones
    is not a scan that read nothing)."""
    seen = {reference for path in manual_files() for _, text in markdown_texts(path) for reference in references(text)}
    assert "delivery.ledger" in " ".join(seen)
    assert any("/" in reference for reference in seen)
    assert list(references("see `tools.guard.invoke()`, docs/tools.md and conversations/platforms/.")) \
        == ["tools.guard.invoke", "conversations/platforms/"]
    assert not resolves("delivery.no_such_module") and not resolves("delivery.ledger.no_such_name")
    assert resolves("conversations/platforms/") and not resolves("conversations/no_such_folder/")
    assert resolves("conversations.change_channel") and not resolves("conversations.change_no_such_model")


def test_every_dotted_reference_and_path_resolves():
    stale = stale_references()
    assert not stale, f"{len(stale)} references to code that does not exist:\n" + "\n".join(stale)
