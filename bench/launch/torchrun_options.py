"""List the ``--options`` of torchrun (``torch/distributed/run.py``) in published torch wheels,
without downloading the wheels (~800 MB each).

For each version: PyPI's JSON API (``https://pypi.org/pypi/torch/<ver>/json``; when that answers
404, the project document ``https://pypi.org/pypi/torch/json`` and its ``releases[<ver>]``) names a
manylinux x86_64 cp312 (else cp311) wheel; HTTP Range requests read the zip's end-of-central-directory
record (and the ZIP64 record when the central directory's offset needs it), then the central
directory, then the one local entry ``torch/distributed/run.py``, which is inflated (``zlib``,
raw deflate). The options are the string arguments beginning ``--`` of every ``add_argument``
call in that file, found with :mod:`ast`. A mirror whose JSON gives wheel URLs relative to the
document is followed (``urljoin``).

Usage (writes ``dlmspec/render/torchrun_options.json``; 4 range requests and a few MB per version, mostly
the central directory)::

    python bench/launch/torchrun_options.py --out dlmspec/render/torchrun_options.json 2.6.0 2.7.0 ...

Only the standard library: urllib, zlib, struct, ast, json.
"""

from __future__ import annotations

import argparse
import ast
import json
import struct
import sys
import urllib.error
import urllib.parse
import urllib.request
import zlib

MEMBER = "torch/distributed/run.py"
UA = {"User-Agent": "dlmspec-torchrun-options/1"}


def _get(url: str, byte_range: tuple[int, int] | None = None) -> bytes:
    headers = dict(UA)
    if byte_range is not None:
        headers["Range"] = f"bytes={byte_range[0]}-{byte_range[1]}"
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as resp:
        if byte_range is not None and resp.status != 206:
            raise RuntimeError(f"{url}: range request answered {resp.status}, not 206")
        return resp.read()


_PROJECT: dict | None = None


def wheel_url(version: str) -> tuple[str, str, int]:
    """(url, filename, size) of a manylinux x86_64 cp312/cp311 wheel of torch ``version``."""
    global _PROJECT
    base = f"https://pypi.org/pypi/torch/{version}/json"
    try:
        files = json.loads(_get(base))["urls"]
    except urllib.error.HTTPError as exc:
        if exc.code != 404:
            raise
        base = "https://pypi.org/pypi/torch/json"
        if _PROJECT is None:
            _PROJECT = json.loads(_get(base))
        files = _PROJECT["releases"][version]
    for tag in ("cp312", "cp311"):
        for f in files:
            name = f["filename"]
            if f"-{tag}-{tag}-" in name and "manylinux" in name and name.endswith("x86_64.whl"):
                # A mirror may answer with URLs relative to the JSON document.
                return urllib.parse.urljoin(base, f["url"]), name, int(f["size"])
    raise RuntimeError(f"torch {version}: no manylinux x86_64 cp312/cp311 wheel on PyPI")


def read_member(url: str, size: int, member: str = MEMBER) -> bytes:
    """The bytes of ``member`` of the zip at ``url`` (``size`` bytes), by range requests."""
    tail_len = min(size, 65536 + 22)
    tail = _get(url, (size - tail_len, size - 1))
    eocd = tail.rfind(b"PK\x05\x06")
    if eocd < 0:
        raise RuntimeError("no end-of-central-directory record in the last 64 KiB")
    cd_size, cd_offset = struct.unpack("<II", tail[eocd + 12:eocd + 20])
    loc = tail.rfind(b"PK\x06\x07", 0, eocd)
    if cd_offset == 0xFFFFFFFF or cd_size == 0xFFFFFFFF:
        if loc < 0:
            raise RuntimeError("ZIP64 archive without a ZIP64 locator")
        (z64_offset,) = struct.unpack("<Q", tail[loc + 8:loc + 16])
        z64 = _get(url, (z64_offset, z64_offset + 55))
        cd_size, cd_offset = struct.unpack("<QQ", z64[40:56])
    cd = _get(url, (cd_offset, cd_offset + cd_size - 1))
    pos = 0
    target = member.encode()
    while pos < len(cd) and cd[pos:pos + 4] == b"PK\x01\x02":
        method, = struct.unpack("<H", cd[pos + 10:pos + 12])
        csize, usize, nlen, elen, clen = struct.unpack("<IIHHH", cd[pos + 20:pos + 34])
        local_offset, = struct.unpack("<I", cd[pos + 42:pos + 46])
        name = cd[pos + 46:pos + 46 + nlen]
        extra = cd[pos + 46 + nlen:pos + 46 + nlen + elen]
        if name == target:
            if 0xFFFFFFFF in (csize, usize, local_offset):  # ZIP64 extended information
                fields = iter(struct.unpack(f"<{(len(extra) - 4) // 8}Q", extra[4:4 + (len(extra) - 4) // 8 * 8]))
                usize = next(fields) if usize == 0xFFFFFFFF else usize
                csize = next(fields) if csize == 0xFFFFFFFF else csize
                local_offset = next(fields) if local_offset == 0xFFFFFFFF else local_offset
            head = _get(url, (local_offset, local_offset + 29))
            lnlen, lelen = struct.unpack("<HH", head[26:30])
            start = local_offset + 30 + lnlen + lelen
            data = _get(url, (start, start + csize - 1))
            if method == 0:
                return data
            if method == 8:
                return zlib.decompress(data, -15)
            raise RuntimeError(f"{member}: compression method {method} is not deflate")
        pos += 46 + nlen + elen + clen
    raise RuntimeError(f"{member} is not in the wheel")


def options(source: str) -> list[str]:
    """Every ``--option`` string passed to an ``add_argument(...)`` call in ``source``, sorted."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                    found.add(arg.value)
    return sorted(found)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("versions", nargs="+", help="torch versions, e.g. 2.6.0 2.8.0")
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args(argv)
    result: dict[str, dict] = {}
    for version in args.versions:
        url, name, size = wheel_url(version)
        source = read_member(url, size).decode("utf-8")
        result[version] = {"wheel": name, "options": options(source)}
        print(f"torch {version}: {name}: {len(result[version]['options'])} options", file=sys.stderr)
    document = {
        "command": "python bench/launch/torchrun_options.py --out " + args.out + " " + " ".join(args.versions),
        "source": "torch/distributed/run.py of each version's wheel on PyPI (range requests; "
                  "add_argument calls parsed with ast)",
        "versions": result,
    }
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(document, fh, indent=1, sort_keys=True)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
