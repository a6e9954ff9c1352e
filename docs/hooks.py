"""MkDocs hooks: the reference pages generated from the code, and a docstring clean-up.

Registered in ``docs/mkdocs.yml`` (``hooks: [hooks.py]``). At every build,
:func:`on_files` adds three pages that exist only in the build, so they cannot drift
from the code and nothing generated is committed:

- ``reference/config.md``: every section and key of :class:`pipeline.config.Config`
  (walked from the dataclasses: names, accepted values, defaults, ``#:`` comments),
  then the spec classes parsed from YAML values (``FeatureSpec``, ``LabelSpec``,
  ``SessionSpec``, ...), with their docstrings;
- ``reference/cli.md``: every subcommand and option of ``pipeline.cli._parser()``;
- ``troubleshooting.md``: every class of ``pipeline.errors.__all__``, with the cause and
  fix written in ``docs/troubleshooting.yml``.

Problems (an error class without a troubleshooting entry, an entry or a config note
naming something that no longer exists) are logged as warnings, which fail
``mkdocs build --strict``. ``tests/test_docs.py`` imports this file and calls the same
functions.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import logging
import os
import re
import textwrap
import typing
from pathlib import Path
from typing import Any, Callable

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
TROUBLESHOOTING = HERE / "troubleshooting.yml"
CONFIG_NOTES = HERE / "config_notes.yml"

log = logging.getLogger("mkdocs.hooks.pipeline_docs")

# -- docstrings to markdown ------------------------------------------------------------------

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const):`~?([^`]+)`")


def _role_text(match: re.Match[str]) -> str:
    target = match.group(0)
    name = match.group(1)
    # ``:func:`~a.b.c``` shows ``c``, as Sphinx does.
    return f"`{name.rsplit('.', 1)[-1] if '`~' in target else name}`"


def rst_to_md(text: str) -> str:
    """Docstring prose (reST-flavoured, numpydoc) as markdown.

    Roles become code spans; a numpydoc definition list (a term line, then its indented
    description) becomes a markdown list. Double-backtick literals are already code spans
    in markdown.
    """
    text = _ROLE.sub(_role_text, textwrap.dedent(text).strip("\n"))
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line and not line[0].isspace() and nxt.startswith("    ") and (not out or not out[-1].strip()
                                                                       or out[-1].startswith("- ")):
            body = []
            i += 1
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                if not lines[i].strip() and (i + 1 >= len(lines) or not lines[i + 1].startswith("    ")):
                    break
                body.append(lines[i].strip())
                i += 1
            out.append(f"- {line.strip()}: " + " ".join(b for b in body if b))
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def docstring_md(obj: Any, *, skip_fields: bool = False) -> str:
    """An object's numpydoc docstring as markdown (text, attributes, admonitions such as
    ``Kinds``); ``skip_fields`` leaves out an ``Attributes`` section (the caller lists the
    fields in a table of its own)."""
    import griffe

    doc = inspect.getdoc(obj)
    if not doc:
        return ""
    parts: list[str] = []
    for section in griffe.Docstring(doc).parse("numpy"):
        kind = section.kind.value
        if kind == "text":
            parts.append(rst_to_md(section.value))
        elif kind == "admonition":
            adm = section.value
            parts.append(f"**{section.title or adm.annotation}**\n\n{rst_to_md(adm.description)}")
        elif kind in ("attributes", "parameters") and not skip_fields:
            parts.append("\n".join(f"- `{item.name}`: {rst_to_md(item.description)}".replace("\n", " ")
                                   for item in section.value))
    return "\n\n".join(p for p in parts if p.strip())


def attribute_docs(obj: Any) -> dict[str, str]:
    """Descriptions of a dataclass's fields: the ``Attributes`` section of its docstring,
    then the ``#:`` comments above each field (Sphinx's convention), which win."""
    import griffe

    docs: dict[str, str] = {}
    doc = inspect.getdoc(obj)
    if doc:
        for section in griffe.Docstring(doc).parse("numpy"):
            if section.kind.value == "attributes":
                for item in section.value:
                    for name in item.name.split(","):
                        docs[name.strip()] = rst_to_md(item.description).replace("\n", " ")
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        return docs
    comment: list[str] = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            comment.append(stripped[2:].strip())
            continue
        m = re.match(r"^\s+([A-Za-z_]\w*)\s*:", line)
        if m and comment:
            docs[m.group(1)] = rst_to_md(" ".join(comment))
        comment = []
    return docs


# -- the configuration reference ---------------------------------------------------------------


def _yaml_value(value: Any) -> str:
    """A default as it is written in a config file."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        value = list(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text[:-4].strip() if text.endswith("\n...") else text.removesuffix("...").strip()


def _spec_classes() -> dict[str, type]:
    """Key path -> the spec class its YAML value is parsed into."""
    from pipeline.features.sessions import DateSpec, InstrumentSpec, SessionSpec
    from pipeline.features.specs import FeatureSpec, LabelSpec
    from pipeline.features.splits import FoldSpec, NormalizeSpec
    from pipeline.storage.codecs import CodecSpec

    return {
        "source.sessions": SessionSpec,
        "source.instrument": InstrumentSpec,
        "source.date": DateSpec,
        "features.steps": FeatureSpec,
        "features.normalize": NormalizeSpec,
        "labels": LabelSpec,
        "output.folds": FoldSpec,
        "output.codec": CodecSpec,
    }


def _anchor(name: str) -> str:
    return name.lower()


def config_sections() -> list[tuple[str, type, bool]]:
    """The sections of a config: ``(name, dataclass, required)`` in declaration order."""
    from pipeline.config import Config

    specs = _spec_classes()
    hints = typing.get_type_hints(Config)
    out = []
    for f in dataclasses.fields(Config):
        if f.name == "raw_yaml":  # provenance kept by the parser, not a key of the file
            continue
        cls = hints[f.name] if dataclasses.is_dataclass(hints[f.name]) else specs[f.name]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out.append((f.name, cls, required and f.name != "labels"))
    return out


def config_keys() -> list[str]:
    """Every key path the config reference documents (``cluster.address``, ...)."""
    keys = []
    for section, cls, _ in config_sections():
        keys += [f"{section}.{f.name}" for f in dataclasses.fields(cls)]
    return keys


def spec_fields() -> list[str]:
    """``Class.field`` of every spec parsed from a key's value (``FoldSpec.kind``, ...)."""
    sections = {name for name, _, _ in config_sections()}
    return [f"{cls.__name__}.{f.name}" for path, cls in _spec_classes().items() if path not in sections
            for f in dataclasses.fields(cls)]


def _load_notes(problems: list[str]) -> dict[str, str]:
    notes = yaml.safe_load(CONFIG_NOTES.read_text(encoding="utf-8")) or {}
    known = set(config_keys()) | set(spec_fields())
    for key in notes:
        if key not in known:
            problems.append(f"{CONFIG_NOTES.name}: {key!r} is not a config key (known: {', '.join(sorted(known))})")
    return {k: str(v).strip() for k, v in notes.items()}


def _words(text: str) -> str:
    """``text`` as lower-case words, markup and punctuation left out, for comparing."""
    return " ".join(re.findall(r"[a-z0-9_]+", text.lower()))


def _restates(note: str, sentence: str) -> bool:
    """Whether ``note`` says again what ``sentence`` opens with: its first clause (up to
    a ``;``, ``:`` or ``(``), of four words or more, its article aside, in the note."""
    clause = _words(re.split(r"[;:(]", sentence, maxsplit=1)[0]).split()
    while clause and clause[0] in ("a", "an", "the"):
        clause = clause[1:]
    return len(clause) >= 4 and " ".join(clause) in _words(note)


def _meaning(comment: str, note: str) -> str:
    """A key's text in the reference, each thing said once: its ``#:`` comment, then its
    note from config_notes.yml. A note written as the fuller version of a sentence of
    the comment (it opens with the same words) takes that sentence's place, and the
    comment's other sentences follow it: ``source.timestamp_unit`` said its unit twice
    in one cell."""
    if not note or not comment:
        return note or comment
    sentences = re.split(r"(?<=\.)\s+(?=[A-Z`])", comment)
    kept = [s for s in sentences if not _restates(note, s)]
    if len(kept) == len(sentences):
        return f"{comment} {note}"
    return " ".join([note, *kept])


def _cell(text: str) -> str:
    """Text for a markdown table cell: one line, ``|`` escaped outside code spans."""
    parts = re.split(r"(`+[^`]*`+)", " ".join(text.split()))
    return "".join(p if p.startswith("`") else p.replace("|", "\\|") for p in parts)


def _accepts(describe: Callable[[Any, str], str], tp: Any, name: str) -> str:
    return describe(tp, name)  # ConfigError's own wording


def _field_rows(section: str, cls: type, notes: dict[str, str], specs: dict[str, type]) -> list[str]:
    import pipeline.config as config_module

    describe: Callable[[Any, str], str] = config_module._describe  # the wording of ConfigError messages
    hints = typing.get_type_hints(cls)
    comments = attribute_docs(cls)
    rows = ["| key | accepts | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        path = f"{section}.{f.name}"
        spec = specs.get(path)
        accepts = f"see [{spec.__name__}](#{_anchor(spec.__name__)})" if spec else _accepts(describe, hints[f.name],
                                                                                            f.name)
        if path == "output.splits":
            accepts = "see [splits](#splits)"
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = dataclasses.MISSING
        # A module constant DEFAULT_<FIELD> is what the parser fills in (features.steps).
        default = getattr(config_module, f"DEFAULT_{f.name.upper()}", default)
        shown = "**required**" if default is dataclasses.MISSING else f"`{_yaml_value(default)}`"
        meaning = _meaning(comments.get(f.name, ""), notes.get(path, ""))
        rows.append(f"| `{path}` | {_cell(accepts)} | {_cell(shown)} | {_cell(meaning)} |")
    return rows


def _class_body(cls: type) -> list[str]:
    """How a spec is written in YAML (its parser's docstring), its own docstring, and the
    table of names it accepts, where it has one."""
    from pipeline.features import specs as specs_module

    out: list[str] = []
    parser = getattr(cls, "from_value", None) or getattr(cls, "from_mapping", None)
    if parser is not None and inspect.getdoc(parser):
        written = rst_to_md(inspect.getdoc(parser))
        written = re.sub(r"^Parse ", "", written)
        out += [f"**In YAML:** {written}", ""]
    body = docstring_md(cls, skip_fields=True)
    if body:
        out += [body, ""]
    tables = {"FeatureSpec": ("FEATURE_NAMES", "feature", "name"), "LabelSpec": ("LABEL_KINDS", "kind", "kind")}
    if cls.__name__ in tables:
        const, what, key = tables[cls.__name__]
        out += [f"The {what}s (`{const}`) and the keys each takes besides `{key}`:", "",
                f"| {what} | keys |", "|---|---|"]
        out += [f"| `{n}` | {', '.join(f'`{k}`' for k in keys) or '(none)'} |"
                for n, keys in getattr(specs_module, const).items()]
        out.append("")
    return out


def _spec_section(cls: type, paths: list[str], notes: dict[str, str]) -> list[str]:
    hints = typing.get_type_hints(cls)
    out = [f"### {cls.__name__}", ""]
    out.append(f"Parsed from {', '.join(f'`{p}`' for p in paths)} into `{cls.__module__}.{cls.__name__}`.")
    out.append("")
    out += _class_body(cls)
    comments = attribute_docs(cls)
    out += ["Fields of the parsed object:", "", "| field | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        tp_text = tp.__name__ if isinstance(tp, type) else str(tp).replace("typing.", "")
        default = "**required**" if f.default is dataclasses.MISSING else f"`{_yaml_value(f.default)}`"
        meaning = _meaning(comments.get(f.name, ""), notes.get(f"{cls.__name__}.{f.name}", ""))
        out.append(f"| `{f.name}` | `{tp_text}` | {_cell(default)} | {_cell(meaning)} |")
    out.append("")
    return out


def config_reference(problems: list[str] | None = None) -> str:
    """The markdown of ``reference/config.md``."""
    from pipeline import config as config_module
    from pipeline.features.splits import parse_splits

    problems = [] if problems is None else problems
    notes = _load_notes(problems)
    specs = _spec_classes()
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by docs/hooks.py from pipeline.config at build time: edit the code, "
        "or docs/config_notes.yml, not this page. -->",
        "",
        rst_to_md(inspect.getdoc(config_module) or ""),
        "",
        "Run `pipeline run CONFIG --print-config` to see a config with every default filled in. "
        "Any key can be set from the command line with `--set key.path=value` (the value is YAML).",
        "",
        "Sections: " + ", ".join(f"[`{name}`](#{name})" + (" (required)" if req else "")
                                 for name, _, req in config_sections()) + ".",
        "",
    ]
    for name, cls, required in config_sections():
        out += [f"## {name}", ""]
        if name in specs:  # a whole section parsed into a spec (labels)
            out += [f"Parsed into `{cls.__module__}.{cls.__name__}`. Without the section, every key takes "
                    "its default below.", ""]
            out += _class_body(cls)
        else:
            doc = docstring_md(cls, skip_fields=True)
            if doc:
                out += [doc, ""]
        if required:
            out += ["This section is required.", ""]
        out += _field_rows(name, cls, notes, specs)
        out.append("")
    out += ["## Values parsed into specs", "",
            "These keys take a string or a mapping, parsed into the frozen dataclasses below; a mistake is "
            "reported with its key path.", ""]
    out += ["### splits", "", "Parsed from `output.splits` by `pipeline.features.splits.parse_splits`.", "",
            rst_to_md(inspect.getdoc(parse_splits) or ""), ""]
    by_class: dict[type, list[str]] = {}
    for path, cls in specs.items():
        if "." in path:  # specs of whole sections are documented with their section
            by_class.setdefault(cls, []).append(path)
    for cls, paths in by_class.items():
        out += _spec_section(cls, paths, notes)
    example = REPO / "configs" / "orderbook.yaml"
    if example.exists():
        out += ["## A whole config", "", "`configs/orderbook.yaml`, the config `make demo` runs:", "",
                '```yaml title="configs/orderbook.yaml"', example.read_text(encoding="utf-8").rstrip(), "```", ""]
    return "\n".join(out)


# -- the command line reference ----------------------------------------------------------------


def _action_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| argument | default | meaning |", "|---|---|---|"]
    for action in parser._actions:  # argparse keeps no public list of its arguments
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        if action.option_strings:
            name = ", ".join(action.option_strings)
            if action.nargs != 0:
                name += f" {action.metavar or action.dest.upper()}"
        else:
            name = action.metavar or action.dest
        default = action.default
        shown = "" if default in (None, False, [], argparse.SUPPRESS) or action.nargs == 0 else f"`{default}`"
        help_text = (action.help or "").replace("%(prog)s", parser.prog).replace("|", "\\|")
        rows.append(f"| `{name}` | {shown} | {help_text} |")
    return rows


def cli_reference() -> str:
    """The markdown of ``reference/cli.md``, from ``pipeline.cli._parser()``."""
    from pipeline import cli

    parser = cli._parser()
    out = [
        "# Command line reference",
        "",
        "<!-- Generated by docs/hooks.py from pipeline.cli._parser() at build time. -->",
        "",
        rst_to_md(inspect.getdoc(cli) or ""),
        "",
        "`python -m pipeline` is the same command as `pipeline`.",
        "",
        "```text",
        _usage(parser),
        "```",
        "",
        parser.description or "",
        "",
    ]
    out += _action_rows(parser)
    out.append("")
    main_doc = inspect.getdoc(cli.main) or ""
    if "Returns" in main_doc:
        import griffe

        for section in griffe.Docstring(main_doc).parse("numpy"):
            if section.kind.value == "returns":
                text = " ".join(rst_to_md(r.description) for r in section.value).replace("\n", " ")
                out += ["**Exit status:** " + re.sub(r"^The exit status: ", "", text), ""]
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: a.help for a in subs._choices_actions}
    for name, sub in subs.choices.items():
        out += [f"## pipeline {name}", "", helps.get(name) or "", "", "```text", _usage(sub), "```", ""]
        if sub.description:
            out += [sub.description, ""]
        out += _action_rows(sub)
        out.append("")
    return "\n".join(out)


def _usage(parser: argparse.ArgumentParser) -> str:
    # argparse wraps usage lines at $COLUMNS: fix the width so the page does not depend on
    # the terminal the build ran in.
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "88"
    try:
        return parser.format_usage().strip()
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


# -- troubleshooting ---------------------------------------------------------------------------


def error_classes() -> list[type]:
    """The classes of ``pipeline.errors.__all__``, in the module's order."""
    from pipeline import errors

    classes = [getattr(errors, name) for name in errors.__all__]
    order = {cls.__name__: i for i, cls in enumerate(vars(errors).values()) if isinstance(cls, type)}
    return sorted((c for c in classes if isinstance(c, type)), key=lambda c: order.get(c.__name__, 0))


def troubleshooting_entries() -> dict[str, dict[str, str]]:
    return yaml.safe_load(TROUBLESHOOTING.read_text(encoding="utf-8")) or {}


def troubleshooting_problems(entries: dict[str, dict[str, str]] | None = None) -> list[str]:
    """Error classes without an entry (with ``cause`` and ``fix``), and entries for no class."""
    entries = troubleshooting_entries() if entries is None else entries
    names = [c.__name__ for c in error_classes()]
    problems = []
    for name in names:
        entry = entries.get(name)
        if not isinstance(entry, dict) or not entry.get("cause") or not entry.get("fix"):
            problems.append(f"{TROUBLESHOOTING.name}: pipeline.errors.{name} has no entry with a cause and a fix")
    for name in entries:
        if name not in names:
            problems.append(f"{TROUBLESHOOTING.name}: {name!r} is not a class of pipeline.errors.__all__")
    return problems


def troubleshooting(problems: list[str] | None = None) -> str:
    """The markdown of ``troubleshooting.md``."""
    from pipeline import errors

    entries = troubleshooting_entries()
    if problems is not None:
        problems += troubleshooting_problems(entries)
    out = [
        "# Troubleshooting",
        "",
        "<!-- Generated by docs/hooks.py: the list of classes from pipeline.errors, the prose from "
        "docs/troubleshooting.yml. -->",
        "",
        rst_to_md(inspect.getdoc(errors) or ""),
        "",
        "Every error below is a subclass of `pipeline.errors.PipelineError` (the warning excepted), so "
        "`except pipeline.PipelineError` catches what the package raises on purpose.",
        "",
    ]
    for cls in error_classes():
        entry = entries.get(cls.__name__) or {}
        bases = ", ".join(f"`{b.__name__}`" for b in cls.__bases__)
        out += [f"## {cls.__name__}", "", f"`pipeline.errors.{cls.__name__}`, a subclass of {bases}.", ""]
        doc = (inspect.getdoc(cls) or "").split("\n\n")[0]
        if doc:
            out += [f"*{rst_to_md(doc).replace(chr(10), ' ')}*", ""]
        if entry.get("example"):
            out += ["```text", str(entry["example"]).strip(), "```", ""]
        out += [f"**Cause.** {str(entry.get('cause', '')).strip()}", "", f"**Fix.** {str(entry.get('fix', '')).strip()}",
                ""]
    return "\n".join(out)


# -- MkDocs events -----------------------------------------------------------------------------

GENERATED: dict[str, Callable[[list[str]], str]] = {
    "reference/config.md": lambda problems: config_reference(problems),
    "reference/cli.md": lambda problems: cli_reference(),
    "troubleshooting.md": lambda problems: troubleshooting(problems),
}


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages to the build (they are never written to docs/pages)."""
    from mkdocs.structure.files import File

    problems: list[str] = []
    for uri, make in GENERATED.items():
        if files.get_file_from_path(uri) is not None:
            problems.append(f"docs/pages/{uri} is generated by docs/hooks.py at build time: remove the file")
            files.remove(files.get_file_from_path(uri))
        files.append(File.generated(config, uri, content=make(problems)))
    for problem in problems:
        log.warning(problem)
    return files


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Sphinx roles left in docstrings (``:func:`load```) render as code, without the role."""
    return re.sub(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj|const):(<code>)~?([^<]*)</code>",
                  lambda m: f"<code>{m.group(2).rsplit('.', 1)[-1] if '~' in m.group(0) else m.group(2)}</code>",
                  html)
