#!/usr/bin/env python3
"""Checks ResourceSync documents against the sitemaps.org 0.9 and ResourceSync 1.1 schemas.

    validate_rs_xml.py FILE [FILE ...]

The schemas are the official XSDs, kept in ../schemas beside this folder. For each file one
line is printed: "FILE: VALID" or "FILE: INVALID: <reasons>". Exit status 0 when all are
valid, 1 when one is not, 2 on misuse.

Two deliberate leniencies, both where the XSDs contradict the specifications they encode:
- sitemap.xsd asks for at least one <url> in a <urlset>, while ResourceSync allows an open
  Change List (or a notification) with no entry yet. A urlset whose only complaint is that
  missing <url> is VALID.
- resourcesync.xsd restricts the `type` attribute to the pattern [\w-]+/[\w-]+, which refuses
  registered media types with '.' or '_' (application/vnd.ms-excel, every vnd.* type), while
  the framework says `type` holds the resource's media type. A `type` the pattern refuses is
  accepted when it is a media type by RFC 6838 §4.2 (type/subtype, each a restricted-name);
  anything else still fails.

The tests run this with the interpreter of the virtual environment they create (see
tests/it/support.rs), which has lxml from tests/requirements.txt.
"""
import os
import re
import sys

from lxml import etree

SITEMAP_NS = "http://www.sitemaps.org/schemas/sitemap/0.9"
SCHEMA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "schemas")
ROOTS = {
    "urlset": "urlset-rs.xsd",
    "sitemapindex": "sitemapindex-rs.xsd",
}


# RFC 6838 §4.2 restricted-name, twice.
RESTRICTED = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
MEDIA_TYPE = re.compile(f"{RESTRICTED}/{RESTRICTED}")
TYPE_PATTERN_ERROR = re.compile(
    r"attribute 'type': \[facet 'pattern'\] The value '(.*)' is not accepted by the pattern '\[\\w-\]\+/\[\\w-\]\+'"
)


def forgivable(message):
    """A `type` that the XSD's pattern refuses but that is a real media type."""
    m = TYPE_PATTERN_ERROR.search(message)
    return m is not None and MEDIA_TYPE.fullmatch(m.group(1)) is not None


def schema_for(local_name, cache={}):
    if local_name not in cache:
        path = os.path.join(SCHEMA_DIR, ROOTS[local_name])
        cache[local_name] = etree.XMLSchema(etree.parse(path))
    return cache[local_name]


def check(path):
    """Returns None when valid, else a list of reasons."""
    try:
        # No network, no entities: a document must stand on its own.
        parser = etree.XMLParser(resolve_entities=False, no_network=True, huge_tree=True)
        tree = etree.parse(path, parser)
    except (OSError, etree.XMLSyntaxError) as exc:
        return [f"not well-formed XML: {exc}"]
    root = tree.getroot()
    qname = etree.QName(root)
    if qname.namespace != SITEMAP_NS or qname.localname not in ROOTS:
        return [f"root element {root.tag} is neither a sitemaps.org urlset nor sitemapindex"]
    schema = schema_for(qname.localname)
    if schema.validate(tree):
        return None
    errors = [e for e in schema.error_log if not forgivable(e.message)]
    has_url = root.find(f"{{{SITEMAP_NS}}}url") is not None
    if qname.localname == "urlset" and not has_url:
        errors = [e for e in errors if not ("Missing child element" in e.message and "url" in e.message)]
    return [f"line {e.line}: {e.message}" for e in errors] or None


def main(args):
    if not args or args[0] in ("-h", "--help"):
        sys.stderr.write(__doc__)
        return 2
    status = 0
    for path in args:
        reasons = check(path)
        if reasons is None:
            print(f"{path}: VALID")
        else:
            status = 1
            print(f"{path}: INVALID: " + "; ".join(reasons[:20]))
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
