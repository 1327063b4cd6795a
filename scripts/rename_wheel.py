#!/usr/bin/env python3
"""Renames a wheel's distribution: `rename_wheel.py WHEEL NEW_NAME OUT_DIR`.

maturin names a wheel after `[project] name` in pyproject.toml; the CUDA build of the same
project is published as `spec-rs-cuda` (importable as `spec_rs` all the same). A wheel's name
lives in three places: the file name, the `.dist-info` directory and `Name:` in METADATA.
This rewrites all three and regenerates RECORD (PEP 427/PEP 376 hashes) for the new paths.
"""

import base64
import hashlib
import os
import re
import sys
import zipfile


def normalize(name):
    return re.sub(r"[-_.]+", "_", name).lower()


def record_line(path, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def main():
    wheel, new_name, out_dir = sys.argv[1:4]
    base = os.path.basename(wheel)
    old_dist, version, rest = base.split("-", 2)
    new_dist = normalize(new_name)
    old_info, new_info = f"{old_dist}-{version}.dist-info/", f"{new_dist}-{version}.dist-info/"
    target = os.path.join(out_dir, f"{new_dist}-{version}-{rest}")
    records = []
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            name = item.filename
            if name == old_info + "RECORD":
                continue
            data = src.read(name)
            if name.startswith(old_info):
                name = new_info + name[len(old_info) :]
                if name.endswith("METADATA"):
                    data = re.sub(rb"(?m)^Name: .*$", f"Name: {new_name}".encode(), data, count=1)
            info = zipfile.ZipInfo(name, item.date_time)
            info.external_attr = item.external_attr
            info.compress_type = zipfile.ZIP_DEFLATED
            dst.writestr(info, data)
            records.append(record_line(name, data))
        records.append(f"{new_info}RECORD,,")
        dst.writestr(new_info + "RECORD", "\n".join(records) + "\n")
    print(target)


if __name__ == "__main__":
    main()
