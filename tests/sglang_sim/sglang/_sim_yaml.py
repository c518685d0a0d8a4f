"""The YAML that SGLang's ``--config`` files use, read without PyYAML (simulator-only).

Real SGLang reads the file with ``yaml.safe_load``.  This reads the subset such
files are made of and returns what ``yaml.safe_load`` returns for it (YAML 1.1
scalar rules, as PyYAML resolves them: ``yes``/``on`` are booleans, ``0755`` is
octal, ``1e3`` is a string, ``~`` is null):

- a mapping at the root (block style), nested block mappings and sequences,
- flow sequences ``[a, b]`` and flow mappings ``{a: 1}``,
- plain, single- and double-quoted scalars, comments, ``---`` / ``...``.

Anything else (block scalars ``|``/``>``, anchors, aliases, tags, multi-line
plain scalars, complex keys) raises :class:`YAMLError` naming the line, instead
of being read differently from PyYAML.
"""
import math
import re


class YAMLError(ValueError):
    pass


_BOOL = {
    "yes": True, "Yes": True, "YES": True, "true": True, "True": True, "TRUE": True,
    "on": True, "On": True, "ON": True,
    "no": False, "No": False, "NO": False, "false": False, "False": False, "FALSE": False,
    "off": False, "Off": False, "OFF": False,
}
_NULL = {"", "~", "null", "Null", "NULL"}
_INT = re.compile(r"""^(?:[-+]?0b[0-1_]+
    |[-+]?0[0-7_]+
    |[-+]?(?:0|[1-9][0-9_]*)
    |[-+]?0x[0-9a-fA-F_]+
    |[-+]?[1-9][0-9_]*(?::[0-5]?[0-9])+)$""", re.X)
_FLOAT = re.compile(r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+][0-9]+)?
    |\.[0-9][0-9_]*(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)
_TIMESTAMP = re.compile(r"^[0-9][0-9][0-9][0-9]-[0-9][0-9]?-[0-9][0-9]?")
_DOUBLE_ESCAPES = {
    "0": "\0", "a": "\a", "b": "\b", "t": "\t", "\t": "\t", "n": "\n", "v": "\v", "f": "\f",
    "r": "\r", "e": "\x1b", " ": " ", '"': '"', "/": "/", "\\": "\\", "N": "\x85", "_": "\xa0",
    "L": "\u2028", "P": "\u2029",
}


def _sexagesimal(text, convert):
    sign = -1 if text.startswith("-") else 1
    text = text.lstrip("+-")
    value = 0
    for part in text.split(":"):
        value = value * 60 + convert(part)
    return sign * value


def _int(text):
    text = text.replace("_", "")
    sign = -1 if text.startswith("-") else 1
    body = text.lstrip("+-")
    if body == "0":
        return 0
    if body.startswith("0b"):
        return sign * int(body[2:], 2)
    if body.startswith("0x"):
        return sign * int(body[2:], 16)
    if body.startswith("0"):
        return sign * int(body, 8)
    if ":" in body:
        return sign * _sexagesimal(body, int)
    return sign * int(body)


def _float(text):
    text = text.replace("_", "").lower()
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if body == ".inf":
        return sign * math.inf
    if body == ".nan":
        return math.nan
    if ":" in body:
        return sign * _sexagesimal(body, float)
    return sign * float(body)


def resolve_plain(text, line_no=0):
    """A plain (unquoted) scalar as PyYAML's safe loader types it."""
    if text in _NULL:
        return None
    if text in _BOOL:
        return _BOOL[text]
    if _INT.match(text):
        return _int(text)
    if _FLOAT.match(text):
        return _float(text)
    if _TIMESTAMP.match(text):
        raise YAMLError(f"line {line_no}: timestamps are not supported by the simulator; quote the value")
    if text[:1] in "&*!|>%@`":
        raise YAMLError(f"line {line_no}: {text[:1]!r} (anchor, alias, tag, block scalar or "
                        "reserved indicator) is not supported by the simulator")
    return text


def _strip_comment(line):
    """The line without a trailing comment (a # at the start or after blank, outside quotes)."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                if quote == "'" and line[index + 1:index + 2] == "'":
                    continue
                if quote == '"' and line[index - 1:index] == "\\":
                    continue
                quote = None
        elif char in "'\"":
            if index == 0 or line[index - 1] in " \t[{,:-":
                quote = char
        elif char == "#" and (index == 0 or line[index - 1] in " \t"):
            return line[:index].rstrip()
    return line.rstrip()


class _Flow:
    """Reader of one flow collection / quoted scalar inside a single line."""

    def __init__(self, text, line_no):
        self.text = text
        self.pos = 0
        self.line_no = line_no

    def error(self, what):
        return YAMLError(f"line {self.line_no}: {what}")

    def skip(self):
        while self.pos < len(self.text) and self.text[self.pos] in " \t":
            self.pos += 1

    def peek(self):
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def quoted(self):
        quote = self.text[self.pos]
        self.pos += 1
        out = []
        while True:
            if self.pos >= len(self.text):
                raise self.error("unterminated quoted scalar (multi-line scalars are not supported)")
            char = self.text[self.pos]
            if quote == "'" and char == "'":
                if self.text[self.pos + 1:self.pos + 2] == "'":
                    out.append("'")
                    self.pos += 2
                    continue
                self.pos += 1
                return "".join(out)
            if quote == '"' and char == '"':
                self.pos += 1
                return "".join(out)
            if quote == '"' and char == "\\":
                code = self.text[self.pos + 1:self.pos + 2]
                if code in _DOUBLE_ESCAPES:
                    out.append(_DOUBLE_ESCAPES[code])
                    self.pos += 2
                    continue
                width = {"x": 2, "u": 4, "U": 8}.get(code)
                if width is None:
                    raise self.error(f"unknown escape \\{code}")
                digits = self.text[self.pos + 2:self.pos + 2 + width]
                out.append(chr(int(digits, 16)))
                self.pos += 2 + width
                continue
            out.append(char)
            self.pos += 1

    def plain(self, stops):
        start = self.pos
        while self.pos < len(self.text):
            char = self.text[self.pos]
            if char in stops:
                break
            if char == ":" and self.text[self.pos + 1:self.pos + 2] in ("", " ", ",", "]", "}"):
                break
            self.pos += 1
        return self.text[start:self.pos].strip()

    def node(self, stops):
        self.skip()
        char = self.peek()
        if char == "[":
            return self.sequence()
        if char == "{":
            return self.mapping()
        if char in "'\"":
            return self.quoted()
        return resolve_plain(self.plain(stops), self.line_no)

    def sequence(self):
        self.pos += 1
        items = []
        while True:
            self.skip()
            if self.peek() == "]":
                self.pos += 1
                return items
            items.append(self.node(",]"))
            self.skip()
            if self.peek() == ",":
                self.pos += 1
            elif self.peek() != "]":
                raise self.error("expected ',' or ']' in a flow sequence")

    def mapping(self):
        self.pos += 1
        items = {}
        while True:
            self.skip()
            if self.peek() == "}":
                self.pos += 1
                return items
            key = self.node(",}:")
            self.skip()
            if self.peek() == ":":
                self.pos += 1
                value = self.node(",}")
            else:
                value = None
            items[key] = value
            self.skip()
            if self.peek() == ",":
                self.pos += 1
            elif self.peek() != "}":
                raise self.error("expected ',' or '}' in a flow mapping")

    def whole(self):
        value = self.node("")
        self.skip()
        if self.pos != len(self.text):
            raise self.error(f"unexpected text after the value: {self.text[self.pos:]!r}")
        return value


def _scalar_or_flow(text, line_no):
    if not text:
        return None
    if text[0] in "[{'\"":
        return _Flow(text, line_no).whole()
    return resolve_plain(text, line_no)


def _split_key(text, line_no):
    """'key: rest' -> (key, rest); None when the line is not a mapping entry."""
    if text[:1] in "'\"":
        flow = _Flow(text, line_no)
        key = flow.quoted()
        rest = text[flow.pos:]
        if not rest.startswith(":") or rest[1:2] not in ("", " ", "\t"):
            return None
        return key, rest[1:].strip()
    match = re.match(r"^([^#\[\]{},][^:]*?|[^:]*?):(?:[ \t]+|$)(.*)$", text)
    if not match:
        return None
    if text[:1] in "?&*!|>%@`":
        raise YAMLError(f"line {line_no}: {text[:1]!r} is not supported by the simulator")
    return resolve_plain(match.group(1).strip(), line_no), match.group(2).strip()


class _Block:
    def __init__(self, lines):
        self.lines = lines  # [(line_no, indent, text)]
        self.index = 0

    def peek(self):
        return self.lines[self.index] if self.index < len(self.lines) else None

    def node(self, indent, line_no):
        """The block node whose lines are indented at least ``indent``."""
        entry = self.peek()
        if entry is None or entry[1] < indent:
            return None
        if entry[2].startswith("- ") or entry[2] == "-":
            return self.sequence(entry[1])
        return self.mapping(entry[1])

    def mapping(self, indent):
        items = {}
        while True:
            entry = self.peek()
            if entry is None or entry[1] < indent:
                return items
            line_no, current, text = entry
            if current > indent:
                raise YAMLError(f"line {line_no}: unexpected indentation")
            if text.startswith("- ") or text == "-":
                raise YAMLError(f"line {line_no}: a sequence item where a mapping key was expected")
            split = _split_key(text, line_no)
            if split is None:
                raise YAMLError(f"line {line_no}: expected 'key: value' (multi-line plain scalars "
                                "are not supported by the simulator)")
            key, rest = split
            self.index += 1
            if rest:
                items[key] = _scalar_or_flow(rest, line_no)
                continue
            following = self.peek()
            if following is not None and (following[1] > indent or (
                    following[1] == indent and (following[2].startswith("- ") or following[2] == "-"))):
                items[key] = self.node(following[1], line_no)
            else:
                items[key] = None

    def sequence(self, indent):
        items = []
        while True:
            entry = self.peek()
            if entry is None or entry[1] < indent:
                return items
            line_no, current, text = entry
            if current > indent or not (text.startswith("- ") or text == "-"):
                if current == indent:
                    return items
                raise YAMLError(f"line {line_no}: unexpected indentation")
            self.index += 1
            rest = text[1:].strip()
            if not rest:
                following = self.peek()
                items.append(self.node(following[1], line_no)
                             if following is not None and following[1] > indent else None)
            elif _split_key(rest, line_no) is not None and rest[:1] not in "[{":
                raise YAMLError(f"line {line_no}: mappings inside sequence items are not "
                                "supported by the simulator")
            else:
                items.append(_scalar_or_flow(rest, line_no))


def safe_load(text):
    """The value ``yaml.safe_load(text)`` returns, for the supported subset."""
    lines = []
    for line_no, raw in enumerate(text.splitlines(), 1):
        if "\t" in raw[:len(raw) - len(raw.lstrip())]:
            raise YAMLError(f"line {line_no}: tabs are not allowed in indentation")
        stripped = _strip_comment(raw)
        if not stripped.strip():
            continue
        if stripped.strip() in ("---", "..."):
            if lines:
                raise YAMLError(f"line {line_no}: only one document is supported")
            continue
        indent = len(stripped) - len(stripped.lstrip(" "))
        lines.append((line_no, indent, stripped.strip()))
    if not lines:
        return None
    block = _Block(lines)
    first = lines[0]
    if len(lines) == 1 and _split_key(first[2], first[0]) is None and not first[2].startswith("-"):
        return _scalar_or_flow(first[2], first[0])
    value = block.node(first[1], first[0])
    if block.peek() is not None:
        raise YAMLError(f"line {block.peek()[0]}: unexpected content (check the indentation)")
    return value
