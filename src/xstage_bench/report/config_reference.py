"""Every configuration key, generated from the config schema (data/schemas/config.schema.json)
so that the reference cannot drift from what validation accepts.

Per key: what values the schema accepts, whether it is required, its value in config.yaml
and what it does: the schema's description, else the comment above the key in config.yaml.
docs/configuration.md holds the result (generated_docs); a key the schema adds, drops or
changes changes it there, and the test of the generated blocks fails until it is written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

import yaml

from xstage_bench.data.config import config_schema

MAX_VALUE_CHARS = 60  # a config.yaml value longer than this is named, not shown


@dataclass(frozen=True)
class Key:
    path: str  # 'timing.warmup', 'megamoe.shapes[].H', 'microbench.studies.<name>.K'
    schema: dict
    required: bool


def keys(schema: dict | None = None) -> list[Key]:
    """Every key the schema names, depth first, in the schema's order."""
    schema = schema or config_schema()
    return list(_walk(schema, "", schema.get("$defs", {})))


def _resolve(node: dict, defs: dict) -> dict:
    ref = node.get("$ref")
    return defs[ref.rsplit("/", 1)[1]] if ref else node


def _walk(node: dict, prefix: str, defs: dict) -> Iterator[Key]:
    node = _resolve(node, defs)
    required = set(node.get("required", []))
    for name, sub in node.get("properties", {}).items():
        sub = _resolve(sub, defs)
        path = f"{prefix}{name}"
        yield Key(path, sub, name in required)
        yield from _children(sub, path, defs)


def _children(node: dict, path: str, defs: dict) -> Iterator[Key]:
    yield from _walk(node, f"{path}.", defs)
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and _resolve(extra, defs).get("properties"):
        yield from _walk(extra, f"{path}.<name>.", defs)
    items = node.get("items")
    if isinstance(items, dict) and _resolve(items, defs).get("properties"):
        yield from _walk(items, f"{path}[].", defs)
    for alternative in node.get("oneOf", []):
        if _resolve(alternative, defs).get("properties"):
            yield from _walk(alternative, f"{path}.", defs)


def accepts(node: dict) -> str:
    """What values a schema node accepts, in words."""
    if "oneOf" in node or "anyOf" in node:
        return " or ".join(accepts(a) for a in node.get("oneOf", node.get("anyOf", [])))
    if "$ref" in node:
        return f"a {node['$ref'].rsplit('/', 1)[1]} (its keys below)"
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return "one of " + ", ".join(json.dumps(v) for v in node["enum"])
    kind = node.get("type", "any value")
    kind = " or ".join(kind) if isinstance(kind, list) else kind
    if kind == "array":
        items = node.get("items", {})
        return "a list of " + (accepts(items) if items else "values")
    if kind == "object":
        extra = node.get("additionalProperties")
        if isinstance(extra, dict):
            return "a mapping of names to " + accepts(extra)
        return "a mapping" + (" (its keys below)" if node.get("properties") else "")
    bounds = [
        f"{word} {node[key]}"
        for key, word in (
            ("minimum", ">="),
            ("exclusiveMinimum", ">"),
            ("maximum", "<="),
            ("exclusiveMaximum", "<"),
        )
        if key in node
    ]
    if "pattern" in node:
        bounds.append(f"matching `{node['pattern']}`")
    return kind + (f" ({', '.join(bounds)})" if bounds else "")


def yaml_comments(text: str) -> dict[str, str]:
    """key path -> the comment on the lines just above a mapping key of a YAML file, or
    at the end of its line (block style only; list items and flow mappings are skipped)."""
    out: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            pending.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^(\s*)([A-Za-z_]\w*):(.*)$", line)
        if not match:
            pending = []
            continue
        indent, key, rest = len(match[1]), match[2], match[3]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([k for _, k in stack] + [key])
        inline = rest.split(" #", 1)[1].strip() if " #" in rest else ""
        comment = " ".join(pending + ([inline] if inline else []))
        if comment:
            out[path] = comment
        pending = []
        stack.append((indent, key))
    return out


def _value(config: dict, path: str) -> object:
    node: object = config
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _shown(value: object) -> str:
    """A config.yaml value as the reference shows it: short ones whole, a long list by its
    length, a mapping not at all (its keys have their own lines)."""
    if value is None or isinstance(value, dict):
        return ""
    text = json.dumps(value)
    if len(text) <= MAX_VALUE_CHARS:
        return f"`{text}`"
    return f"{len(value)} values" if isinstance(value, list) else "a long value, see the file"


def reference(config_yaml: str, schema: dict | None = None) -> str:
    """The reference as Markdown: a heading per top-level section, a bullet per key."""
    config = yaml.safe_load(config_yaml)
    comments = yaml_comments(config_yaml)
    lines: list[str] = []
    for key in keys(schema):
        if "." not in key.path and "[" not in key.path:
            lines += ["", f"### `{key.path}`", ""]
        facts = [accepts(key.schema), "required" if key.required else "optional"]
        if "default" in key.schema:
            facts.append(f"default `{json.dumps(key.schema['default'])}`")
        value = _shown(_value(config, key.path))
        if value:
            facts.append(f"config.yaml: {value}")
        what = key.schema.get("description") or comments.get(key.path, "")
        lines.append(f"- `{key.path}`: {'; '.join(facts)}." + (f" {what}" if what else ""))
    return "\n".join(lines).strip("\n")
