#!/usr/bin/env python3
"""Opens dump packages with Python's zipfile and checks them against their manifests.

    check_dump.py PACKAGE.zip [PACKAGE.zip ...]

For each package: the first member must be manifest.xml; every <url> whose rs:md has a
`path` must name a member whose bytes have the listed md5 and length. Prints one JSON object:
{"packages": [{"file", "members", "manifest", "entries": [{"loc", "change", "datetime",
"path", "md5", "length", "type"}]}]} and exits 1 when a check fails (the reason on stderr).
"""
import hashlib
import json
import sys
import xml.etree.ElementTree as ET
import zipfile

SM = "{http://www.sitemaps.org/schemas/sitemap/0.9}"
RS = "{http://www.openarchives.org/rs/terms/}"


def check(path):
    with zipfile.ZipFile(path) as z:
        bad = z.testzip()
        if bad is not None:
            raise SystemExit(f"{path}: member {bad} is corrupt")
        names = z.namelist()
        if not names or names[0] != "manifest.xml":
            raise SystemExit(f"{path}: the first member is {names[:1]}, not manifest.xml")
        manifest = z.read("manifest.xml").decode("utf-8")
        root = ET.fromstring(manifest)
        entries = []
        for url in root.findall(f"{SM}url"):
            md = url.find(f"{RS}md")
            attrs = dict(md.attrib) if md is not None else {}
            e = {
                "loc": url.findtext(f"{SM}loc"),
                "change": attrs.get("change"),
                "datetime": attrs.get("datetime"),
                "path": attrs.get("path"),
                "md5": None,
                "length": None,
                "type": attrs.get("type"),
            }
            if attrs.get("path"):
                p = attrs["path"]
                if not p.startswith("/"):
                    raise SystemExit(f"{path}: path {p!r} lacks the leading /")
                data = z.read(p[1:])
                md5 = hashlib.md5(data).hexdigest()
                if attrs.get("hash") != f"md5:{md5}":
                    raise SystemExit(f"{path}: {p}: md5 {md5}, manifest says {attrs.get('hash')}")
                if attrs.get("length") != str(len(data)):
                    raise SystemExit(f"{path}: {p}: {len(data)} bytes, manifest says {attrs.get('length')}")
                e["md5"], e["length"] = md5, len(data)
            entries.append(e)
        return {"file": path, "members": names, "manifest": manifest, "entries": entries}


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps({"packages": [check(p) for p in sys.argv[1:]]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
